"""Rotary position embeddings (rotate-half layout, as Hugging Face's Llama family)."""

from __future__ import annotations

import math

import torch

from rill.models.attention import AttentionMetadata
from rill.models.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        return _llama3(inv_freq, rope)
    return inv_freq


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1's frequency-dependent scaling: long wavelengths are divided by factor,
    # short ones kept, the band between interpolated smoothly.
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.rope, self.head_dim = rope, head_dim  # kept to refill inv_freq after a meta-device build
        self.register_buffer("inv_freq", self.frequencies(), persistent=False)

    def frequencies(self) -> torch.Tensor:
        """inv_freq from the RoPE config, in float32 (the loader refills it after a meta-device build)."""
        return inverse_frequencies(self.rope, self.head_dim)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, meta: AttentionMetadata | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [T] -> cos, sin [T, 1, head_dim]; computed in float32 as transformers does.
        # meta (the step's sequences) is unread here; LongRoPE picks its factors by sequence length.
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, H, D]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
