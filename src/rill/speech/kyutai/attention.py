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

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


@dataclass
class RowsKV:
    """Several streams' caches of one layer, stepped as one batch (row b is `rows[b]`, lengths may differ).
    `lengths`: how many of the T new positions are row b's own (the rest right padding, never cached;
    a causal query never sees a later key, so a row's own positions do not see its padding). None: all T."""

    rows: list[LayerKV]
    lengths: list[int] | None = None


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

    def cos_sin_rows(self, starts: list[int], length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row start positions: cos, sin [B, 1, T, Dh] (each row's values are `cos_sin(start)`'s)."""
        device = self.inv_freq.device
        positions = (torch.tensor(starts, device=device)[:, None] + torch.arange(length, device=device)).float()
        freqs = positions[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
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
        if isinstance(cache, RowsKV):
            out = self._attend_rows(q, k, v, cache, window)
            return self.o_proj(out.transpose(1, 2).flatten(2))
        num_past = cache.num_cached
        if num_past:
            k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
        keep = window - 1  # what the next query can still see
        drop = max(0, k.shape[2] - keep)
        cache.k, cache.v = k[:, :, drop:], v[:, :, drop:]
        if x.shape[1] == 1:  # a stream's step: its one query sees every cached key (at most window - 1) and
            # itself, so no mask; grouped-query heads shared in place. Same values, a tenth fewer ops a step.
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=self.num_heads != self.num_kv_heads)
            return self.o_proj(out.transpose(1, 2).flatten(2))
        rep = self.num_heads // self.num_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        mask = window_mask(x.shape[1], num_past, window, x.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).flatten(2))

    def _attend_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: RowsKV,
                     window: int) -> torch.Tensor:
        """q [B, H, T, Dh], k and v [B, H_kv, T, Dh] -> [B, H, T, Dh]. Row b's cached keys are left-padded
        to the longest row's and the padding masked out, so each row sees exactly what it sees alone."""
        past = [row.num_cached for row in cache.rows]
        longest, num_queries = max(past), q.shape[2]
        if longest:
            k = torch.cat([torch.cat([_left_pad(row.k, longest, k) for row in cache.rows]), k], dim=2)
            v = torch.cat([torch.cat([_left_pad(row.v, longest, v) for row in cache.rows]), v], dim=2)
        keep = window - 1  # what each row's next query can still see
        lengths = cache.lengths or [num_queries] * len(past)
        for b, row in enumerate(cache.rows):
            end = longest + lengths[b]
            start = max(longest - past[b], end - keep)
            row.k, row.v = k[b:b + 1, :, start:end].clone(), v[b:b + 1, :, start:end].clone()
        mask = rows_mask(num_queries, past, window, q.device)
        # Grouped-query heads shared in place (no repeated copy of every row's keys and values).
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              enable_gqa=self.num_heads != self.num_kv_heads)


def _left_pad(cached: torch.Tensor | None, length: int, like: torch.Tensor) -> torch.Tensor:
    """One row's cached [1, H_kv, n, Dh] -> [1, H_kv, length, Dh], zeros in front (masked out)."""
    n = 0 if cached is None else cached.shape[2]
    if n == length:
        return cached
    pad = like.new_zeros(1, like.shape[1], length - n, like.shape[3])
    return pad if cached is None else torch.cat([pad, cached], dim=2)


def rows_mask(num_queries: int, past: list[int], window: int, device: torch.device) -> torch.Tensor:
    """[B, 1, T, L + T] bool for left-padded rows (L = max(past)): row b's key j is real from L - past[b]
    on, and query i (at L + i) sees it when it is no later and within the window, as `window_mask`."""
    longest = max(past)
    q = torch.arange(num_queries, device=device)[:, None] + longest
    k = torch.arange(longest + num_queries, device=device)[None, :]
    seen = (k <= q) & (q - k < window)  # [T, L + T]
    real = k[None] >= (longest - torch.tensor(past, device=device))[:, None, None]  # [B, 1, L + T]
    return (seen[None] & real)[:, None]
