"""What an image or video becomes on its way into the engine: a processed item at a place in the prompt.

Items cross the thread boundary inside a submission (frozen msgspec structs; the pixels a torch
tensor nobody writes to). `content_hash` names the item's pixels: the encoder cache and the prefix
cache key on it, so the same picture is encoded once and a repeated one hits the prefix cache.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import torch

IMAGE, VIDEO = "image", "video"


class MultiModalItem(msgspec.Struct, frozen=True):
    kind: str  # IMAGE or VIDEO
    content_hash: str  # hex digest of kind, grid and pixel values
    offset: int  # prompt index of the item's first placeholder token
    num_tokens: int  # its placeholders: t*h*w / merge**2
    grid_thw: tuple[int, int, int]  # in patches
    pixels: Any  # torch.Tensor [t*h*w, patch values] float32
    time_interval: float = 1.0  # M-RoPE time steps per temporal patch (Qwen2.5-VL video)
    # A live video arrives in pieces (rill.live_video): a piece that continues the item right before it
    # is laid out as that video's next frames (one video's M-RoPE positions), not as a new video.
    continues: bool = False

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens

    def at(self, offset: int) -> MultiModalItem:
        return msgspec.structs.replace(self, offset=offset)


def content_hash(kind: str, grid_thw: tuple[int, int, int], pixels: torch.Tensor) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{kind}:{grid_thw}:".encode())
    digest.update(pixels.contiguous().numpy().tobytes())
    return digest.hexdigest()
