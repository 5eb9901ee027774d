"""Qwen2-VL and Qwen2.5-VL configs as their checkpoints ship them (the original top-level layout with
`rope_scaling: {type: mrope}`; transformers 5's nested `text_config`), read by rill and by transformers
(the oracle); and, at the real sizes on the meta device (no weights), every rill parameter found under the
checkpoint name and shape transformers gives it."""

from __future__ import annotations

import json

import pytest
import torch

from rill.errors import ModelLoadError
from rill.models.config import load_model_config

QWEN2_VL_2B = {  # Qwen/Qwen2-VL-2B-Instruct's config.json
    "architectures": ["Qwen2VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 1536, "initializer_range": 0.02, "intermediate_size": 8960, "max_position_embeddings": 32768,
    "max_window_layers": 28, "model_type": "qwen2_vl", "num_attention_heads": 12, "num_hidden_layers": 28,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
                      "hidden_size": 1536, "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                      "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 151936,
}
QWEN2_5_VL_3B = {  # Qwen/Qwen2.5-VL-3B-Instruct's config.json
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 128000,
    "max_window_layers": 70, "model_type": "qwen2_5_vl", "num_attention_heads": 16, "num_hidden_layers": 36,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 151936,
}


def _write(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("shipped", [QWEN2_VL_2B, QWEN2_5_VL_3B], ids=["qwen2-vl-2b", "qwen2.5-vl-3b"])
def test_shipped_configs_read_as_transformers_reads_them(tmp_path, shipped):
    from transformers import AutoConfig

    ours = load_model_config(_write(tmp_path, shipped))
    theirs = AutoConfig.from_pretrained(tmp_path)
    text, vision = theirs.text_config, theirs.vision_config
    assert (ours.hidden_size, ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.intermediate_size) == (
        text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads,
        text.intermediate_size)
    assert ours.head_dim == text.hidden_size // text.num_attention_heads == 128
    assert ours.rope.theta == text.rope_parameters["rope_theta"] and ours.rope.kind == "default"
    assert list(ours.mrope_section) == list(text.rope_parameters["mrope_section"])
    assert ours.layer_windows == (None,) * ours.num_layers  # use_sliding_window false
    assert ours.tie_word_embeddings and ours.dtype == torch.bfloat16 and ours.qkv_bias and not ours.o_bias
    v = ours.vision
    assert (v.depth, v.num_heads, v.patch_size, v.merge_size, v.temporal_patch_size) == (
        vision.depth, vision.num_heads, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
    assert v.out_dim == ours.hidden_size and (v.image_token_id, v.video_token_id) == (151655, 151656)
    if v.version == 2:
        assert (v.embed_dim, v.mlp_dim, v.hidden_act) == (vision.embed_dim, vision.embed_dim * vision.mlp_ratio,
                                                          "quick_gelu")
    else:
        assert (v.embed_dim, v.mlp_dim, v.window_size, v.fullatt_blocks, v.tokens_per_second) == (
            vision.hidden_size, vision.intermediate_size, vision.window_size, tuple(vision.fullatt_block_indexes),
            vision.tokens_per_second)


@pytest.mark.parametrize("shipped", [QWEN2_VL_2B, QWEN2_5_VL_3B], ids=["qwen2-vl-2b", "qwen2.5-vl-3b"])
def test_every_parameter_has_its_checkpoint_tensor_at_real_size(tmp_path, shipped):
    """rill's model and transformers' at the real sizes, both on the meta device: each rill parameter
    maps (rill.models.loader) to checkpoint names that transformers' model has, with the shapes it has
    (transformers keeps `model.visual.` / `model.language_model.` in memory and saves `visual.` /
    `model.`, the names of the shipped checkpoints)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from rill.models.loader import _checkpoint_parts, _model_class

    cfg = load_model_config(_write(tmp_path, {**shipped, "num_hidden_layers": 2,
                                              "vision_config": {**shipped["vision_config"], "depth": 9}}))
    with torch.device("meta"):
        ours = _model_class(cfg)(cfg)
        theirs = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tmp_path))
    saved = {_saved_name(k): tuple(v.shape) for k, v in theirs.state_dict().items()}

    class Names:  # what _checkpoint_parts asks of a checkpoint: which names it has
        def __contains__(self, name):
            return name in saved

    used = set()
    for name, param in ours.named_parameters():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        target = param.flatten(0, 1) if param.dim() == 3 else param
        parts = _checkpoint_parts(name, target.shape[0], Names(), cfg, "model.")
        for src, rows in parts:
            assert src in saved, (name, src)
            assert saved[src] == (rows, *target.shape[1:]), (name, src)
            used.add(src)
    assert set(saved) - used <= {"lm_head.weight"}  # nothing of the checkpoint left unread (lm_head is tied)


def _saved_name(name: str) -> str:
    if name.startswith("model.visual."):
        return name[len("model."):]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def test_missing_mrope_section_is_a_load_error(tmp_path):
    bad = {**QWEN2_VL_2B, "rope_scaling": {"type": "mrope"}}
    with pytest.raises(ModelLoadError, match="mrope_section"):
        load_model_config(_write(tmp_path, bad))
    wrong = {**QWEN2_VL_2B, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 20]}}
    with pytest.raises(ModelLoadError, match="head_dim"):
        load_model_config(_write(tmp_path, wrong))
    no_depth = {**QWEN2_VL_2B, "vision_config": {k: v for k, v in QWEN2_VL_2B["vision_config"].items() if k != "depth"}}
    with pytest.raises(ModelLoadError, match="depth"):
        load_model_config(_write(tmp_path, no_depth))
