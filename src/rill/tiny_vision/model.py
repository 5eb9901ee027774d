"""rill-tiny-vision's shape: a small Qwen2VLForConditionalGeneration and its processor settings.

Pictures are resized by the image processor to 2,048-4,096 pixels (64 x 64 for a square one; a
48 x 64 one is kept), clip frames are 32 x 32. With 8-pixel patches and 2 x 2 merging a
picture is 16 language-model tokens and each pair of frames 4. config.json, preprocessor_config.json
and video_preprocessor_config.json agree on the patch, merge and temporal sizes, so transformers'
Qwen2VLProcessor and Qwen2VLForConditionalGeneration load the directory unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import GenerationConfig, Qwen2VLConfig

from rill.tiny_vision import tokenizer as tok
from rill.tiny_vision.tasks import FRAME_SIZE, IMAGE_SIZE, MIN_IMAGE_PIXELS

# OpenAI CLIP's mean and std, Qwen2-VL's image_mean / image_std
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class Shape:
    patch_size: int = 8
    merge_size: int = 2
    temporal_patch_size: int = 2
    vision_dim: int = 128
    vision_depth: int = 4
    vision_heads: int = 4
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384

    @property
    def mrope_section(self) -> list[int]:
        """Temporal, height, width shares of the rotary pairs (Qwen2-VL's 16:24:24 of 64, scaled)."""
        pairs = self.hidden_size // self.heads // 2
        t = pairs // 4
        h = (pairs - t) // 2
        return [t, h, pairs - t - h]


def qwen2vl_config(shape: Shape, vocab_size: int, ids: dict[str, int]) -> Qwen2VLConfig:
    text = dict(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=tok.MODEL_MAX_LENGTH, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": shape.mrope_section},
        bos_token_id=ids[tok.ENDOFTEXT], eos_token_id=ids[tok.IM_END], pad_token_id=ids[tok.ENDOFTEXT],
        tie_word_embeddings=True,
    )
    vision = dict(
        depth=shape.vision_depth, embed_dim=shape.vision_dim, hidden_size=shape.hidden_size, mlp_ratio=4,
        num_heads=shape.vision_heads, in_channels=3, patch_size=shape.patch_size,
        spatial_merge_size=shape.merge_size, temporal_patch_size=shape.temporal_patch_size,
    )
    return Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids[tok.IMAGE_PAD], video_token_id=ids[tok.VIDEO_PAD],
        vision_start_token_id=ids[tok.VISION_START], vision_end_token_id=ids[tok.VISION_END],
        tie_word_embeddings=True, dtype="float32",
    )


def generation_config(ids: dict[str, int]) -> GenerationConfig:
    return GenerationConfig(bos_token_id=ids[tok.ENDOFTEXT], eos_token_id=ids[tok.IM_END],
                            pad_token_id=ids[tok.ENDOFTEXT], do_sample=False, max_new_tokens=8)


def image_processor_config(shape: Shape) -> dict:
    """preprocessor_config.json: Qwen2VLImageProcessor resizing pictures into MIN_IMAGE_PIXELS..IMAGE_SIZE^2."""
    pixels = IMAGE_SIZE * IMAGE_SIZE
    return {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
        "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD), "do_convert_rgb": True,
        "size": {"shortest_edge": MIN_IMAGE_PIXELS, "longest_edge": pixels}, "min_pixels": MIN_IMAGE_PIXELS,
        "max_pixels": pixels, "patch_size": shape.patch_size, "temporal_patch_size": shape.temporal_patch_size,
        "merge_size": shape.merge_size,
    }


def video_processor_config(shape: Shape) -> dict:
    """video_preprocessor_config.json: frames resized to FRAME_SIZE^2 pixels."""
    pixels = FRAME_SIZE * FRAME_SIZE
    return {
        "video_processor_type": "Qwen2VLVideoProcessor", "processor_class": "Qwen2VLProcessor",
        "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD), "do_convert_rgb": True,
        "size": {"shortest_edge": pixels, "longest_edge": pixels}, "min_pixels": pixels, "max_pixels": pixels,
        "patch_size": shape.patch_size, "temporal_patch_size": shape.temporal_patch_size,
        "merge_size": shape.merge_size, "do_sample_frames": False, "min_frames": 2, "max_frames": 32,
        "cap_pixels_per_frame": False,
    }


def save_processor_configs(shape: Shape, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "preprocessor_config.json").write_text(json.dumps(image_processor_config(shape), indent=2) + "\n")
    (out / "video_preprocessor_config.json").write_text(json.dumps(video_processor_config(shape), indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n")


def patches(frames: np.ndarray, shape: Shape) -> tuple[torch.Tensor, list[int]]:
    """Qwen2VLVideoProcessor's pixel_values_videos for frames already at a size it keeps (height and
    width multiples of patch_size * merge_size, inside min/max pixels); for one frame, [1, H, W, 3],
    Qwen2VLImageProcessor's pixel_values (it repeats a picture over the temporal patch, as the
    padding here repeats the last frame).

    frames: [T, H, W, 3] uint8. Returns ([grid_t * grid_h * grid_w, 3 * tp * p * p], [grid_t, grid_h, grid_w]).
    Rescale and normalize as the processor does, then the same view/permute as its patchify: a patch
    row is (channel, frame in the temporal patch, y, x), patches in 2 x 2 merge groups.
    """
    p, m, tp = shape.patch_size, shape.merge_size, shape.temporal_patch_size
    video = torch.from_numpy(np.array(frames, dtype=np.uint8)).permute(0, 3, 1, 2).float()  # [T, C, H, W]
    if pad := -video.shape[0] % tp:
        video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    video = (video * (1 / 255) - mean) / std
    t, c, h, w = video.shape
    gt, gh, gw = t // tp, h // p, w // p
    patches = video.view(gt, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gt * gh * gw, c * tp * p * p), [gt, gh, gw]
