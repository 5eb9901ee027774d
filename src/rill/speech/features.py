"""Whisper's log-mel front end in torch, numerically the same as transformers' `WhisperFeatureExtractor`.

The recipe (OpenAI's whisper/audio.py, as transformers' `_torch_extract_fbank_features` computes it):
pad or cut the 16 kHz waveform to `n_samples`; centred STFT with a periodic Hann window of `n_fft`
samples every `hop_length`; drop the last frame (so `n_samples // hop_length` frames); power spectrum;
Slaney-scale, Slaney-normalised mel filterbank over 0..8 kHz; log10 of it clamped at 1e-10; everything
more than 8 (80 dB) below the clip's loudest value raised to that floor; then (x + 4) / 4.

The filterbank is built here in float64 the way transformers' `audio_utils.mel_filter_bank` builds it
(itself librosa's `filters.mel(norm="slaney")`) and used in float32, so the two front ends run the same
float32 arithmetic; tests/test_log_mel.py measures the difference.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import torch

from rill.errors import ModelLoadError
from rill.speech.audio import SAMPLE_RATE

_LOG_FLOOR = 1e-10  # log10 clamp: -100 dB below full power
_DYNAMIC_RANGE = 8.0  # log10 units (80 dB) kept below each clip's maximum


class FeatureConfig(msgspec.Struct, frozen=True):
    """The fields of a model's preprocessor_config.json that shape its features."""

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    chunk_length: int = 30
    n_samples: int = 480000
    nb_max_frames: int = 3000

    def __post_init__(self) -> None:
        # transformers derives n_samples from chunk_length and ignores the stored value; a file whose
        # fields disagree would give rill and transformers different windows, so refuse it.
        if self.n_samples != self.chunk_length * self.sampling_rate:
            raise ValueError(
                f"n_samples={self.n_samples} is not chunk_length * sampling_rate = "
                f"{self.chunk_length} * {self.sampling_rate}")
        if self.nb_max_frames != self.n_samples // self.hop_length:
            raise ValueError(
                f"nb_max_frames={self.nb_max_frames} is not n_samples // hop_length = "
                f"{self.n_samples} // {self.hop_length}")
        if self.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"sampling_rate={self.sampling_rate}: rill's audio input is {SAMPLE_RATE} Hz")

    @classmethod
    def from_dir(cls, path: str | Path) -> FeatureConfig:
        """Read `preprocessor_config.json`; n_samples and nb_max_frames follow chunk_length when absent."""
        file = Path(path) / "preprocessor_config.json"
        try:
            raw = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{file}: cannot read it ({exc})") from None
        fields = {name: raw[name] for name in cls.__struct_fields__ if name in raw}
        fields.setdefault("n_samples", fields.get("chunk_length", 30) * fields.get("sampling_rate", 16000))
        fields.setdefault("nb_max_frames", fields["n_samples"] // fields.get("hop_length", 160))
        try:
            return msgspec.convert(fields, cls)
        except (msgspec.ValidationError, ValueError) as exc:
            raise ModelLoadError(f"{file}: {exc}") from None


class LogMel:
    """Audio (16 kHz mono float) -> Whisper log-mel features on `device`."""

    def __init__(self, config: FeatureConfig, device: str | torch.device = "cpu"):
        self.config = config
        self.device = torch.device(device)
        self.window = torch.hann_window(config.n_fft, device=self.device)  # periodic, as torch.stft wants
        filters = mel_filters(config.feature_size, config.n_fft, config.sampling_rate)
        self.filters = torch.from_numpy(filters).to(self.device, torch.float32)  # (n_mels, n_fft // 2 + 1)

    def __call__(self, audio: np.ndarray) -> torch.Tensor:
        """One clip -> (feature_size, nb_max_frames) float32."""
        return self.batch([audio])[0]

    @torch.inference_mode()
    def batch(self, audios: list[np.ndarray]) -> torch.Tensor:
        """Clips -> (B, feature_size, nb_max_frames) float32; each clip has its own 80 dB floor."""
        waves = torch.from_numpy(np.stack([self._fit(audio) for audio in audios])).to(self.device)  # (B, n_samples)
        stft = torch.stft(waves, self.config.n_fft, self.config.hop_length, window=self.window,
                          return_complex=True)  # (B, n_fft // 2 + 1, nb_max_frames + 1)
        power = (stft[..., :-1].abs() ** 2).contiguous()  # contiguous: the strided matmul is ~8x slower
        log_mel = (self.filters @ power).clamp(min=_LOG_FLOOR).log10()  # (B, n_mels, nb_max_frames)
        floor = log_mel.amax(dim=(1, 2), keepdim=True) - _DYNAMIC_RANGE
        return (torch.maximum(log_mel, floor) + 4.0) / 4.0

    def _fit(self, audio: np.ndarray) -> np.ndarray:
        """Zero-pad at the end or cut to n_samples, as the extractor's padding="max_length" does."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"LogMel takes 1-D mono audio, got shape {audio.shape}")
        n_samples = self.config.n_samples
        if len(audio) >= n_samples:
            return audio[:n_samples]
        return np.pad(audio, (0, n_samples - len(audio)))


def mel_filters(n_mels: int, n_fft: int, sampling_rate: int) -> np.ndarray:
    """Slaney mel filterbank, float64 (n_mels, n_fft // 2 + 1), over 0 Hz..sampling_rate / 2.

    Triangles between mel-spaced edges in Hz, each scaled by 2 / its width so that every band has about
    equal energy (librosa's norm="slaney"). Operation for operation what transformers computes.
    """
    fft_hz = np.linspace(0, sampling_rate // 2, 1 + n_fft // 2)
    mel_edges = np.linspace(_hz_to_mel(0.0), _hz_to_mel(sampling_rate / 2), n_mels + 2)
    hz_edges = _mel_to_hz(mel_edges)  # (n_mels + 2,)
    widths = np.diff(hz_edges)
    offsets = hz_edges[:, None] - fft_hz[None, :]  # (n_mels + 2, n_freqs)
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    triangles = np.maximum(np.zeros(1), np.minimum(rising, falling))
    return triangles * (2.0 / (hz_edges[2:] - hz_edges[:-2]))[:, None]


# Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4).
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = 15.0


def _hz_to_mel(hz: float) -> float:
    if hz < _MIN_LOG_HZ:
        return 3.0 * hz / 200.0
    return _MIN_LOG_MEL + np.log(hz / _MIN_LOG_HZ) * (27.0 / np.log(6.4))


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    hz = 200.0 * mels / 3.0
    log_region = mels >= _MIN_LOG_MEL
    hz[log_region] = _MIN_LOG_HZ * np.exp(np.log(6.4) / 27.0 * (mels[log_region] - _MIN_LOG_MEL))
    return hz
