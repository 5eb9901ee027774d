"""Variety on top of espeak-ng, in numpy: time offset, random filter, gain and noise at a random SNR.

espeak-ng is a formant synthesiser: the same text and voice give the same samples every time.
These draws make every presentation of an utterance a little different, so the model hears the
words rather than one waveform. Each call takes its own numpy Generator, so a batch is a function
of the recipe's seed and the step alone.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16_000
SNR_DB = (5.0, 40.0)
GAIN_DB = (-18.0, 6.0)
MAX_OFFSET_S = 0.4
CLEAN_SHARE = 0.15  # presentations with no noise and no filter at all


def augment(audio: np.ndarray, rng: np.random.Generator, window_samples: int,
            clean_share: float = CLEAN_SHARE) -> np.ndarray:
    """One presentation of `audio` (float32, 16 kHz), no longer than `window_samples`; a
    `clean_share` of presentations get no filter and no noise."""
    audio = _offset(audio, rng, window_samples)
    if rng.random() >= clean_share:
        audio = _filter(audio, rng)
        audio = _add_noise(audio, rng)
    audio = audio * np.float32(10 ** (rng.uniform(*GAIN_DB) / 20))
    return np.clip(audio, -1.0, 1.0).astype(np.float32)


def _offset(audio: np.ndarray, rng: np.random.Generator, window_samples: int) -> np.ndarray:
    room = max(0, window_samples - len(audio))
    lead = int(rng.uniform(0, min(MAX_OFFSET_S * SAMPLE_RATE, room)))
    return np.concatenate([np.zeros(lead, np.float32), audio])[:window_samples]


def _filter(audio: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random smooth frequency response in the FFT domain: a low-pass (telephone to wide band),
    a high-pass (small speakers), and a spectral tilt, each drawn independently."""
    if len(audio) == 0:
        return audio
    n_fft = 1 << (len(audio) - 1).bit_length()  # a power of two: numpy's FFT is slow at odd lengths
    freqs = np.fft.rfftfreq(n_fft, 1 / SAMPLE_RATE)
    response = np.ones_like(freqs)
    if rng.random() < 0.5:
        cutoff = rng.uniform(2500, 7500)
        response /= np.sqrt(1 + (freqs / cutoff) ** (2 * rng.integers(1, 4)))
    if rng.random() < 0.5:
        cutoff = rng.uniform(80, 400)
        response *= 1 / np.sqrt(1 + (cutoff / np.maximum(freqs, 1.0)) ** 2)
    tilt_db_per_octave = rng.uniform(-3, 3)
    response *= (np.maximum(freqs, 100.0) / 1000.0) ** (tilt_db_per_octave / 6.02)
    return np.fft.irfft(np.fft.rfft(audio, n=n_fft) * response, n=n_fft)[: len(audio)].astype(np.float32)


def _add_noise(audio: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """White or brown-ish noise scaled to a random signal-to-noise ratio."""
    if len(audio) == 0:
        return audio
    noise = rng.standard_normal(len(audio)).astype(np.float32)
    if rng.random() < 0.4:  # low-frequency heavy: a running sum, high-passed by removing its trend
        noise = np.cumsum(noise)
        noise -= np.convolve(noise, np.ones(64) / 64, mode="same")
    signal_power = float(np.mean(audio**2)) + 1e-12
    noise_power = float(np.mean(noise**2)) + 1e-12
    snr_db = rng.uniform(*SNR_DB)
    return audio + noise * np.float32(np.sqrt(signal_power / noise_power / 10 ** (snr_db / 10)))
