"""LLaVA's image pixels: CLIP's and SigLIP's image processors, value for value as transformers' Pillow
path (CLIPImageProcessorPil, SiglipImageProcessorPil) computes them.

CLIP: the short side resized to `size.shortest_edge` (the long side int(short_target * long / short),
truncated), Pillow's bicubic, then a centre crop to `crop_size` (padded with zeros where the image
is smaller, as transformers' center_crop pads). SigLIP: resized to `size.height x size.width`, no crop.
Then rescale in float64, cast to float32, normalize with the config's mean and std.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class LlavaPixelConfig:
    shortest_edge: int | None = 224  # CLIP: resize the short side to this
    size: tuple[int, int] | None = None  # SigLIP: resize to (height, width)
    crop_size: tuple[int, int] | None = (224, 224)  # CLIP's centre crop (height, width)
    do_resize: bool = True
    do_center_crop: bool = True
    resample: int = Image.Resampling.BICUBIC
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD

    @classmethod
    def from_dict(cls, cfg: dict) -> LlavaPixelConfig:
        size = cfg.get("size") or {"shortest_edge": 224}
        crop = cfg.get("crop_size")
        kw = dict(
            shortest_edge=size.get("shortest_edge"),
            size=(size["height"], size["width"]) if "height" in size else None,
            crop_size=(crop["height"], crop["width"]) if isinstance(crop, dict) else (crop, crop) if crop else None,
            do_center_crop=bool(cfg.get("do_center_crop", crop is not None)),
        )
        for name in ("do_resize", "resample", "do_rescale", "rescale_factor", "do_normalize"):
            if cfg.get(name) is not None:
                kw[name] = cfg[name]
        for name in ("image_mean", "image_std"):
            if cfg.get(name) is not None:
                kw[name] = tuple(float(v) for v in cfg[name])
        return cls(**kw)

    @classmethod
    def from_dir(cls, model_dir: Path) -> LlavaPixelConfig:
        path = model_dir / "preprocessor_config.json"
        return cls.from_dict(json.loads(path.read_text())) if path.is_file() else cls()


def resized_size(height: int, width: int, cfg: LlavaPixelConfig) -> tuple[int, int]:
    """transformers' get_resize_output_image_size (default_to_square=False) or the fixed size."""
    if cfg.size is not None:
        return cfg.size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = cfg.shortest_edge, int(cfg.shortest_edge * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_crop(chw: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """transformers' center_crop on a channels-first array, zero padding included."""
    _, height, width = chw.shape
    ch, cw = crop
    top, left = (height - ch) // 2, (width - cw) // 2
    if top >= 0 and left >= 0 and top + ch <= height and left + cw <= width:
        return chw[:, top : top + ch, left : left + cw]
    new_h, new_w = max(ch, height), max(cw, width)
    padded = np.zeros((chw.shape[0], new_h, new_w), dtype=chw.dtype)
    top_pad, left_pad = math.ceil((new_h - height) / 2), math.ceil((new_w - width) / 2)
    padded[:, top_pad : top_pad + height, left_pad : left_pad + width] = chw
    top, left = top + top_pad, left + left_pad
    return padded[:, max(0, top) : min(new_h, top + ch), max(0, left) : min(new_w, left + cw)]


def to_rgb(image: Image.Image) -> Image.Image:
    """transformers' convert_to_rgb: transparency composited onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def process_image(image: Image.Image, cfg: LlavaPixelConfig) -> torch.Tensor:
    """An image -> pixel values [1, 3, H, W] float32."""
    image = to_rgb(image)
    if cfg.do_resize:
        height, width = resized_size(image.height, image.width, cfg)
        if (width, height) != image.size:
            image = image.resize((width, height), resample=cfg.resample)
    chw = np.asarray(image).transpose(2, 0, 1)  # [3, H, W] uint8
    if cfg.do_center_crop and cfg.crop_size is not None:
        chw = center_crop(chw, cfg.crop_size)
    if cfg.do_rescale:
        values = (chw.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    else:
        values = chw.astype(np.float32)
    if cfg.do_normalize:
        mean, std = np.array(cfg.image_mean, dtype=np.float32), np.array(cfg.image_std, dtype=np.float32)
        values = ((values.T - mean) / std).T  # as transformers' normalize broadcasts channels-first
    return torch.from_numpy(np.ascontiguousarray(values))[None]
