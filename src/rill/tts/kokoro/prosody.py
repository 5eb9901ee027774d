"""Kokoro's text side: the phoneme encoder for the decoder, the duration encoder and the prosody
predictor (durations per phoneme, then pitch F0 and energy N per frame).

Shapes: N tokens (phonemes plus the two boundary tokens), F aligned frames, one utterance at a time
(B = 1): this side is cheap beside the decoder, and run alone each utterance's pitch is bitwise what
it would be in any batch. That matters: the generator's excitation takes the angle of an STFT of a
sine integrated from the pitch, and a last-bit change in the pitch can move an angle across ±π, a
2π jump the next convolution turns into an audible difference. The decoder batches (see model.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rill.tts.kokoro.layers import AdainResBlk1d, WNConv1d


class ChannelLayerNorm(nn.Module):
    """LayerNorm over channels of a [B, C, T] tensor (the checkpoint names its parameters gamma, beta)."""

    def __init__(self, channels: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.transpose(1, -1), x.shape[1:2], self.gamma, self.beta, 1e-5).transpose(1, -1)


class ConvBlock(nn.Sequential):
    """Conv -> LayerNorm -> LeakyReLU, indexed 0 and 1 as the checkpoint's nn.Sequential."""

    def __init__(self, channels: int, kernel_size: int):
        conv = WNConv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2)
        super().__init__(conv, ChannelLayerNorm(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self[1](self[0](x)), 0.2)


class TextEncoder(nn.Module):
    """Phoneme ids -> the decoder's text features [B, C, N]: embedding, convolutions, a BiLSTM."""

    def __init__(self, channels: int, kernel_size: int, depth: int, n_symbols: int):
        super().__init__()
        self.embedding = nn.Embedding(n_symbols, channels)
        self.cnn = nn.ModuleList(ConvBlock(channels, kernel_size) for _ in range(depth))
        self.lstm = nn.LSTM(channels, channels // 2, 1, batch_first=True, bidirectional=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids).transpose(1, 2)
        for block in self.cnn:
            x = block(x)
        return self.lstm(x.transpose(1, 2))[0].transpose(1, 2)


class AdaLayerNorm(nn.Module):
    """LayerNorm over channels with a style-given scale and shift; x [B, N, C], s [B, style]."""

    def __init__(self, style_dim: int, channels: int):
        super().__init__()
        self.fc = nn.Linear(style_dim, channels * 2)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.fc(s).unsqueeze(1).chunk(2, dim=-1)
        return (1 + gamma) * F.layer_norm(x, x.shape[-1:], eps=1e-5) + beta


class DurationEncoder(nn.Module):
    """BiLSTM and AdaLayerNorm pairs over [text features ; style]; returns [B, N, C + style]."""

    def __init__(self, style_dim: int, d_model: int, nlayers: int):
        super().__init__()
        self.lstms = nn.ModuleList()
        for _ in range(nlayers):
            self.lstms.append(nn.LSTM(d_model + style_dim, d_model // 2, 1, batch_first=True, bidirectional=True))
            self.lstms.append(AdaLayerNorm(style_dim, d_model))

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """x [B, C, N] (ALBERT projected), s [B, style]."""
        style = s[:, None, :].expand(-1, x.shape[-1], -1)
        x = torch.cat([x.transpose(1, 2), style], dim=-1)
        for block in self.lstms:
            x = torch.cat([block(x, s), style], dim=-1) if isinstance(block, AdaLayerNorm) else block(x)[0]
        return x


class ProsodyPredictor(nn.Module):
    def __init__(self, style_dim: int, d_hid: int, nlayers: int, max_dur: int):
        super().__init__()
        half = d_hid // 2
        self.text_encoder = DurationEncoder(style_dim, d_hid, nlayers)
        self.lstm = nn.LSTM(d_hid + style_dim, half, 1, batch_first=True, bidirectional=True)
        self.duration_proj = nn.Module()
        self.duration_proj.linear_layer = nn.Linear(d_hid, max_dur)
        self.shared = nn.LSTM(d_hid + style_dim, half, 1, batch_first=True, bidirectional=True)
        self.F0 = self.curve_blocks(d_hid, style_dim)
        self.N = self.curve_blocks(d_hid, style_dim)
        self.F0_proj = nn.Conv1d(half, 1, 1)
        self.N_proj = nn.Conv1d(half, 1, 1)

    @staticmethod
    def curve_blocks(d_hid: int, style_dim: int) -> nn.ModuleList:
        half = d_hid // 2
        return nn.ModuleList([
            AdainResBlk1d(d_hid, d_hid, style_dim),
            AdainResBlk1d(d_hid, half, style_dim, upsample=True),
            AdainResBlk1d(half, half, style_dim),
        ])

    def durations(self, d: torch.Tensor, speed: float) -> torch.Tensor:
        """Frames per token [B, N], at least 1: the sum of max_dur sigmoids, divided by speed."""
        x = self.lstm(d)[0]
        frames = torch.sigmoid(self.duration_proj.linear_layer(x)).sum(dim=-1) / speed
        return torch.round(frames).clamp(min=1).long()

    def curves(self, en: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """en [B, C + style, F] -> F0 and N [B, 2F] (the middle block doubles the frame rate)."""
        x = self.shared(en.transpose(1, 2))[0].transpose(1, 2)
        return self.curve(self.F0, self.F0_proj, x, s), self.curve(self.N, self.N_proj, x, s)

    @staticmethod
    def curve(blocks: nn.ModuleList, proj: nn.Conv1d, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = block(x, s, None)
        return proj(x).squeeze(1)
