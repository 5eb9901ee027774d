"""ModelConfig: the parts of a Hugging Face config.json that rill's decoder needs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rill.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str  # "default" | "linear" | "llama3" | "longrope"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # longrope (Phi-3): per-frequency divisors for sequences up to original_max_position (short) and past it
    # (long), and the factor cos and sin are scaled by
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0


@dataclass(frozen=True)
class MoeConfig:
    """Mixture-of-experts MLPs (Mixtral, Qwen3-MoE): each token runs the top_k of num_experts experts."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    norm_topk_prob: bool  # renormalize the top-k probabilities to sum to 1
    weights_in_model_dtype: bool  # Qwen3-MoE rounds routing weights to the model dtype; Mixtral keeps float32
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP of intermediate_size


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    layer_windows: tuple[int | None, ...]  # per layer: sliding window in tokens, or None for full attention
    dtype: torch.dtype
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    moe: MoeConfig | None = None
    # Qwen2-VL / Qwen2.5-VL (models/qwen2_vl_config.py): M-RoPE's frequency sections, the vision tower
    mrope_section: tuple[int, ...] | None = None
    vision: Any = None  # models.qwen2_vl_vision.VisionConfig

    @property
    def sliding_window(self) -> int | None:
        """The window when every layer slides with the same one (the case where KV blocks can be freed)."""
        windows = set(self.layer_windows)
        return self.layer_windows[0] if len(windows) == 1 else None

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize


def _field(cfg: dict, name: str, file: Path, kind=int):
    if name not in cfg or cfg[name] is None:
        raise ModelLoadError(f"{file}: required field '{name}' is missing")
    try:
        return kind(cfg[name])
    except (TypeError, ValueError):
        raise ModelLoadError(f"{file}: field '{name}' has an invalid value {cfg[name]!r}") from None


def _rope(cfg: dict, file: Path, arch: str) -> RopeConfig:
    # transformers 5 writes rope_parameters; older configs write rope_theta + rope_scaling.
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if arch == "Phi3ForCausalLM" and kind in ("su", "yarn"):
        kind = "longrope"  # Phi-3's early names for it, renamed as transformers' Phi3Config renames them
    partial = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ModelLoadError(f"{file}: partial_rotary_factor {partial} is not supported (rill rotates whole heads)")
    if kind not in ("default", "linear", "llama3", "longrope"):
        raise ModelLoadError(
            f"{file}: rope type {kind!r} is not supported (supported: default, linear, llama3, longrope)"
        )
    if kind == "default":
        return RopeConfig(theta, kind)
    if kind == "longrope" and arch != "Phi3ForCausalLM":
        raise ModelLoadError(f"{file}: rope type 'longrope' is supported for Phi3ForCausalLM only")
    if kind == "longrope":
        return _longrope(cfg, params, theta, file)
    return RopeConfig(
        theta,
        kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def _longrope(cfg: dict, params: dict, theta: float, file: Path) -> RopeConfig:
    """LongRoPE as transformers' _compute_longrope_parameters reads it. Phi3Config's top-level
    original_max_position_embeddings (4096 when absent) wins over the one in the rope parameters."""
    max_position = _field(cfg, "max_position_embeddings", file)
    original = int(cfg.get("original_max_position_embeddings") or 4096)
    factor = float(params.get("factor") or max_position / original)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    head_dim = cfg.get("head_dim") or _field(cfg, "hidden_size", file) // _field(cfg, "num_attention_heads", file)
    half = int(head_dim) // 2
    short, long = (tuple(float(f) for f in params.get(name) or ()) for name in ("short_factor", "long_factor"))
    if len(short) != half or len(long) != half:
        raise ModelLoadError(f"{file}: longrope short_factor and long_factor need head_dim / 2 = {half} values each")
    return RopeConfig(theta, "longrope", factor=factor, original_max_position=original, short_factor=short,
                      long_factor=long, attention_factor=float(attention_factor))


def _layer_windows(cfg: dict, arch: str, num_layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if arch == "LlamaForCausalLM" or not window:
        return (None,) * num_layers
    if arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM"):
        return (int(window),) * num_layers
    if arch == "Qwen3MoeForCausalLM":  # transformers' Qwen3-MoE windows every layer (max_window_layers unread)
        return (int(window) if cfg.get("use_sliding_window") else None,) * num_layers
    layer_types = cfg.get("layer_types")
    if layer_types:
        return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    if not cfg.get("use_sliding_window", False):
        return (None,) * num_layers
    first = int(cfg.get("max_window_layers", num_layers))
    return tuple(int(window) if i >= first else None for i in range(num_layers))


def _moe(cfg: dict, arch: str, num_layers: int, file: Path) -> MoeConfig | None:
    """The experts of Mixtral (every layer, top-k renormalized) and Qwen3-MoE (layers picked by
    decoder_sparse_step and mlp_only_layers, as transformers' Qwen3MoeDecoderLayer picks them)."""
    if arch not in ("MixtralForCausalLM", "Qwen3MoeForCausalLM"):
        return None
    qwen = arch == "Qwen3MoeForCausalLM"
    num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    top_k = _field(cfg, "num_experts_per_tok", file)
    if not 0 < top_k <= num_experts:
        raise ModelLoadError(f"{file}: num_experts_per_tok {top_k} does not fit {num_experts} experts")
    step, dense = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or ())
    sparse = tuple(not qwen or (i not in dense and (i + 1) % step == 0) for i in range(num_layers))
    return MoeConfig(
        num_experts=num_experts,
        top_k=top_k,
        intermediate_size=_field(cfg, "moe_intermediate_size" if qwen else "intermediate_size", file),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)) if qwen else True,
        weights_in_model_dtype=qwen,
        sparse_layers=sparse,
    )


def _eos_ids(cfg: dict, generation: dict) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (generation.get("eos_token_id"), cfg.get("eos_token_id")):
        for i in source if isinstance(source, list) else [source]:
            if i is not None and i not in ids:
                ids.append(int(i))
    return tuple(ids)


# Gemma 2 and 3 read fields and defaults of their own (gemma_config.py, which imports this module).
GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
SUPPORTED_ARCHITECTURES += GEMMA_ARCHITECTURES
# Qwen2-VL and Qwen2.5-VL read a text config and a vision config (qwen2_vl_config.py).
QWEN2_VL_ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
SUPPORTED_ARCHITECTURES += QWEN2_VL_ARCHITECTURES
# LLaVA: a CLIP or SigLIP tower and a projector over a Llama-family decoder (llava_config.py).
LLAVA_ARCHITECTURES = ("LlavaForConditionalGeneration",)
SUPPORTED_ARCHITECTURES += LLAVA_ARCHITECTURES


def load_model_config(model_dir: Path, generation: dict | None = None, dtype: str | None = None) -> ModelConfig:
    file = model_dir / "config.json"
    if not file.is_file():
        raise ModelLoadError(f"{model_dir}: config.json not found (expected a Hugging Face model directory)")
    try:
        cfg = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file}: not valid JSON ({e})") from None
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"{file}: architectures {archs} not supported; rill supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if arch in GEMMA_ARCHITECTURES:
        from rill.models.gemma_config import load_gemma_config

        return load_gemma_config(cfg, arch, file, generation or {}, dtype)
    if arch in QWEN2_VL_ARCHITECTURES:
        from rill.models.qwen2_vl_config import load_qwen2_vl_config

        return load_qwen2_vl_config(cfg, arch, file, generation or {}, dtype)
    if arch in LLAVA_ARCHITECTURES:
        from rill.models.llava_config import load_llava_config

        return load_llava_config(cfg, arch, file, generation or {}, dtype)
    return config_from_dict(cfg, arch, file, generation, dtype)


def config_from_dict(cfg: dict, arch: str, file: Path, generation: dict | None, dtype: str | None) -> ModelConfig:
    """A Llama-family decoder's ModelConfig from config.json's fields (arch: which family reads them)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"{file}: hidden_act {act!r} is not supported (only silu)")
    hidden = _field(cfg, "hidden_size", file)
    heads = _field(cfg, "num_attention_heads", file)
    num_layers = _field(cfg, "num_hidden_layers", file)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ModelLoadError(f"{file}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    dtype_name = dtype or cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    if dtype_name not in _DTYPES:
        raise ModelLoadError(f"{file}: dtype {dtype_name!r} not supported (float32, bfloat16, float16)")
    is_qwen2 = arch == "Qwen2ForCausalLM"
    return ModelConfig(
        architecture=arch,
        vocab_size=_field(cfg, "vocab_size", file),
        hidden_size=hidden,
        intermediate_size=_field(cfg, "intermediate_size", file),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=_rope(cfg, file, arch),
        max_position_embeddings=_field(cfg, "max_position_embeddings", file),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=is_qwen2 or bool(cfg.get("attention_bias", False)),
        o_bias=(not is_qwen2) and bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        layer_windows=_layer_windows(cfg, arch, num_layers),
        dtype=_DTYPES[dtype_name],
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg, generation or {}),
        moe=_moe(cfg, arch, num_layers, file),
    )
