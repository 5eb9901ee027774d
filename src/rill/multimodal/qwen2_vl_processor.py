"""Qwen2-VL / Qwen2.5-VL pixels: dynamic resolution, normalization and patching, value for value
as transformers computes them.

Images follow transformers' Pillow image processor (`Qwen2VLImageProcessorPil`, the one it picks
without torchvision): RGB uint8 resized by Pillow's bicubic filter to `smart_resize`'s size, then
rescaled in float64 and cast to float32, normalized with CLIP's mean and std, and cut into patches
of temporal_patch_size x patch_size x patch_size (an image is its own frame repeated). Videos
follow transformers' video processor (`Qwen2VLVideoProcessor`, torchvision's tensor path): frames
resized with torch's antialiased bicubic on uint8 (the kernel torchvision calls on the CPU), the
rescale folded into the mean and std, a last frame repeated up to a multiple of the temporal patch.

Patches are ordered merge block by merge block (the vision tower's patch merger joins each 2x2
block into one language-model token), so an item of grid (t, h, w) becomes t*h*w/merge**2 tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from rill.errors import ValidationError

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200  # transformers' smart_resize refuses more


@dataclass(frozen=True)
class PixelConfig:
    """preprocessor_config.json's fields that decide the pixels (transformers' defaults)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, cfg: dict) -> PixelConfig:
        size = cfg.get("size") or {}
        kw = {
            "min_pixels": cfg.get("min_pixels", size.get("shortest_edge", cls.min_pixels)),
            "max_pixels": cfg.get("max_pixels", size.get("longest_edge", cls.max_pixels)),
        }
        for name in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor"):
            if cfg.get(name) is not None:
                kw[name] = cfg[name]
        for name in ("image_mean", "image_std"):
            if cfg.get(name) is not None:
                kw[name] = tuple(float(v) for v in cfg[name])
        return cls(**kw)

    @classmethod
    def from_dir(cls, model_dir: Path, file: str = "preprocessor_config.json") -> PixelConfig:
        path = model_dir / file
        if not path.is_file() and file != "preprocessor_config.json":
            path = model_dir / "preprocessor_config.json"  # videos share the image settings when alone
        return cls.from_dict(json.loads(path.read_text())) if path.is_file() else cls()


@dataclass(frozen=True)
class Pixels:
    """One image or video ready for the vision tower."""

    values: torch.Tensor  # [t*h*w, 3 * temporal_patch * patch * patch] float32
    grid_thw: tuple[int, int, int]  # in patches
    merge_size: int

    @property
    def num_tokens(self) -> int:
        """Language-model tokens (placeholders) this item becomes after the patch merger."""
        t, h, w = self.grid_thw
        return t * h * w // self.merge_size**2


def smart_resize(height: int, width: int, cfg: PixelConfig, max_pixels: int | None = None) -> tuple[int, int]:
    """The size transformers resizes to: both sides multiples of patch*merge, the area within
    [min_pixels, max_pixels], the aspect ratio kept as nearly as that allows."""
    factor, max_pixels = cfg.factor, max_pixels or cfg.max_pixels
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValidationError(f"the image's aspect ratio {max(height, width) / min(height, width):.0f} is past "
                              f"{MAX_ASPECT_RATIO}", code="invalid_image")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_num_tokens(width: int, height: int, cfg: PixelConfig) -> int:
    h, w = smart_resize(height, width, cfg)
    return h * w // cfg.factor**2


# -- images: transformers' Pillow path -------------------------------------------------------------


def process_image(image: Image.Image, cfg: PixelConfig) -> Pixels:
    if image.mode != "RGB":
        image = image.convert("RGB")
    h, w = smart_resize(image.height, image.width, cfg)
    if (w, h) != image.size:
        image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
    chw = np.asarray(image).transpose(2, 0, 1)  # [3, H, W] uint8
    scaled = (chw.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    mean, std = np.array(cfg.image_mean, dtype=np.float32), np.array(cfg.image_std, dtype=np.float32)
    normed = ((scaled.T - mean) / std).T  # as transformers' normalize broadcasts a channels-first image
    frames = torch.from_numpy(np.ascontiguousarray(normed))[None]  # [1, 3, H, W]
    return _patchify(frames.expand(cfg.temporal_patch_size, -1, -1, -1), cfg)


# -- videos: transformers' torchvision path, in torch --------------------------------------------------


def process_video(frames: list[Image.Image] | torch.Tensor, cfg: PixelConfig) -> Pixels:
    """frames: RGB images, or a uint8 tensor [T, 3, H, W], all of one size."""
    video = _frames_tensor(frames)
    num_frames, _, height, width = video.shape
    h, w = smart_resize(height, width, cfg)
    if (h, w) != (height, width):
        video = F.interpolate(video, size=[h, w], mode="bicubic", align_corners=False, antialias=True)
    mean = torch.tensor(cfg.image_mean) * (1.0 / cfg.rescale_factor)
    std = torch.tensor(cfg.image_std) * (1.0 / cfg.rescale_factor)
    video = (video.float() - mean[:, None, None]) / std[:, None, None]
    if pad := -num_frames % cfg.temporal_patch_size:
        video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
    return _patchify(video, cfg)


def _frames_tensor(frames) -> torch.Tensor:
    if isinstance(frames, np.ndarray):  # rill.media's VideoFrames.frames: [T, H, W, 3] uint8
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
            raise ValidationError("the video has no frames", code="invalid_video")
        return torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
    if isinstance(frames, torch.Tensor):
        if frames.dtype != torch.uint8 or frames.dim() != 4 or frames.shape[1] != 3:
            raise ValueError(f"video frames must be uint8 [T, 3, H, W], got {frames.dtype} {tuple(frames.shape)}")
        return frames
    if not frames:
        raise ValidationError("the video has no frames", code="invalid_video")
    sizes = {f.size for f in frames}
    if len(sizes) != 1:
        raise ValidationError(f"the video's frames differ in size: {sorted(sizes)}", code="invalid_video")
    arrays = [np.asarray(f.convert("RGB") if f.mode != "RGB" else f) for f in frames]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def _patchify(frames: torch.Tensor, cfg: PixelConfig) -> Pixels:
    """frames [T, C, H, W] (T a multiple of the temporal patch) -> patches in merge-block order."""
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    num_frames, channels, height, width = frames.shape
    gt, gh, gw = num_frames // tp, height // p, width // p
    x = frames.reshape(gt, tp, channels, gh // m, m, p, gw // m, m, p)
    # -> [gt, gh/m, gw/m, m, m, C, tp, p, p]: blocks, then the patches inside a block
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    values = x.reshape(gt * gh * gw, channels * tp * p * p).contiguous()
    return Pixels(values, (gt, gh, gw), m)
