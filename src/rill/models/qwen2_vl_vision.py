"""The Qwen2-VL and Qwen2.5-VL vision towers: patches -> ViT with 2D RoPE -> patch merger.

Input is the processor's patches (rill.multimodal.qwen2_vl_processor), already in merge-block order,
of one or more items with grids (t, h, w). Each frame attends within itself (cu_seqlens over frames);
Qwen2.5-VL's blocks attend within windows of window_size pixels except the full-attention blocks
it lists, and its tokens are regrouped window by window for that (and put back after the merger).
Output: one embedding per 2x2 merge block, in the language model's hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rill.models.llama import RMSNorm


@dataclass(frozen=True)
class VisionConfig:
    version: int  # 2 (Qwen2-VL) or 25 (Qwen2.5-VL)
    depth: int
    embed_dim: int  # the ViT's width
    out_dim: int  # the language model's hidden size
    num_heads: int
    mlp_dim: int
    hidden_act: str
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    in_channels: int = 3
    rope_theta: float = 10000.0
    window_size: int = 112  # Qwen2.5-VL, in pixels
    fullatt_blocks: tuple[int, ...] = ()  # Qwen2.5-VL: blocks that attend over whole frames
    tokens_per_second: float = 2.0  # Qwen2.5-VL: M-RoPE's time scale for video
    image_token_id: int | None = None  # the placeholders the processor expands, one per merged token
    video_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


def _act(name: str):
    if name == "quick_gelu":
        return lambda x: torch.sigmoid(1.702 * x).mul_(x)  # one temporary fewer than x * sigmoid(...)
    if name in ("gelu", "gelu_pytorch_tanh"):
        return (lambda x: F.gelu(x)) if name == "gelu" else (lambda x: F.gelu(x, approximate="tanh"))
    if name == "silu":
        return F.silu
    raise ValueError(f"vision hidden_act {name!r} is not supported")


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim, bias=True)
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)  # [N, H, D] each
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        return self.proj(segment_attention(q, k, v, cu_seqlens).flatten(1))


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
    """Attention within each segment [cu_seqlens[i], cu_seqlens[i + 1]) of q, k, v [N, H, D] -> [N, H, D].

    Each run of consecutive segments of one length (a video's frames, same-size pictures, a frame's full
    windows) is one batched SDPA call [m, H, L, D]: one call instead of m, and a batched call takes torch's
    fused CPU kernel where an unbatched [H, L, D] one takes its math path (the tower 1.1-1.2x faster on 16
    pictures, results equal to ~1e-7)."""
    n, heads, dim = q.shape
    out = torch.empty_like(q)
    bounds = list(zip(cu_seqlens[:-1], cu_seqlens[1:]))
    i = 0
    while i < len(bounds):
        start, end = bounds[i]
        length, j = end - start, i + 1
        while j < len(bounds) and bounds[j][1] - bounds[j][0] == length:
            j += 1
        stop, m = bounds[j - 1][1], j - i
        if length:
            qs, ks, vs = (t[start:stop].view(m, length, heads, dim).transpose(1, 2) for t in (q, k, v))  # [m, H, L, D]
            out[start:stop] = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2).reshape(m * length, heads, dim)
        i = j
    return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [N, H, D]; cos, sin [N, D] float32: rotated in float32, as transformers' vision RoPE
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class VisionMLP(nn.Module):
    """Qwen2-VL: fc1 -> quick_gelu -> fc2. Qwen2.5-VL: gated (gate, up, down), all with bias."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.act = _act(cfg.hidden_act)
        self.gated = cfg.version == 25
        if self.gated:
            self.gate_proj = nn.Linear(cfg.embed_dim, cfg.mlp_dim)
            self.up_proj = nn.Linear(cfg.embed_dim, cfg.mlp_dim)
            self.down_proj = nn.Linear(cfg.mlp_dim, cfg.embed_dim)
        else:
            self.fc1 = nn.Linear(cfg.embed_dim, cfg.mlp_dim)
            self.fc2 = nn.Linear(cfg.mlp_dim, cfg.embed_dim)

    def forward(self, x):
        if self.gated:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return self.fc2(self.act(self.fc1(x)))


def _norm(cfg: VisionConfig, dim: int) -> nn.Module:
    return RMSNorm(dim, 1e-6) if cfg.version == 25 else nn.LayerNorm(dim, eps=1e-6)


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1, self.norm2 = _norm(cfg, cfg.embed_dim), _norm(cfg, cfg.embed_dim)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x, cos, sin, cu_seqlens):
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)  # a Conv3d, as checkpoints store it
        self.proj = nn.Conv3d(cfg.in_channels, cfg.embed_dim, kernel_size=kernel, stride=kernel, bias=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """A kernel as large as its stride over one patch is a matmul: [N, patch values] x [values, embed_dim]
        (4x faster than the Conv3d on the CPU, the same sums in another order)."""
        weight = self.proj.weight
        return F.linear(pixels.reshape(-1, weight[0].numel()).to(weight.dtype), weight.flatten(1))  # [N, embed_dim]


class PatchMerger(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.hidden = cfg.embed_dim * cfg.merge_size**2
        self.ln_q = _norm(cfg, cfg.embed_dim)
        self.mlp = nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU(), nn.Linear(self.hidden, cfg.out_dim))

    def forward(self, x):
        return self.mlp(self.ln_q(x).view(-1, self.hidden))


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """pixels [sum t*h*w, patch values] of the items with these grids -> [sum t*h*w/m^2, out_dim]."""
        cfg, unit = self.cfg, self.cfg.merge_size**2
        x = self.patch_embed(pixels)
        cos, sin = self._cos_sin(grids, x.device)
        frames = _cumulative([h * w for t, h, w in grids for _ in range(t)])
        if cfg.version != 25:
            for block in self.blocks:
                x = block(x, cos, sin, frames)
            return self.merger(x)
        order, windows = window_order(grids, cfg)
        order = order.to(x.device)
        regroup = lambda y: y.view(-1, unit, y.shape[-1])[order].flatten(0, 1)  # noqa: E731 - merge blocks move whole
        x, cos, sin = regroup(x), regroup(cos), regroup(sin)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, frames if i in cfg.fullatt_blocks else windows)
        return self.merger(x)[torch.argsort(order)]

    def _cos_sin(self, grids, device) -> tuple[torch.Tensor, torch.Tensor]:
        """2D RoPE: each patch's (row, column), a quarter of the head's frequencies each, -> [N, head_dim]."""
        dim = self.cfg.head_dim // 2
        inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
        pos = patch_positions(grids, self.cfg.merge_size).to(device)  # [N, 2]
        freqs = (pos[..., None].float() * inv_freq).flatten(1)  # [N, dim]: rows' then columns'
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def patch_positions(grids, merge: int) -> torch.Tensor:
    """(row, column) of every patch, in the processor's merge-block order, frames repeated."""
    out = []
    for t, h, w in grids:
        rows = torch.arange(h)[:, None].expand(h, w)
        cols = torch.arange(w)[None, :].expand(h, w)
        block = lambda a: a.reshape(h // merge, merge, w // merge, merge).transpose(1, 2).flatten()  # noqa: E731
        out.append(torch.stack([block(rows), block(cols)], dim=-1).repeat(t, 1))
    return torch.cat(out)


def window_order(grids, cfg: VisionConfig) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows: the merge blocks of each frame regrouped window by window (windows of
    window_size pixels, the last ones in a row or column cut short), and the patch offsets where each
    window starts, for the windowed blocks' attention."""
    side = cfg.window_size // cfg.merge_size // cfg.patch_size  # merge blocks per window side
    unit = cfg.merge_size**2
    order, bounds, base = [], [0], 0
    for t, h, w in grids:
        gh, gw = h // cfg.merge_size, w // cfg.merge_size
        index = torch.arange(t * gh * gw).view(t, gh, gw)
        for f in range(t):
            for r in range(0, gh, side):
                for c in range(0, gw, side):
                    win = index[f, r : r + side, c : c + side].flatten()
                    order.append(win + base)
                    bounds.append(bounds[-1] + win.numel() * unit)
        base += t * gh * gw
    return torch.cat(order), bounds


def _cumulative(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out
