"""Causal sliding-window attention over a bounded KV cache, with rotary positions: what both the Mimi
encoder's transformer and the Kyutai decoder use.

A layer keeps the keys and values of its last `window - 1` positions, so a query sees at most `window`
positions, itself included: memory per stream is the same after an hour as after ten seconds. Positions
(and so the rotary angles) keep counting from the stream's start, as transformers' caches do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LayerKV:
    """One layer's cached keys and values: [B, H_kv, n, Dh], n < window."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def num_cached(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


class Rotary(nn.Module):
    """Rotary embedding (rotate-half layout), angles computed in float32 from absolute positions."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def cos_sin(self, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + length, device=self.inv_freq.device).float()
        freqs = positions[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, Dh]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def window_mask(num_queries: int, num_past: int, window: int, device: torch.device) -> torch.Tensor:
    """[T, n + T] bool: query i (at num_past + i) sees key j when j <= num_past + i < j + window."""
    q = torch.arange(num_queries, device=device)[:, None] + num_past
    k = torch.arange(num_past + num_queries, device=device)[None, :]
    return (k <= q) & (q - k < window)


class SelfAttention(nn.Module):
    """q/k/v/o projections (grouped-query), rotary, sliding window; parameter names as transformers'."""

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # [B, T, H*Dh] -> [B, H, T, Dh]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: LayerKV,
                window: int) -> torch.Tensor:
        cos, sin = rope
        q = apply_rotary(self._heads(self.q_proj(x)), cos, sin)
        k = apply_rotary(self._heads(self.k_proj(x)), cos, sin)
        v = self._heads(self.v_proj(x))
        num_past = cache.num_cached
        if num_past:
            k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
        keep = window - 1  # what the next query can still see
        drop = max(0, k.shape[2] - keep)
        cache.k, cache.v = k[:, :, drop:], v[:, :, drop:]
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        mask = window_mask(x.shape[1], num_past, window, x.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).flatten(2))
