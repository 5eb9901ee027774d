"""Kokoro's decoder: aligned text features, F0 and energy -> audio, through an iSTFTNet generator.

The decoder's widths (1024, 512 and a 64-channel text residual) are fixed by Kokoro's architecture,
not by config.json; the generator's upsampling, kernels and STFT come from config's `istftnet`.
Frame lengths: F aligned frames -> 2F after the decoder's upsampling block -> 2F * prod(upsample_rates)
(+1 for the last level's reflection pad) STFT frames -> (frames - 1) * hop samples.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rill.tts.kokoro.layers import (
    AdainResBlk1d, AdaINResBlock1, WNConv1d, WNConvTranspose1d, apply_mask, length_mask, upsample_mask,
)
from rill.tts.kokoro.source import ISTFT, HarmonicSource, upsample_scale

DECODER_DIM = 1024
DECODER_OUT = 512
ASR_RES_DIM = 64


class Generator(nn.Module):
    def __init__(self, style_dim: int, cfg: dict):
        super().__init__()
        rates, kernels = cfg["upsample_rates"], cfg["upsample_kernel_sizes"]
        channels, n_fft = cfg["upsample_initial_channel"], cfg["gen_istft_n_fft"]
        self.rates, self.kernels = list(rates), list(kernels)
        self.num_kernels = len(cfg["resblock_kernel_sizes"])
        self.m_source = HarmonicSource(upsample_scale(rates, cfg["gen_istft_hop_size"]))
        self.stft = ISTFT(n_fft, cfg["gen_istft_hop_size"])
        self.ups, self.resblocks = nn.ModuleList(), nn.ModuleList()
        self.noise_convs, self.noise_res = nn.ModuleList(), nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(rates, kernels)):
            ch = channels // 2 ** (i + 1)
            self.ups.append(WNConvTranspose1d(channels // 2**i, ch, kernel, rate, padding=(kernel - rate) // 2))
            for k, d in zip(cfg["resblock_kernel_sizes"], cfg["resblock_dilation_sizes"]):
                self.resblocks.append(AdaINResBlock1(ch, k, d, style_dim))
            if i + 1 < len(rates):
                stride = math.prod(rates[i + 1:])
                self.noise_convs.append(nn.Conv1d(n_fft + 2, ch, stride * 2, stride, padding=(stride + 1) // 2))
                self.noise_res.append(AdaINResBlock1(ch, 7, [1, 3, 5], style_dim))
            else:
                self.noise_convs.append(nn.Conv1d(n_fft + 2, ch, 1))
                self.noise_res.append(AdaINResBlock1(ch, 11, [1, 3, 5], style_dim))
        self.conv_post = WNConv1d(ch, n_fft + 2, 7, 1, padding=3)

    def level_lengths(self, frames: torch.Tensor, level: int) -> torch.Tensor:
        """Each row's real length after upsampling level `level` (a transposed convolution)."""
        lengths = frames
        for rate, kernel in zip(self.rates[: level + 1], self.kernels[: level + 1]):
            lengths = (lengths - 1) * rate - 2 * ((kernel - rate) // 2) + kernel
        return lengths + 1 if level == len(self.rates) - 1 else lengths  # the reflection pad

    def sources(self, f0: torch.Tensor, frames: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
        """Each row's harmonic source spectrum at its own length, zero-padded: [B, n_fft + 2, S]."""
        spectra = [self.stft.analyse(self.m_source(f0[b : b + 1, : int(n)], gens[b])) for b, n in enumerate(frames)]
        width = max(s.shape[-1] for s in spectra)
        return torch.cat([F.pad(s, (0, width - s.shape[-1])) for s in spectra])

    def forward(self, x, s, f0, frames: torch.Tensor, gens: list[torch.Generator]) -> list[torch.Tensor]:
        """x [B, C, T], f0 [B, T] at 2F frames; frames [B] real lengths -> one waveform per row."""
        har = self.sources(f0, frames, gens)
        for i, up in enumerate(self.ups):
            x = F.leaky_relu(x, 0.1)
            lengths = self.level_lengths(frames, i)
            x = up(x)
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            mask = length_mask(lengths, x.shape[-1])
            x_source = apply_mask(self.noise_convs[i](har)[..., : x.shape[-1]], mask)
            x = apply_mask(x, mask) + self.noise_res[i](x_source, s, mask)
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            x = sum(block(x, s, mask) for block in blocks) / self.num_kernels
        x = self.conv_post(F.leaky_relu(x))
        half = self.stft.n_fft // 2 + 1
        return [self.stft.synthesise(torch.exp(x[b : b + 1, :half, :n]), torch.sin(x[b : b + 1, half:, :n]))
                for b, n in enumerate(lengths.tolist())]


class Decoder(nn.Module):
    def __init__(self, dim_in: int, style_dim: int, istftnet: dict):
        super().__init__()
        wide = DECODER_DIM + 2 + ASR_RES_DIM
        self.encode = AdainResBlk1d(dim_in + 2, DECODER_DIM, style_dim)
        self.decode = nn.ModuleList([
            AdainResBlk1d(wide, DECODER_DIM, style_dim),
            AdainResBlk1d(wide, DECODER_DIM, style_dim),
            AdainResBlk1d(wide, DECODER_DIM, style_dim),
            AdainResBlk1d(wide, DECODER_OUT, style_dim, upsample=True),
        ])
        self.F0_conv = WNConv1d(1, 1, 3, 2, 1)
        self.N_conv = WNConv1d(1, 1, 3, 2, 1)
        self.asr_res = nn.Sequential(WNConv1d(dim_in, ASR_RES_DIM, 1))
        self.generator = Generator(style_dim, istftnet)

    def forward(self, asr, f0, energy, s, frames: torch.Tensor, gens: list[torch.Generator]) -> list[torch.Tensor]:
        """asr [B, C, F]; f0, energy [B, 2F]; s [B, style]; frames [B] real F per row."""
        mask = length_mask(frames, asr.shape[-1])
        f0_down = apply_mask(self.F0_conv(f0[:, None]), mask)
        energy_down = apply_mask(self.N_conv(energy[:, None]), mask)
        x = self.encode(torch.cat([asr, f0_down, energy_down], dim=1), s, mask)
        asr_res = apply_mask(self.asr_res(asr), mask)
        for block in self.decode:  # only the last block upsamples, so every block reads the residuals
            x = block(torch.cat([x, asr_res, f0_down, energy_down], dim=1), s, mask)
        mask = upsample_mask(mask)
        return self.generator(apply_mask(x, mask), s, f0, frames * 2, gens)
