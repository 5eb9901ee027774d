"""A spoken answer's audio on the wire, and its timeline.

    OutputFormat  the session's audio.output.format (GA: `audio/pcm` at 24 kHz, `audio/pcmu` and
                  `audio/pcma`, G.711 at 8 kHz) or the beta's output_audio_format (`pcm16`,
                  `g711_ulaw`, `g711_alaw`)
    WireAudio     one answer's frames (float32 at the voice's rate) -> base64 pieces in that format.
                  One streaming resampler (soxr) for the whole answer, so clause joins leave no
                  clicks; G.711 is libsndfile's (soundfile), PCM16 little-endian is numpy's.
    Timeline      one answer's clauses and their spans of audio: the text said by any moment of it,
                  which is what `conversation.item.truncate`'s audio_end_ms asks for.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field

import numpy as np
import soundfile
import soxr

from rill.transports.realtime.events import RealtimeError

PIECE_MS = 200  # audio per response.output_audio.delta: a player can start on the first one
_GA = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
_RATES = {"pcm16": 24_000, "g711_ulaw": 8_000, "g711_alaw": 8_000}
_SUBTYPES = {"g711_ulaw": "ULAW", "g711_alaw": "ALAW"}


@dataclass(frozen=True)
class OutputFormat:
    name: str = "pcm16"  # the beta's name: pcm16, g711_ulaw or g711_alaw

    @property
    def rate_hz(self) -> int:
        return _RATES[self.name]

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.name == "pcm16" else 1

    def ga_wire(self) -> dict:
        kind = next(ga for ga, name in _GA.items() if name == self.name)
        return {"type": kind, "rate": self.rate_hz} if self.name == "pcm16" else {"type": kind}


def ga_format(value: dict, param: str) -> OutputFormat:
    """audio.output.format: {"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcmu"} or {"type": "audio/pcma"}."""
    kind, rate = value.get("type", "audio/pcm"), value.get("rate")
    if kind not in _GA:
        raise RealtimeError("invalid_value", f"{param}.type must be one of {', '.join(_GA)}; got {kind!r}",
                            f"{param}.type")
    fmt = OutputFormat(_GA[kind])
    if rate is not None and rate != fmt.rate_hz:
        raise RealtimeError("invalid_value", f"{param}.rate: {kind} is sent at {fmt.rate_hz} Hz; got {rate!r}",
                            f"{param}.rate")
    return fmt


def beta_format(value: str, param: str) -> OutputFormat:
    if value not in _RATES:
        raise RealtimeError("invalid_value", f"{param} must be one of {', '.join(_RATES)}; got {value!r}", param)
    return OutputFormat(value)


class WireAudio:
    """One answer's audio, encoded for the wire as it is made."""

    def __init__(self, fmt: OutputFormat, source_rate_hz: int):
        self.format = fmt
        self._resampler = None if source_rate_hz == fmt.rate_hz else soxr.ResampleStream(
            source_rate_hz, fmt.rate_hz, 1, dtype="float32")
        self._piece_bytes = fmt.rate_hz * PIECE_MS // 1000 * fmt.bytes_per_sample
        self.num_bytes = 0

    def pieces(self, samples: np.ndarray, last: bool = False) -> list[str]:
        """`samples` (float32 at the source rate) as base64 pieces of at most PIECE_MS each."""
        samples = np.asarray(samples, dtype=np.float32)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=last)
        data = self._encode(samples)
        self.num_bytes += len(data)
        step = self._piece_bytes
        return [base64.b64encode(data[i:i + step]).decode() for i in range(0, len(data), step)]

    def _encode(self, samples: np.ndarray) -> bytes:
        if not len(samples):
            return b""
        samples = np.clip(samples, -1.0, 1.0)
        if self.format.name == "pcm16":
            return (samples * 32767).astype("<i2").tobytes()
        out = io.BytesIO()
        soundfile.write(out, samples, self.format.rate_hz, format="RAW", subtype=_SUBTYPES[self.format.name])
        return out.getvalue()


@dataclass
class Timeline:
    """What one spoken answer said, and when: (transcript piece, start ms, end ms) per clause, in order."""

    spans: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def total_ms(self) -> float:
        return self.spans[-1][2] if self.spans else 0.0

    def add(self, text: str, duration_ms: float) -> None:
        start = self.total_ms
        self.spans.append((text, start, start + duration_ms))

    def text_at(self, audio_end_ms: float) -> str:
        """The transcript of the audio up to `audio_end_ms`: every clause that ended by then, and of the
        clause it cuts into the words spoken by then (in proportion to its time: a word is in once the
        time its share of the clause started has passed; half-heard words count as heard)."""
        out = []
        for text, start, end in self.spans:
            if audio_end_ms >= end:
                out.append(text)
                continue
            if audio_end_ms > start:
                words = text.split(" ")
                lead = [w for w in words if not w]  # the space that joins it to the clause before
                spoken = [w for w in words if w]
                num = int(np.ceil(len(spoken) * (audio_end_ms - start) / (end - start)))
                out.append(" " * len(lead) + " ".join(spoken[:num]))
            break
        return "".join(out)
