"""config.json of LlavaForConditionalGeneration -> ModelConfig (the decoder) + LlavaVisionConfig.

`text_config` names the language model by model_type (llama, mistral, qwen2, qwen3: the decoders
rill.models.llama runs); `vision_config` a CLIP (clip_vision_model) or SigLIP (siglip_vision_model)
tower. The projector reads the tower's hidden states at `vision_feature_layer` (one index or a
list, concatenated), drops each state's first token under the "default" strategy (CLIP's class
token), and maps them to the decoder's width through linear_1, an activation and linear_2.
Defaults are transformers' LlavaConfig / CLIPVisionConfig / SiglipVisionConfig defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rill.errors import ModelLoadError
from rill.models.config import ModelConfig, config_from_dict
from rill.models.vit import ACTIVATIONS, ViTConfig, hidden_state_indices

TEXT_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                      "qwen3": "Qwen3ForCausalLM"}
_TOWERS = {  # model_type -> (kind, transformers' defaults)
    "clip_vision_model": ("clip", dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                       num_attention_heads=12, image_size=224, patch_size=32,
                                       hidden_act="quick_gelu", layer_norm_eps=1e-5)),
    "siglip_vision_model": ("siglip", dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                           num_attention_heads=12, image_size=224, patch_size=16,
                                           hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)),
}
# LlavaConfig's vision tower when config.json has no vision_config (llava-1.5's CLIP ViT-L/14-336)
_DEFAULT_VISION = dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096,
                       num_hidden_layers=24, num_attention_heads=16, image_size=336, patch_size=14)


@dataclass(frozen=True)
class LlavaVisionConfig:
    tower: ViTConfig
    feature_indices: tuple[int, ...]  # hidden-state indices the projector reads (0: embeddings)
    select_strategy: str  # "default" (drop each state's first token) or "full"
    projector_act: str
    projector_bias: bool
    image_token_id: int
    video_token_id: int | None = None  # LLaVA reads images only
    merge_size: int = 1  # one placeholder per kept tower token

    @property
    def tokens_per_image(self) -> int:
        kept = self.tower.num_patches + (1 if self.tower.kind == "clip" else 0)
        return kept - (1 if self.select_strategy == "default" else 0)


def load_llava_config(cfg: dict, arch: str, file: Path, generation: dict, dtype: str | None) -> ModelConfig:
    text = dict(cfg.get("text_config") or {"model_type": "llama"})
    text_arch = TEXT_ARCHITECTURES.get(text.get("model_type", "llama"))
    if text_arch is None:
        raise ModelLoadError(f"{file}: LLaVA over text model_type {text.get('model_type')!r} is not supported "
                             f"({', '.join(TEXT_ARCHITECTURES)})")
    if "dtype" in cfg or "torch_dtype" in cfg:
        text.setdefault("dtype", cfg.get("dtype") or cfg.get("torch_dtype"))
    if "tie_word_embeddings" in cfg:
        text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    base = config_from_dict(text, text_arch, file, generation, dtype)
    vision = _vision(cfg, file)
    return dataclasses.replace(base, architecture=arch, vision=vision)


def _vision(cfg: dict, file: Path) -> LlavaVisionConfig:
    v = cfg.get("vision_config") or _DEFAULT_VISION
    kind, defaults = _TOWERS.get(v.get("model_type", "clip_vision_model"), (None, None))
    if kind is None:
        raise ModelLoadError(f"{file}: vision_config model_type {v.get('model_type')!r} is not supported "
                             f"({', '.join(_TOWERS)})")
    f = {**defaults, **{k: v[k] for k in defaults if v.get(k) is not None}}
    tower = ViTConfig(kind=kind, hidden_size=int(f["hidden_size"]), intermediate_size=int(f["intermediate_size"]),
                      num_layers=int(f["num_hidden_layers"]), num_heads=int(f["num_attention_heads"]),
                      image_size=int(f["image_size"]), patch_size=int(f["patch_size"]),
                      num_channels=int(v.get("num_channels", 3)), layer_norm_eps=float(f["layer_norm_eps"]),
                      hidden_act=f["hidden_act"])
    layers = cfg.get("vision_feature_layer", -2)
    layers = (layers,) if isinstance(layers, int) else tuple(layers)
    strategy = cfg.get("vision_feature_select_strategy", "default")
    act = cfg.get("projector_hidden_act", "gelu")
    if strategy not in ("default", "full"):
        raise ModelLoadError(f"{file}: vision_feature_select_strategy {strategy!r} is not default or full")
    if act not in ACTIVATIONS or tower.hidden_act not in ACTIVATIONS:
        raise ModelLoadError(f"{file}: activation {act!r} / {tower.hidden_act!r}: rill has {sorted(ACTIVATIONS)}")
    try:
        indices = hidden_state_indices(layers, tower.num_layers)
    except ValueError as exc:
        raise ModelLoadError(f"{file}: {exc}") from None
    token = cfg.get("image_token_id", cfg.get("image_token_index", 32000))
    bias = bool(cfg.get("multimodal_projector_bias", True))
    return LlavaVisionConfig(tower, indices, strategy, act, bias, int(token))
