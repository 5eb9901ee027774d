"""KyutaiCore: whole recordings (/v1/audio/transcriptions) through Kyutai STT streams, with SpeechCore's
interface (add_request / abort / has_work / step), so rill's speech worker drives either model.

Each request is a KyutaiStream fed from the upload's samples at the rate they come (`input_rate`, the
model's own 24 kHz: /v1/audio/transcriptions decodes straight to it, so nothing is resampled twice; 16 kHz
audio is still taken, and soxr brings it to 24 kHz). A step
feeds every live request its next `chunk_s` of audio, in arrival order, so a long file does not hold
up a short one for more than a chunk; the last step appends the model's delay in silence and returns
the Transcription. Segments are `segment_s` spans of audio with the text the stream wrote while
hearing them (the text lags its audio by the model's delay; the last segment takes the tail).

Live streams (realtime sessions) are the core's `live` (rill.speech.causal.LiveStreams): each worker step
advances every live stream together in batched passes, after the file requests' chunks.

Greedy decoding only, no prompt or prefix, no translation: the model has no such inputs, and a request
asking for them is refused (400) rather than silently answered otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rill.errors import ValidationError
from rill.speech.audio import MAX_SAMPLE_RATE
from rill.speech.causal import CausalInfo, LiveStreams
from rill.speech.decoding import Segment, SpeechDelta, TranscribeParams, Transcription
from rill.speech.kyutai.batch import KyutaiCausal
from rill.speech.kyutai.loader import KyutaiRuntime, load_kyutai
from rill.speech.kyutai.stream import KyutaiStream

DEFAULT_INPUT_RATE = 16_000  # a caller that names no rate: rill.speech.audio's default


@dataclass
class KyutaiRequest:
    request_id: str
    audio: np.ndarray
    language: str
    stream: KyutaiStream
    rate: int  # the audio's sample rate: counters and segment bounds are in its samples
    chunk_samples: int
    segment_samples: int
    num_fed: int = 0  # input samples fed so far
    token_ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    segment_text: str = ""
    segment_ids: list[int] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.audio.size / self.rate


class KyutaiCore:
    """Synchronous; owned by the speech worker thread."""

    def __init__(self, path_or_runtime: str | Path | KyutaiRuntime, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, chunk_s: float = 2.0, segment_s: float = 10.0, **_ignored):
        runtime = path_or_runtime
        if not isinstance(runtime, KyutaiRuntime):
            runtime = load_kyutai(runtime, device, dtype or torch.float32)
        self.runtime = runtime
        self.model_name = runtime.name
        self.chunk_s, self.segment_s = chunk_s, segment_s
        self.requests: dict[str, KyutaiRequest] = {}
        self.live = LiveStreams(KyutaiCausal(runtime))

    @property
    def causal_info(self) -> CausalInfo:
        return self.live.model.info

    @property
    def input_rate(self) -> int:
        """The rate the model hears (Mimi's 24 kHz): audio at it reaches the model without a resample."""
        return self.runtime.sampling_rate

    def check_live(self, language: str | None, prompt: str | None) -> None:
        """A realtime session's transcription settings: raises ValidationError for what the model cannot do."""
        if prompt:
            raise ValidationError("this model takes no prompt", param="prompt")
        languages = self.causal_info.languages
        if language is not None and language not in languages:
            raise ValidationError(f"language {language!r} is not one this model transcribes "
                                  f"({', '.join(languages)})", param="language")

    def add_request(self, request_id: str, audio: np.ndarray, params: TranscribeParams,
                    sample_rate: int = DEFAULT_INPUT_RATE) -> None:
        """Queue mono float32 audio at `sample_rate` (`input_rate` is fed as is, any other resampled once);
        raises ValidationError (and keeps nothing) if it cannot run."""
        if request_id in self.requests:
            raise ValidationError(f"request id {request_id!r} is already in use", param="request_id")
        _validate(params)
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValidationError(f"audio must be 1-D mono samples, got shape {audio.shape}", param="file")
        if not 0 < sample_rate <= MAX_SAMPLE_RATE:
            raise ValidationError(f"sample_rate must be in 1..{MAX_SAMPLE_RATE} Hz, got {sample_rate}",
                                  param="sample_rate")
        stream = KyutaiStream(self.runtime, sample_rate)
        self.requests[request_id] = KyutaiRequest(request_id, audio, params.language or "en", stream, sample_rate,
                                                  int(self.chunk_s * sample_rate), int(self.segment_s * sample_rate))

    def abort(self, request_id: str) -> None:
        """Forget a request or a live stream at once (its caches go with it). Unknown ids are ignored."""
        self.requests.pop(request_id, None)
        self.live.abort(request_id)

    def has_work(self) -> bool:
        return bool(self.requests) or self.live.has_work()

    @property
    def num_decoding(self) -> int:
        return len(self.requests)

    def step(self) -> list:
        deltas = [self._advance(request) for request in list(self.requests.values())]
        for delta in deltas:
            if delta.finished is not None:
                del self.requests[delta.request_id]
        return deltas + self.live.step()

    def _advance(self, request: KyutaiRequest) -> SpeechDelta:
        end = min(request.num_fed + request.chunk_samples, request.audio.size)
        delta = SpeechDelta(request.request_id)
        while request.num_fed < end:  # segment by segment, so a segment's text is its own
            boundary = (request.num_fed // request.segment_samples + 1) * request.segment_samples
            stop = min(end, boundary)
            self._take(request, request.stream.feed(request.audio[request.num_fed:stop]), delta)
            request.num_fed = stop
            if stop == boundary and stop < request.audio.size:
                delta.segment = self._close_segment(request)
        if request.num_fed >= request.audio.size:
            self._take(request, request.stream.finish(), delta)
            delta.segment = self._close_segment(request)
            delta.finished = Transcription("".join(s.text for s in request.segments), request.token_ids,
                                           request.segments, request.language, request.duration_s)
        return delta

    def _take(self, request: KyutaiRequest, got, delta: SpeechDelta) -> None:
        request.token_ids += got.token_ids
        request.segment_ids += got.token_ids
        request.segment_text += got.text
        delta.token_ids += got.token_ids
        delta.text += got.text

    def _close_segment(self, request: KyutaiRequest) -> Segment:
        index = len(request.segments)
        start = index * request.segment_samples / request.rate
        end = min((index + 1) * request.segment_samples, request.audio.size) / request.rate
        segment = Segment(index, start, end, request.segment_text, request.segment_ids)
        request.segments.append(segment)
        request.segment_text, request.segment_ids = "", []
        return segment


def _validate(params: TranscribeParams) -> None:
    if params.task != "transcribe":
        raise ValidationError("this model transcribes only (no translation)", param="task")
    if params.prompt:
        raise ValidationError("this model takes no prompt", param="prompt")
    if params.prefix:
        raise ValidationError("this model takes no prefix", param="prefix")
    if params.temperature != 0.0:
        raise ValidationError("this model decodes greedily: temperature must be 0", param="temperature")
