"""config.json of Qwen2-VL and Qwen2.5-VL -> ModelConfig (the Qwen2 decoder, M-RoPE) + VisionConfig.

Two layouts are read: transformers 5 nests the decoder's fields in `text_config` with
`rope_parameters: {rope_type: default, mrope_section}`; the original checkpoints keep them at the top
level with `rope_scaling: {type: mrope, mrope_section}`. Either way the vision tower's fields are in
`vision_config`, whose names differ between the two versions (embed_dim vs hidden_size).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rill.errors import ModelLoadError
from rill.models.config import ModelConfig, config_from_dict
from rill.models.qwen2_vl_vision import VisionConfig

_NESTED = ("text_config", "vision_config")


def load_qwen2_vl_config(cfg: dict, arch: str, file: Path, generation: dict, dtype: str | None) -> ModelConfig:
    text = {k: v for k, v in cfg.items() if k not in _NESTED}
    text.update(cfg.get("text_config") or {})
    if "dtype" in cfg or "torch_dtype" in cfg:  # the checkpoint's dtype is written at the top level
        text["dtype"] = cfg.get("dtype") or cfg.get("torch_dtype")
    params = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
    section = params.get("mrope_section")
    if not section:
        raise ModelLoadError(f"{file}: rope parameters need 'mrope_section' (the M-RoPE split of the head)")
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    text["rope_parameters"], text["rope_scaling"] = {"rope_type": "default", "rope_theta": theta}, None
    base = config_from_dict(text, "Qwen2ForCausalLM", file, generation, dtype)
    if 2 * sum(section) != base.head_dim:
        raise ModelLoadError(f"{file}: mrope_section {section} must sum to head_dim / 2 = {base.head_dim // 2}")
    vision = _vision_config(cfg.get("vision_config") or {}, cfg, arch, base.hidden_size, file)
    return dataclasses.replace(base, architecture=arch, mrope_section=tuple(int(s) for s in section), vision=vision)


def _vision_config(v: dict, cfg: dict, arch: str, text_hidden: int, file: Path) -> VisionConfig:
    def need(name):
        if v.get(name) is None:
            raise ModelLoadError(f"{file}: vision_config field '{name}' is missing")
        return v[name]

    rope = v.get("rope_parameters") or {}
    common = dict(
        depth=int(need("depth")), num_heads=int(need("num_heads")),
        patch_size=int(v.get("patch_size", 14)), temporal_patch_size=int(v.get("temporal_patch_size", 2)),
        merge_size=int(v.get("spatial_merge_size", 2)), in_channels=int(v.get("in_channels", v.get("in_chans", 3))),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        image_token_id=cfg.get("image_token_id"), video_token_id=cfg.get("video_token_id"),
    )
    if arch == "Qwen2VLForConditionalGeneration":
        embed = int(need("embed_dim"))
        return VisionConfig(version=2, embed_dim=embed, out_dim=int(v.get("hidden_size", text_hidden)),
                            mlp_dim=int(embed * float(v.get("mlp_ratio", 4))),
                            hidden_act=v.get("hidden_act", "quick_gelu"), **common)
    return VisionConfig(
        version=25, embed_dim=int(need("hidden_size")), out_dim=int(v.get("out_hidden_size", text_hidden)),
        mlp_dim=int(need("intermediate_size")), hidden_act=v.get("hidden_act", "silu"),
        window_size=int(v.get("window_size", 112)), fullatt_blocks=tuple(v.get("fullatt_block_indexes") or ()),
        tokens_per_second=float(v.get("tokens_per_second", 2)), **common,
    )
