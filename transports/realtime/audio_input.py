"""Input audio for the realtime protocol: PCM16 mono, base64 on the wire, with caps per event and per
connection, resampled to 16 kHz for the recogniser's voice activity detector (and Whisper) by one
streaming soxr resampler per connection: the pieces a client sends, whatever their sizes, give the
samples the whole clip resampled at once gives (soxr holds back the few samples its filter still needs;
a commit flushes them). A causal model that hears at the session's own rate (Kyutai's Mimi at 24 kHz
in a GA session) also gets the samples as sent, not 24k -> 16k -> 24k.

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
import soxr

from rill.transports.realtime.events import RealtimeError

MODEL_RATE_HZ = 16_000
SUPPORTED_RATES_HZ = (16_000, 24_000)
OPENAI_RATE_HZ = 24_000  # `audio/pcm` (GA) and `pcm16` (beta) in OpenAI's Realtime API
VLLM_RATE_HZ = 16_000  # vLLM's realtime clients send 16 kHz without naming a format


@dataclass(frozen=True)
class AudioLimits:
    max_event_s: float = 15.0  # one input_audio_buffer.append
    max_connection_s: float = 3600.0  # everything one connection sends


class AudioFrontEnd(Protocol):
    """What a model that hears offers the realtime connection (none of rill's models yet)."""

    def feed(self, samples_16k: np.ndarray, native: np.ndarray | None = None, rate_hz: int = MODEL_RATE_HZ) -> None:
        """The audio at 16 kHz, and as the client sent it (`native`, at `rate_hz`), covering the same time."""


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
    """A whole clip at once (a conversation item's input_audio): what the streamed pieces add up to."""
    if from_hz == to_hz or len(samples) == 0:
        return samples
    return soxr.resample(samples, from_hz, to_hz).astype(np.float32, copy=False)


class AudioInput:
    """One connection's input audio: validation, caps, resampling, and the front end if any."""

    def __init__(self, front_end: AudioFrontEnd | None, limits: AudioLimits | None = None):
        self.front_end = front_end
        self.limits = limits or AudioLimits()
        self.num_samples_16k = 0  # everything accepted on this connection, at the model's rate
        self._rate_hz = MODEL_RATE_HZ  # the rate the resampler takes (session.update may change it)
        self._resampler: soxr.ResampleStream | None = None  # None at 16 kHz: nothing to do

    def append(self, audio_b64: str, rate_hz: int) -> None:
        samples = decode_pcm16(audio_b64, int(self.limits.max_event_s * rate_hz))
        num_16k = len(samples) * MODEL_RATE_HZ // rate_hz  # what the samples come to (soxr may hold some back)
        if self.num_samples_16k + num_16k > self.limits.max_connection_s * MODEL_RATE_HZ:
            raise RealtimeError("audio_limit_reached", f"a connection sends at most {self.limits.max_connection_s:g} "
                                "s of audio; open a new connection", "audio")
        self._check_front_end()
        self.num_samples_16k += num_16k
        self.front_end.feed(self._to_16k(samples, rate_hz), samples, rate_hz)

    def commit(self) -> None:
        """The end of a turn: the resampler's held-back samples go out, and the next audio starts afresh
        (a commit ends the recogniser's stream too, so the next turn is a clip of its own)."""
        self._check_front_end()
        if self._resampler is not None:
            tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            self._resampler.clear()
            if tail.size:
                self.front_end.feed(tail)

    def clear(self) -> None:
        """input_audio_buffer.clear: what the resampler holds is dropped with the rest of the buffer."""
        if self._resampler is not None:
            self._resampler.clear()

    def _to_16k(self, samples: np.ndarray, rate_hz: int) -> np.ndarray:
        if rate_hz != self._rate_hz:  # the session's format changed: a new stream (a few held samples lost)
            self._rate_hz = rate_hz
            self._resampler = None if rate_hz == MODEL_RATE_HZ else soxr.ResampleStream(
                rate_hz, MODEL_RATE_HZ, 1, dtype="float32")
        return samples if self._resampler is None else self._resampler.resample_chunk(samples)

    def _check_front_end(self) -> None:
        if self.front_end is None:
            raise RealtimeError("audio_not_supported", "this model has no audio front end and this server serves "
                                "no speech model (rill serve --speech-model), so it cannot take input_audio_buffer "
                                "events; send text with conversation.item.create or input_text_buffer.append")
