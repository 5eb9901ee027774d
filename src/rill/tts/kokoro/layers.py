"""The building blocks Kokoro's predictor and decoder share, with masks for batching.

Tensors are [B, C, T]. A batch pads every utterance to the longest; `mask` is [B, 1, T] (1.0 where
the utterance has a frame, 0.0 in its padding) or None when no row is padded. Every block zeroes the
padding of what it returns, so the next convolution reads zeros past an utterance's end exactly as
the one-utterance forward reads its own zero padding, and instance norms take their statistics over
the real frames only: a batched row equals the same utterance run alone, within float32 rounding.

Parameter names follow the authors' checkpoint layout so their weights load without renaming; a
`WNConv1d` is a convolution the authors wrap in weight_norm (its weight is folded at load time).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INV_SQRT2 = 2**-0.5


class WNConv1d(nn.Conv1d):
    """A Conv1d the checkpoint stores as weight_norm's (weight_g, weight_v)."""


class WNConvTranspose1d(nn.ConvTranspose1d):
    """A ConvTranspose1d the checkpoint stores as weight_norm's (weight_g, weight_v)."""


def apply_mask(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


def length_mask(lengths: torch.Tensor, size: int) -> torch.Tensor | None:
    """[B, 1, size] float mask of each row's first lengths[b] frames; None when nothing is padded."""
    if bool((lengths == size).all()):
        return None
    steps = torch.arange(size, device=lengths.device)
    return (steps[None, :] < lengths[:, None]).unsqueeze(1).float()


def upsample_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    return None if mask is None else mask.repeat_interleave(2, dim=-1)


def instance_norm(x: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-5) -> torch.Tensor:
    """InstanceNorm1d's statistics (mean, biased variance over time), over real frames only."""
    if mask is None:
        return F.instance_norm(x, eps=eps)
    count = mask.sum(dim=-1, keepdim=True)
    mean = (x * mask).sum(dim=-1, keepdim=True) / count
    centred = (x - mean) * mask
    var = (centred * centred).sum(dim=-1, keepdim=True) / count
    return centred * torch.rsqrt(var + eps)


class InstanceNormAffine(nn.Module):
    """nn.InstanceNorm1d(affine=True) without running stats, parameters named as the checkpoint's."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:  # torch's own kernel: what the reference runs, so unpadded rows match it closest
            return F.instance_norm(x, weight=self.weight, bias=self.bias, eps=1e-5)
        return instance_norm(x, mask) * self.weight[:, None] + self.bias[:, None]


class AdaIN1d(nn.Module):
    """Instance norm whose scale and shift come from the style vector s [B, style_dim]."""

    def __init__(self, style_dim: int, channels: int):
        super().__init__()
        self.norm = InstanceNormAffine(channels)
        self.fc = nn.Linear(style_dim, channels * 2)

    def forward(self, x: torch.Tensor, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        gamma, beta = self.fc(s).unsqueeze(-1).chunk(2, dim=1)
        return apply_mask((1 + gamma) * self.norm(x, mask) + beta, mask)


class AdainResBlk1d(nn.Module):
    """Two style-normed convolutions with a shortcut; `upsample` doubles the frames (nearest on the
    shortcut, a depthwise transposed convolution on the residual path)."""

    def __init__(self, dim_in: int, dim_out: int, style_dim: int, upsample: bool = False):
        super().__init__()
        self.upsample = upsample
        self.conv1 = WNConv1d(dim_in, dim_out, 3, 1, 1)
        self.conv2 = WNConv1d(dim_out, dim_out, 3, 1, 1)
        self.norm1 = AdaIN1d(style_dim, dim_in)
        self.norm2 = AdaIN1d(style_dim, dim_out)
        if dim_in != dim_out:
            self.conv1x1 = WNConv1d(dim_in, dim_out, 1, 1, 0, bias=False)
        if upsample:
            self.pool = WNConvTranspose1d(dim_in, dim_in, 3, 2, groups=dim_in, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, dim_in, T] -> [B, dim_out, T or 2T]."""
        out_mask = upsample_mask(mask) if self.upsample else mask
        h = F.leaky_relu(self.norm1(x, s, mask), 0.2)
        if self.upsample:
            h = apply_mask(self.pool(h), out_mask)
        h = apply_mask(self.conv1(h), out_mask)
        h = F.leaky_relu(self.norm2(h, s, out_mask), 0.2)
        h = apply_mask(self.conv2(h), out_mask)
        shortcut = F.interpolate(x, scale_factor=2, mode="nearest") if self.upsample else x
        if hasattr(self, "conv1x1"):
            shortcut = self.conv1x1(shortcut)
        return (h + shortcut) * INV_SQRT2


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Snake activation (periodic inductive bias for audio): x + sin(alpha x)^2 / alpha."""
    return x + (1 / alpha) * (torch.sin(alpha * x) ** 2)


class AdaINResBlock1(nn.Module):
    """HiFi-GAN's ResBlock1 (dilated convolutions, residual) with style-normed Snake activations."""

    def __init__(self, channels: int, kernel_size: int, dilations: list[int], style_dim: int):
        super().__init__()
        self.convs1 = nn.ModuleList(
            WNConv1d(channels, channels, kernel_size, 1, dilation=d, padding=d * (kernel_size - 1) // 2)
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            WNConv1d(channels, channels, kernel_size, 1, padding=(kernel_size - 1) // 2) for _ in dilations
        )
        self.adain1 = nn.ModuleList(AdaIN1d(style_dim, channels) for _ in dilations)
        self.adain2 = nn.ModuleList(AdaIN1d(style_dim, channels) for _ in dilations)
        self.alpha1 = nn.ParameterList(nn.Parameter(torch.ones(1, channels, 1)) for _ in dilations)
        self.alpha2 = nn.ParameterList(nn.Parameter(torch.ones(1, channels, 1)) for _ in dilations)

    def forward(self, x: torch.Tensor, s: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        layers = zip(self.convs1, self.convs2, self.adain1, self.adain2, self.alpha1, self.alpha2)
        for conv1, conv2, norm1, norm2, alpha1, alpha2 in layers:
            h = apply_mask(conv1(snake(norm1(x, s, mask), alpha1)), mask)
            h = apply_mask(conv2(snake(norm2(h, s, mask), alpha2)), mask)
            x = h + x
        return x
