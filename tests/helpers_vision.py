"""Random-weight Qwen2-VL and Qwen2.5-VL models made with transformers (the oracle), saved as Hugging
Face directories with a Qwen-shaped tokenizer that has the vision special tokens and Qwen2-VL's chat
template; images and clips drawn with numpy and Pillow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from helpers_tokenizers import byte_level_bpe, qwen_config, save_dir

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL-7B-Instruct's chat template (its chat_template.json), as transformers renders it.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Shapes the parity tests run: heads of 16 (M-RoPE sections 2+3+3), Qwen2.5-VL windows of 2x2 merged
# tokens (56 pixels) with a full-attention block between windowed ones.
SHAPES = {
    "qwen2_vl": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, mrope_section=[2, 3, 3]),
                     vision=dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2)),
    "qwen2_vl_wide": dict(text=dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=3,
                                    num_key_value_heads=1, mrope_section=[4, 6, 6]),
                          vision=dict(depth=3, embed_dim=48, num_heads=3, mlp_ratio=3)),
    "qwen2_5_vl": dict(text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, mrope_section=[2, 3, 3]),
                       vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, window_size=56,
                                   fullatt_block_indexes=[1], tokens_per_second=2)),
    "qwen2_5_vl_wide": dict(text=dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                                      num_key_value_heads=2, mrope_section=[2, 3, 3]),
                            vision=dict(depth=4, hidden_size=48, intermediate_size=64, num_heads=4, window_size=112,
                                        fullatt_block_indexes=[1, 3], tokens_per_second=4)),
}


def vision_tokenizer():
    backend = byte_level_bpe()
    backend.add_special_tokens(VISION_TOKENS)
    return backend


def make_vl_model_dir(path: Path, shape: str = "qwen2_vl", dtype: torch.dtype = torch.float32, seed: int = 0,
                      preprocessor: dict | None = None) -> Path:
    """Save a random Qwen2-VL (shape qwen2_vl*) or Qwen2.5-VL (qwen2_5_vl*) model with its tokenizer,
    chat template and preprocessor_config.json (small max_pixels, so images stay a few dozen tokens)."""
    import json

    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)

    backend = vision_tokenizer()
    save_dir(path, backend, qwen_config(chat_template=QWEN2_VL_TEMPLATE))
    ids = {t: backend.token_to_id(t) for t in VISION_TOKENS}
    spec = SHAPES[shape]
    text = dict(spec["text"])
    section = text.pop("mrope_section")
    text.update(vocab_size=backend.get_vocab_size(), max_position_embeddings=4096, initializer_range=0.2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    v25 = shape.startswith("qwen2_5")
    config_cls, model_cls = ((Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration) if v25
                             else (Qwen2VLConfig, Qwen2VLForConditionalGeneration))
    vision = dict(spec["vision"], initializer_range=0.2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if v25:
        vision["out_hidden_size"] = text["hidden_size"]
    else:
        vision["hidden_size"] = text["hidden_size"]
    cfg = config_cls(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                     video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                     vision_end_token_id=ids["<|vision_end|>"], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = model_cls(cfg).to(dtype)
    model.save_pretrained(path)
    pre = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 64, "patch_size": 14, "temporal_patch_size": 2,
           "merge_size": 2, **(preprocessor or {})}
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    return path


def hf_vl_model(path: Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype).eval()


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def circle_image(colour: str = "red", size: tuple[int, int] = (96, 72)) -> Image.Image:
    """A filled circle on white (what the issue's end-to-end test sends)."""
    image = Image.new("RGB", size, "white")
    w, h = size
    r = min(w, h) // 3
    ImageDraw.Draw(image).ellipse((w // 2 - r, h // 2 - r, w // 2 + r, h // 2 + r), fill=colour)
    return image


def noise_clip(num_frames: int, width: int = 84, height: int = 56, seed: int = 0) -> list[Image.Image]:
    return [noise_image(width, height, seed * 1000 + i) for i in range(num_frames)]


def hf_inputs(ids: list[int], items, image_token: int, video_token: int, fps: float | None = None) -> dict:
    """transformers' model inputs for a prompt rill expanded (its items' pixels, grids and M-RoPE type ids)."""
    ids_t = torch.tensor([ids])
    types = torch.zeros_like(ids_t)
    types[ids_t == image_token], types[ids_t == video_token] = 1, 2
    out = {"input_ids": ids_t, "attention_mask": torch.ones_like(ids_t), "mm_token_type_ids": types}
    images = [it for it in items if it.kind == "image"]
    videos = [it for it in items if it.kind == "video"]
    if images:
        out["pixel_values"] = torch.cat([it.pixels for it in images])
        out["image_grid_thw"] = torch.tensor([it.grid_thw for it in images])
    if videos:
        out["pixel_values_videos"] = torch.cat([it.pixels for it in videos])
        out["video_grid_thw"] = torch.tensor([it.grid_thw for it in videos])
        if fps is not None:
            out["second_per_grid_ts"] = torch.tensor([2 / fps] * len(videos))
    return out
