"""Voxtral Realtime's log-mel front end, run causally: samples in, whole mel frames out as soon as the
samples they cover have arrived.

transformers' VoxtralRealtimeFeatureExtractor on a whole clip: a centred STFT (the clip reflect-padded by
n_fft / 2 at both ends) with a periodic Hann window of n_fft every hop_length, the last frame dropped, the
power through a Slaney mel filterbank, log10 clamped at 1e-10, floored 8 below a fixed ceiling
(`global_log_mel_max`, not the clip's maximum, which is what lets it stream), then (x + 4) / 4.

Frame i covers padded samples [i * hop, i * hop + n_fft), that is the clip's [i * hop - n_fft / 2,
i * hop + n_fft / 2): it is ready 2.5 ms (40 samples) after the end of its 80 ms frame. The left reflection
needs the first n_fft / 2 + 1 samples; the right one is added by `finish` (the clip ends in silence, so it
reflects zeros). A stream keeps fewer than n_fft samples between calls.
"""

from __future__ import annotations

import numpy as np
import torch

from rill.speech.features import mel_filters
from rill.speech.voxtral_realtime.config import AudioSpec

_LOG_FLOOR = 1e-10
_DYNAMIC_RANGE = 8.0


class MelFrontEnd:
    """Shared by every stream: the window and the filterbank."""

    def __init__(self, spec: AudioSpec, device: torch.device):
        self.spec = spec
        self.window = torch.hann_window(spec.n_fft, device=device)
        filters = mel_filters(spec.num_mel_bins, spec.n_fft, spec.sampling_rate)
        self.filters = torch.from_numpy(filters).to(device, torch.float32)  # [n_mels, n_fft // 2 + 1]

    @torch.inference_mode()
    def frames(self, padded: torch.Tensor) -> torch.Tensor:
        """Padded samples [n] (n >= n_fft) -> [n_mels, (n - n_fft) // hop + 1] log-mel frames."""
        stft = torch.stft(padded, self.spec.n_fft, self.spec.hop_length, window=self.window, center=False,
                          return_complex=True)
        power = (stft.abs() ** 2).contiguous()
        log_mel = (self.filters @ power).clamp(min=_LOG_FLOOR).log10()
        floor = torch.tensor(self.spec.global_log_mel_max - _DYNAMIC_RANGE, device=log_mel.device)
        return (torch.maximum(log_mel, floor) + 4.0) / 4.0


class MelStream:
    """One stream's front-end state: the padded samples not yet wholly consumed."""

    def __init__(self, front: MelFrontEnd):
        self.front = front
        self._half = front.spec.n_fft // 2
        self._buffer = np.zeros(0, dtype=np.float32)  # padded samples from the next frame's start
        self._started = False  # whether the left reflection is in the buffer
        self.num_samples = 0  # clip samples received
        self.num_frames = 0  # mel frames given out

    def push(self, samples: np.ndarray) -> torch.Tensor | None:
        """Clip samples -> the mel frames they complete ([n_mels, k]), or None when none is."""
        self.num_samples += samples.size
        self._buffer = np.concatenate([self._buffer, samples.astype(np.float32, copy=False)])
        if not self._started:
            if self._buffer.size <= self._half:
                return None
            self._buffer = np.concatenate([self._buffer[1 : self._half + 1][::-1], self._buffer])
            self._started = True
        return self._take()

    def finish(self) -> torch.Tensor | None:
        """End of the clip: reflect its tail, as a centred STFT does, and give the last frames."""
        if not self._started:
            raise ValueError(f"a clip needs more than {self._half} samples")
        tail = self._buffer[-self._half - 1 : -1][::-1]
        self._buffer = np.concatenate([self._buffer, tail])
        frames = self._take()
        # The centred STFT's last frame (starting at the clip's last sample's hop) is dropped.
        total = self.num_samples // self.front.spec.hop_length
        if frames is not None and self.num_frames > total:
            frames = frames[:, : frames.shape[1] - (self.num_frames - total)]
            self.num_frames = total
        self._buffer = self._buffer[:0]
        return frames if frames is not None and frames.shape[1] else None

    def _take(self) -> torch.Tensor | None:
        n_fft, hop = self.front.spec.n_fft, self.front.spec.hop_length
        if self._buffer.size < n_fft:
            return None
        count = (self._buffer.size - n_fft) // hop + 1
        frames = self.front.frames(torch.from_numpy(self._buffer[: (count - 1) * hop + n_fft].copy())
                                   .to(self.front.window.device))
        self._buffer = self._buffer[count * hop :]
        self.num_frames += count
        return frames
