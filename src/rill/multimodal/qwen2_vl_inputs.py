"""A Qwen2-VL prompt's images and videos: pixels processed, placeholders expanded, items placed.

The chat template writes one `<|image_pad|>` (or `<|video_pad|>`) per image (video) between
`<|vision_start|>` and `<|vision_end|>`; transformers' processor repeats it once per merged token,
t*h*w / merge**2 times, and so does `expand` here, before the engine schedules anything. Blocking
(resizing is CPU work): callers on the trio thread run it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from rill.errors import ValidationError
from rill.models.qwen2_vl_vision import VisionConfig
from rill.multimodal.inputs import IMAGE, VIDEO, MultiModalItem, content_hash
from rill.multimodal.qwen2_vl_processor import PixelConfig, Pixels, process_image, process_video, smart_resize

DEFAULT_VIDEO_FPS = 2.0  # transformers' Qwen2-VL video processor samples at 2 frames a second


@dataclass(frozen=True)
class VideoClip:
    """Decoded frames (RGB, one size) sampled at `fps` frames a second."""

    frames: Sequence[Image.Image]
    fps: float = DEFAULT_VIDEO_FPS


class Qwen2VLInputs:
    def __init__(self, vision: VisionConfig, image_cfg: PixelConfig, video_cfg: PixelConfig):
        self.vision = vision
        self.image_cfg, self.video_cfg = image_cfg, video_cfg

    @classmethod
    def from_dir(cls, model_dir: Path, vision: VisionConfig) -> Qwen2VLInputs:
        video = PixelConfig.from_dir(model_dir, "video_preprocessor_config.json")
        return cls(vision, PixelConfig.from_dir(model_dir), video)

    def placeholder(self, kind: str) -> int:
        token = self.vision.image_token_id if kind == IMAGE else self.vision.video_token_id
        if token is None:
            raise ValidationError(f"this model's config names no {kind} token", code="unsupported")
        return token

    def num_image_tokens(self, width: int, height: int) -> int:
        h, w = smart_resize(height, width, self.image_cfg)
        return h * w // self.image_cfg.factor**2

    def item(self, kind: str, media) -> MultiModalItem:
        """One image (a PIL image) or video (a VideoClip) processed, its offset still to set."""
        interval = 1.0
        if kind == IMAGE:
            pixels = process_image(media, self.image_cfg)
        else:
            frames = media.frames if hasattr(media.frames, "dtype") else list(media.frames)  # array or images
            pixels = process_video(frames, self.video_cfg)
            if self.vision.version == 25:  # seconds per temporal patch x M-RoPE time steps per second
                interval = self.vision.tokens_per_second * self.video_cfg.temporal_patch_size / media.fps
        return _item(kind, pixels, interval)

    def expand(self, prompt_ids: list[int], items: list[MultiModalItem]) -> tuple[list[int], list[MultiModalItem]]:
        """Repeat each item's placeholder token to its token count; place the items in the result.
        Items of a kind are matched to that kind's placeholders in order."""
        queues = {kind: [it for it in items if it.kind == kind] for kind in (IMAGE, VIDEO)}
        tokens = {self.placeholder(kind): kind for kind in (IMAGE, VIDEO) if queues[kind]}
        counts = {kind: sum(1 for t in prompt_ids if tokens.get(t) == kind) for kind in queues if queues[kind]}
        for kind, queue in queues.items():
            if queue and counts[kind] != len(queue):
                raise ValidationError(f"the prompt has {counts[kind]} {kind} placeholders for {len(queue)} {kind}s",
                                      param="multi_modal_data")
        out: list[int] = []
        placed: list[MultiModalItem] = []
        taken = {IMAGE: 0, VIDEO: 0}
        for token in prompt_ids:
            kind = tokens.get(token)
            if kind is None:
                out.append(token)
                continue
            item = queues[kind][taken[kind]].at(len(out))
            taken[kind] += 1
            placed.append(item)
            out.extend([token] * item.num_tokens)
        return out, placed


def _item(kind: str, pixels: Pixels, interval: float) -> MultiModalItem:
    return MultiModalItem(kind, content_hash(kind, pixels.grid_thw, pixels.values), 0, pixels.num_tokens,
                          pixels.grid_thw, pixels.values, interval)
