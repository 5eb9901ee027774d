"""Load a local Hugging Face model directory into rill's decoder."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from rill.errors import ModelLoadError
from rill.models.config import ModelConfig
from rill.models.dtype_choice import load_config_for_device
from rill.models.llama import CausalLM
from rill.models.moe import MoeCausalLM, expert_checkpoint_names
from rill.models.rope import RotaryEmbedding

# rill's fused parameters and the Hugging Face tensors concatenated into them, in order.
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def resolve_model_dir(model: str | Path) -> Path:
    """`rill-tiny` (and `rill-tiny-vision`) name the embedded models; anything else is a local directory."""
    if str(model) == "rill-tiny":
        from rill.assets import RILL_TINY_DIR

        return RILL_TINY_DIR
    if str(model) == "rill-tiny-vision":  # shipped beside rill-tiny when a build has it
        from rill.assets import tiny_vision_dir

        model = tiny_vision_dir()
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model directory {str(model)!r} does not exist (rill loads local directories only)")
    return path


def load_generation_config(model_dir: Path) -> dict:
    file = model_dir / "generation_config.json"
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file}: not valid JSON ({e})") from None


class _Checkpoint:
    """Tensor name -> shard file, from model.safetensors or a sharded index."""

    def __init__(self, model_dir: Path):
        single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelLoadError(f"{index}: missing 'weight_map'")
            self.files = {name: model_dir / shard for name, shard in weight_map.items()}
        elif single.is_file():
            with safe_open(single, framework="pt") as f:
                self.files = {name: single for name in f.keys()}
        else:
            raise ModelLoadError(f"{model_dir}: no weights (expected model.safetensors or model.safetensors.index.json)")
        for shard in set(self.files.values()):
            if not shard.is_file():
                raise ModelLoadError(f"{shard}: weight shard listed in the index is missing")
        self._open: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise ModelLoadError(f"tensor '{name}' not found in the checkpoint")
        path = self.files[name]
        if path not in self._open:
            self._open[path] = safe_open(path, framework="pt")
        return self._open[path].get_tensor(name)


# Where a checkpoint keeps the decoder: causal LMs under "model.", Gemma 3's multimodal checkpoints
# (Gemma3ForConditionalGeneration, whose text part rill loads) as transformers 5 and 4 save them, and
# at the top: embedding models ship the bare decoder (Qwen3-Embedding's Qwen3Model weights, no lm_head,
# though its config.json names Qwen3ForCausalLM).
_TEXT_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "")


def _text_prefix(ckpt: _Checkpoint) -> str:
    return next((p for p in _TEXT_PREFIXES if f"{p}embed_tokens.weight" in ckpt), "model.")


def _prefix(name: str, text_prefix: str) -> str:
    """Where a parameter's checkpoint name starts: lm_head at the top; Qwen2-VL's vision tower at the
    top ("visual.") beside "model.", or under "model." where the decoder is "model.language_model."."""
    if name.startswith("lm_head"):
        return "language_model." if text_prefix == "language_model.model." else ""  # LLaVA as transformers 4 saves it
    if name.startswith(("visual.", "vision_tower.", "multi_modal_projector.")):
        return "model." if text_prefix == "model.language_model." else ""
    return text_prefix


def _hf_sources(name: str, text_prefix: str = "model.") -> list[str]:
    """Our parameter name -> the Hugging Face tensor names that fill it."""
    prefix = _prefix(name, text_prefix)
    for fused, parts in _FUSED.items():
        if f".{fused}." in f".{name}":
            return [prefix + name.replace(fused, part) for part in parts]
    return [prefix + name]


def _part_rows(name: str, cfg: ModelConfig) -> list[int] | None:
    """Rows of each Hugging Face tensor inside a fused parameter, or None if not fused."""
    if ".qkv_proj." in name:
        kv = cfg.num_kv_heads * cfg.head_dim
        return [cfg.num_heads * cfg.head_dim, kv, kv]
    if ".gate_up_proj." in name:
        return [cfg.intermediate_size] * 2
    return None


def _checkpoint_parts(name: str, rows: int, ckpt: _Checkpoint, cfg: ModelConfig, text_prefix: str):
    """(checkpoint tensor, its rows) in the order their concatenation fills our parameter `name`."""
    own = _prefix(name, text_prefix) + name
    if own not in ckpt and ".vision_tower." in f".{own}":  # LLaVA's CLIPVisionModel keeps its tower in "vision_model."
        own = own.replace("vision_tower.", "vision_tower.vision_model.", 1)
    if own in ckpt:  # stored as rill stores it: Phi-3 ships qkv_proj and gate_up_proj fused
        return [(own, rows)]
    experts = expert_checkpoint_names(name, cfg)  # Mixtral, Qwen3-MoE: one tensor per expert
    if experts is not None:
        return [(src, rows // len(experts)) for src in experts]
    return list(zip(_hf_sources(name, text_prefix), _part_rows(name, cfg) or [rows]))


def _load_param(param: torch.Tensor, name: str, ckpt: _Checkpoint, cfg: ModelConfig, text_prefix: str) -> None:
    target = param.flatten(0, 1) if param.dim() == 3 else param  # stacked experts [E, rows, cols]: row-wise
    tensors = []
    for src, n in _checkpoint_parts(name, target.shape[0], ckpt, cfg, text_prefix):
        tensor = ckpt.get(src)
        expected = (n, *target.shape[1:])
        if tuple(tensor.shape) != expected:
            raise ModelLoadError(
                f"shape mismatch for '{src}': checkpoint has {tuple(tensor.shape)}, config.json implies {expected}"
            )
        tensors.append(tensor)
    with torch.no_grad():
        target.copy_((tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)).to(param.dtype))


def _model_class(cfg: ModelConfig) -> type[torch.nn.Module]:
    """The decoder module for the config's architecture; Llama's serves every family it covers."""
    if cfg.architecture.startswith("Gemma"):
        from rill.models.gemma import GemmaCausalLM

        return GemmaCausalLM
    if cfg.architecture == "Phi3ForCausalLM":
        from rill.models.phi3 import Phi3CausalLM

        return Phi3CausalLM
    if cfg.moe is not None:
        return MoeCausalLM
    if cfg.architecture == "LlavaForConditionalGeneration":
        from rill.models.llava import LlavaModel

        return LlavaModel
    if cfg.vision is not None:
        from rill.models.qwen2_vl import Qwen2VLModel

        return Qwen2VLModel
    return CausalLM


def load_model(model_dir: Path, cfg: ModelConfig, device: str | torch.device = "cpu") -> CausalLM:
    ckpt = _Checkpoint(model_dir)
    with torch.device("meta"):
        model = _model_class(cfg)(cfg)
    model = model.to_empty(device=device).to(cfg.dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # meta buffers carry no data; inverse frequencies stay float32 whatever the weights' dtype
    for rotary in (m for m in model.modules() if isinstance(m, RotaryEmbedding)):
        rotary.inv_freq = rotary.frequencies().to(device)
    text_prefix = _text_prefix(ckpt)
    if text_prefix == "":
        model.embedding_only = True  # a bare decoder, shipped to embed (rill.openai.embedding_model reads it)
    for name, param in model.named_parameters():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name == "lm_head.weight" and _prefix(name, text_prefix) + name not in ckpt:
            if text_prefix == "":  # a bare decoder, shipped to embed: its head is never used, so share
                model.lm_head.weight = model.embed_tokens.weight  # the embeddings' memory
                continue
            raise ModelLoadError(f"{model_dir}: 'lm_head.weight' missing and tie_word_embeddings is false")
        _load_param(param, name, ckpt, cfg, text_prefix)
    return model.eval()


def load(model: str | Path, dtype: str | None = None, device: str = "cpu") -> tuple[Path, ModelConfig, dict, CausalLM]:
    model_dir = resolve_model_dir(model)
    generation = load_generation_config(model_dir)
    cfg = load_config_for_device(model_dir, generation, dtype, device)  # `--dtype auto`'s rule on the CPU
    return model_dir, cfg, generation, load_model(model_dir, cfg, device)
