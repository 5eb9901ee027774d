"""Input audio for the realtime protocol: PCM16 mono, base64 on the wire, 16 kHz for the model
(24 kHz input is low-passed and resampled), with caps per event and per connection.

Where the audio goes: with a speech model served, to the connection's recogniser (its
`SpeechLink`, rill.speech.live; see voice.py); otherwise to the loaded LLM's own audio front end
(`audio_front_end(model_config)`, none of rill's models has one), and with neither `AudioInput.append`
validates the audio (a client learns about a framing bug either way) and then refuses it with
`audio_not_supported`; the connection stays usable.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rill.transports.realtime.events import RealtimeError

MODEL_RATE_HZ = 16_000
SUPPORTED_RATES_HZ = (16_000, 24_000)
OPENAI_RATE_HZ = 24_000  # `audio/pcm` (GA) and `pcm16` (beta) in OpenAI's Realtime API
VLLM_RATE_HZ = 16_000  # vLLM's realtime clients send 16 kHz without naming a format
_LOWPASS_TAPS = 31


@dataclass(frozen=True)
class AudioLimits:
    max_event_s: float = 15.0  # one input_audio_buffer.append
    max_connection_s: float = 3600.0  # everything one connection sends


class AudioFrontEnd(Protocol):
    """What a model that hears offers the realtime connection (none of rill's models yet)."""

    def feed(self, samples_16k: np.ndarray) -> None: ...


def audio_front_end(model_config) -> AudioFrontEnd | None:
    """The loaded model's audio front end; None for every model rill loads today."""
    return getattr(model_config, "audio_front_end", None)


def decode_pcm16(audio_b64: str, max_samples: int) -> np.ndarray:
    """Base64 PCM16 little-endian mono -> float32 samples in [-1, 1)."""
    try:
        raw = base64.b64decode(audio_b64, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_audio", "`audio` is not valid base64", "audio") from None
    if not raw:
        raise RealtimeError("invalid_audio", "`audio` is empty", "audio")
    if len(raw) % 2:
        raise RealtimeError("invalid_audio", f"PCM16 audio has an even number of bytes; got {len(raw)}", "audio")
    if len(raw) // 2 > max_samples:
        raise RealtimeError("audio_too_large", f"one append carries at most {max_samples} samples; "
                            f"got {len(raw) // 2}: send smaller chunks", "audio")
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def resample(samples: np.ndarray, from_hz: int, to_hz: int = MODEL_RATE_HZ) -> np.ndarray:
    """Down-sample with a windowed-sinc low-pass below the new Nyquist, then linear interpolation."""
    if from_hz == to_hz or len(samples) == 0:
        return samples
    cutoff = 0.45 * to_hz / from_hz  # in cycles per input sample, a little under the new Nyquist
    n = np.arange(_LOWPASS_TAPS) - (_LOWPASS_TAPS - 1) / 2
    taps = np.sinc(2 * cutoff * n) * np.hamming(_LOWPASS_TAPS)
    filtered = np.convolve(samples, taps / taps.sum(), mode="same")
    num_out = len(samples) * to_hz // from_hz
    positions = np.arange(num_out) * (from_hz / to_hz)
    return np.interp(positions, np.arange(len(samples)), filtered).astype(np.float32)


class AudioInput:
    """One connection's input audio: validation, caps, resampling, and the front end if any."""

    def __init__(self, front_end: AudioFrontEnd | None, limits: AudioLimits | None = None):
        self.front_end = front_end
        self.limits = limits or AudioLimits()
        self.num_samples_16k = 0  # everything accepted on this connection, at the model's rate

    def append(self, audio_b64: str, rate_hz: int) -> None:
        samples = decode_pcm16(audio_b64, int(self.limits.max_event_s * rate_hz))
        samples = resample(samples, rate_hz)
        if self.num_samples_16k + len(samples) > self.limits.max_connection_s * MODEL_RATE_HZ:
            raise RealtimeError("audio_limit_reached", f"a connection sends at most {self.limits.max_connection_s:g} "
                                "s of audio; open a new connection", "audio")
        self._check_front_end()
        self.num_samples_16k += len(samples)
        self.front_end.feed(samples)

    def commit(self) -> None:
        self._check_front_end()

    def _check_front_end(self) -> None:
        if self.front_end is None:
            raise RealtimeError("audio_not_supported", "this model has no audio front end and this server serves "
                                "no speech model (rill serve --speech-model), so it cannot take input_audio_buffer "
                                "events; send text with conversation.item.create or input_text_buffer.append")
