"""GemmaConfig: what Gemma 2 and Gemma 3 (text) add to ModelConfig, read from config.json as transformers reads it.

A field config.json leaves out takes transformers' default (Gemma2Config, Gemma3TextConfig): Gemma 3's
multimodal checkpoints (Gemma3ForConditionalGeneration) state little more than the sizes in their
text_config, and rill loads that text_config's decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rill.errors import ModelLoadError
from rill.models.config import _DTYPES, ModelConfig, RopeConfig, _eos_ids, _rope

_COMMON = dict(
    hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
    head_dim=256, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
    attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096, bos_token_id=2, eos_token_id=1,
)
_DEFAULTS = {
    "gemma2": {**_COMMON, "vocab_size": 256000, "max_position_embeddings": 8192, "final_logit_softcapping": 30.0,
               "attn_logit_softcapping": 50.0, "rope_theta": 10000.0, "sliding_window_pattern": 2},
    "gemma3": {**_COMMON, "vocab_size": 262208, "max_position_embeddings": 131072, "rope_theta": 1_000_000.0,
               "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6},
}


@dataclass(frozen=True)
class GemmaConfig(ModelConfig):
    query_pre_attn_scalar: float = 256.0  # attention scale is query_pre_attn_scalar ** -0.5, not head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma 2's attention logit soft-capping
    final_softcap: float | None = None  # soft-capping of the output logits
    local_rope: RopeConfig | None = None  # sliding layers' RoPE (Gemma 3's rope_local_base_freq); None: `rope`


def _text_config(cfg: dict, arch: str) -> dict:
    """The decoder's fields with transformers' defaults under them; a multimodal config's text_config
    inherits the top level's dtype and token ids."""
    family = "gemma2" if arch.startswith("Gemma2") else "gemma3"
    if family == "gemma2":  # Gemma2Config has no pattern field: every other layer slides
        return {**_DEFAULTS[family], **{k: v for k, v in cfg.items() if v is not None}, "sliding_window_pattern": 2}
    if arch == "Gemma3ForCausalLM":
        return {**_DEFAULTS[family], **{k: v for k, v in cfg.items() if v is not None}}
    text = {k: v for k, v in (cfg.get("text_config") or {}).items() if v is not None}
    inherited = {k: cfg[k] for k in ("dtype", "torch_dtype", "eos_token_id", "bos_token_id") if cfg.get(k) is not None}
    return {**_DEFAULTS[family], **inherited, "tie_word_embeddings": cfg.get("tie_word_embeddings", True), **text}


def _layer_windows(cfg: dict, file: Path) -> tuple[int | None, ...]:
    # layer_types where written; older configs give a period (every n-th layer global).
    num_layers = int(cfg["num_hidden_layers"])
    layer_types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % int(cfg["sliding_window_pattern"]) == 0 else "sliding_attention"
        for i in range(num_layers)
    ]
    if len(layer_types) != num_layers:
        raise ModelLoadError(f"{file}: layer_types names {len(layer_types)} layers, num_hidden_layers is {num_layers}")
    window = cfg.get("sliding_window")
    return tuple(int(window) if t == "sliding_attention" and window else None for t in layer_types)


def _ropes(cfg: dict, file: Path, arch: str) -> tuple[RopeConfig, RopeConfig | None]:
    """(global, local). Gemma 2 has one RoPE. Gemma 3 writes one rope_parameters per layer type, or (older
    configs) rope_theta with rope_scaling for the global layers and rope_local_base_freq for the local ones."""
    if arch.startswith("Gemma2"):
        return _rope(cfg, file, arch), None
    params = cfg.get("rope_parameters") or {}
    full = params.get("full_attention") or {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg["rope_theta"]}
    local = params.get("sliding_attention") or {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}
    return _rope({"rope_parameters": full}, file, arch), _rope({"rope_parameters": local}, file, arch)


def _check(cfg: dict, file: Path) -> None:
    act = cfg["hidden_activation"]
    if act != "gelu_pytorch_tanh":
        raise ModelLoadError(f"{file}: hidden_activation {act!r} is not supported (only gelu_pytorch_tanh)")
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{file}: use_bidirectional_attention is not supported (rill decodes causally)")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ModelLoadError(f"{file}: num_attention_heads is not a multiple of num_key_value_heads")


def load_gemma_config(raw: dict, arch: str, file: Path, generation: dict, dtype: str | None) -> GemmaConfig:
    try:
        return _gemma_config(raw, arch, file, generation, dtype)
    except (TypeError, ValueError, ZeroDivisionError) as e:  # a field of the wrong type or value
        raise ModelLoadError(f"{file}: invalid {arch} config ({e})") from None


def _gemma_config(raw: dict, arch: str, file: Path, generation: dict, dtype: str | None) -> GemmaConfig:
    cfg = _text_config(raw, arch)
    _check(cfg, file)
    dtype_name = dtype or cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    if dtype_name not in _DTYPES:
        raise ModelLoadError(f"{file}: dtype {dtype_name!r} not supported (float32, bfloat16, float16)")
    is_gemma2 = arch.startswith("Gemma2")
    rope, local_rope = _ropes(cfg, file, arch)
    return GemmaConfig(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=int(cfg["num_attention_heads"]),
        num_kv_heads=int(cfg["num_key_value_heads"]),
        head_dim=int(cfg["head_dim"]),
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        rope=rope,
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
        qkv_bias=bool(cfg["attention_bias"]),
        o_bias=bool(cfg["attention_bias"]),
        mlp_bias=False,
        qk_norm=not is_gemma2,
        layer_windows=_layer_windows(cfg, file),
        dtype=_DTYPES[dtype_name],
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg, generation),
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]),
        # transformers' Gemma 3 attention never passes its attn_logit_softcapping on, and its multimodal
        # head never applies final_logit_softcapping (the released Gemma 3 configs set neither)
        attn_softcap=cfg.get("attn_logit_softcapping") if is_gemma2 else None,
        final_softcap=None if arch == "Gemma3ForConditionalGeneration" else cfg.get("final_logit_softcapping"),
        local_rope=local_rope,
    )
