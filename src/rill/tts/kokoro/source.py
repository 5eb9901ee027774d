"""The iSTFTNet generator's excitation: a harmonic source from the predicted pitch, and its STFT.

This is the model's only randomness: an initial phase per harmonic (which the reference's
downsample-then-cumsum then drops, but still draws), then Gaussian noise added to the harmonics
(small where voiced, the whole signal where unvoiced). The reference draws a third tensor last, for
a noise branch its generator never reads; rill skips it, which changes nothing before it. Both are
drawn in that order from the utterance's own `torch.Generator` on the CPU: seeded with the
same number, the draws equal the reference's draws from torch's global CPU generator after
`torch.manual_seed` (the same Mersenne Twister, the same shapes, the same order), and a batched
utterance draws what it would draw alone. Done per utterance, at its own length: the sine's linear
interpolation and the STFT's reflect padding read the utterance's own last frames, not padding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 24000
HARMONICS = 8  # overtones above F0: 9 sines
SINE_AMP = 0.1
NOISE_STD = 0.003
VOICED_THRESHOLD_HZ = 10.0


class HarmonicSource(nn.Module):
    """F0 per frame -> a merged harmonic excitation per sample (the checkpoint's m_source)."""

    def __init__(self, upsample_scale: int):
        super().__init__()
        self.upsample_scale = upsample_scale
        self.l_linear = nn.Linear(HARMONICS + 1, 1)

    def sines(self, f0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """f0 [1, L, 1] Hz per sample -> [1, L, 9] sines with a phase that integrates F0."""
        harmonics = f0 * torch.arange(1, HARMONICS + 2, dtype=f0.dtype, device=f0.device)
        rad = (harmonics / SAMPLE_RATE) % 1
        initial = torch.rand(1, HARMONICS + 1, generator=gen).to(f0.device)
        initial[:, 0] = 0
        rad[:, 0, :] = rad[:, 0, :] + initial
        # integrate at the frame rate, then interpolate the phase back up (as the reference does)
        scale = self.upsample_scale
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / scale, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * torch.pi
        phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=scale, mode="linear").transpose(1, 2)
        return torch.sin(phase) * SINE_AMP

    def forward(self, f0_frames: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """f0_frames [1, T] -> the merged source [1, T * upsample_scale]."""
        f0 = F.interpolate(f0_frames[:, None], scale_factor=self.upsample_scale).transpose(1, 2)
        sines = self.sines(f0, gen)
        voiced = (f0 > VOICED_THRESHOLD_HZ).to(f0.dtype)
        noise_amp = voiced * NOISE_STD + (1 - voiced) * SINE_AMP / 3
        # the reference's randn_like keeps the sines' strides (they come out of a transpose), and
        # torch fills a strided tensor in another order than a contiguous one: draw into the same strides
        noise = torch.empty_like(sines, device="cpu").normal_(generator=gen)
        noise = noise_amp * noise.to(f0.device)
        merged = torch.tanh(self.l_linear(sines * voiced + noise))
        return merged.transpose(1, 2).squeeze(1)


class ISTFT:
    """The STFT pair the generator works in (hann window, centred frames)."""

    def __init__(self, n_fft: int, hop: int):
        self.n_fft, self.hop = n_fft, hop
        self.window = torch.hann_window(n_fft, periodic=True, dtype=torch.float32)

    def analyse(self, signal: torch.Tensor) -> torch.Tensor:
        """[1, S] -> [1, n_fft + 2, S // hop + 1]: magnitudes then phases."""
        window = self.window.to(signal.device)
        spec = torch.stft(signal, self.n_fft, self.hop, self.n_fft, window=window, return_complex=True)
        return torch.cat([spec.abs(), spec.angle()], dim=1)

    def synthesise(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        """[1, n_fft // 2 + 1, frames] twice -> [1, (frames - 1) * hop] samples."""
        window = self.window.to(magnitude.device)
        spec = magnitude * torch.exp(phase * 1j)
        return torch.istft(spec, self.n_fft, self.hop, self.n_fft, window=window)


def upsample_scale(upsample_rates: list[int], hop: int) -> int:
    return math.prod(upsample_rates) * hop
