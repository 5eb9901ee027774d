"""Live streams of a causal speech model on the speech worker, all stepped together.

A causal model (Kyutai STT today: rill.speech.kyutai.batch; Voxtral Realtime can plug in the same way)
hears each frame of audio once and writes one text token per frame, a fixed delay behind the audio.
A live stream is opened, fed audio as it arrives, and ended (the model's delay flushed with silence);
every worker step advances ALL live streams together: the model's `step(streams, max_frames)` runs
each encoder pass and each decoder step of the streams that have audio as one batch.

Why on the speech worker and not the chat engine's scheduler: the speech worker is already a second
engine with its own thread, and a causal stream shares nothing with the chat model (no tokenizer, no
KV layout: its cache is a fixed sliding window per stream, its input an audio frame plus a token).
Batching with chat traffic would make every chat step wait for Mimi, and a long chat prefill would
stall a stream that must keep up with real time. Each worker step takes at most `max_frames` frames
of a stream, so a stream fed faster than real time (a file, a test) shares the worker fairly.

Worker side only: `LiveStreams` is synchronous and owned by the worker thread, like the cores.
"""

from __future__ import annotations

from typing import Protocol

import msgspec
import numpy as np

from rill.errors import ValidationError

MAX_FRAMES_PER_STEP = 6  # 480 ms of a stream per worker step


class CausalInfo(msgspec.Struct, frozen=True):
    """What a live transcriber needs to know of the model: the text for audio at t s comes out with the
    step that hears t + delay_s (step p hears audio up to p * frame_s - prefix_s)."""

    frame_s: float
    prefix_s: float
    delay_s: float
    languages: tuple[str, ...]
    sample_rate: int = 16_000  # the rate the model hears: a live stream opened at it is not resampled


class CausalStream(Protocol):
    ended: bool
    finished: bool
    num_steps: int

    def push(self, pcm: np.ndarray) -> None: ...  # mono float32 at the stream's input rate
    def end(self) -> None: ...  # no more audio: the model's delay is flushed with silence
    def pop_delta(self): ...  # -> StreamDelta (token_ids, text, pieces) since the last call

    @property
    def wants_step(self) -> bool: ...

    @property
    def num_ready_frames(self) -> int: ...

    @property
    def num_state_bytes(self) -> int: ...


class CausalModel(Protocol):
    info: CausalInfo

    def open_stream(self, input_rate: int) -> CausalStream: ...
    def step(self, streams: list[CausalStream], max_frames: int) -> None: ...  # one batched pass


# -- messages into the worker (STYLE.md principle 6) and what comes back -----------------------------------


class OpenLive(msgspec.Struct, frozen=True):
    request_id: str
    input_rate: int


class FeedLive(msgspec.Struct, frozen=True):
    request_id: str
    pcm: np.ndarray


class EndLive(msgspec.Struct, frozen=True):
    request_id: str


class LiveEnd(msgspec.Struct, frozen=True):
    num_steps: int


class LiveDelta(msgspec.Struct):
    """What one worker step gives one live stream: its new tokens (pads included), the text each adds,
    and the stream's step count after them (token i was sampled at step `num_steps - len(token_ids) + i`)."""

    request_id: str
    token_ids: list[int] = msgspec.field(default_factory=list)
    pieces: list[str] = msgspec.field(default_factory=list)
    text: str = ""
    num_steps: int = 0
    finished: LiveEnd | None = None  # the last delta of an ended stream
    error: str | None = None


class LiveStreams:
    """The worker's live streams: id -> stream. Synchronous; the worker thread owns it."""

    def __init__(self, model: CausalModel, max_frames: int = MAX_FRAMES_PER_STEP):
        self.model = model
        self.max_frames = max_frames
        self.streams: dict[str, CausalStream] = {}
        self.num_steps = 0  # batched steps run
        self.max_batch = 0  # the most streams one step has advanced together

    @property
    def num_live(self) -> int:
        return len(self.streams)

    @property
    def num_state_bytes(self) -> int:
        return sum(s.num_state_bytes for s in self.streams.values())

    def open(self, request_id: str, input_rate: int) -> None:
        if request_id in self.streams:
            raise ValidationError(f"stream id {request_id!r} is already in use", param="request_id")
        if input_rate <= 0:
            raise ValidationError(f"input_rate must be positive, got {input_rate}", param="input_rate")
        self.streams[request_id] = self.model.open_stream(input_rate)

    def feed(self, request_id: str, pcm: np.ndarray) -> None:
        """Unknown or ended streams are ignored (the trio side aborted or ended them meanwhile)."""
        stream = self.streams.get(request_id)
        if stream is not None and not stream.ended:
            stream.push(pcm)

    def end(self, request_id: str) -> None:
        stream = self.streams.get(request_id)
        if stream is not None:
            stream.end()

    def abort(self, request_id: str) -> bool:
        """Forget a stream at once (its caches go with it); whether it was live."""
        return self.streams.pop(request_id, None) is not None

    def has_work(self) -> bool:
        return any(_busy(s) for s in self.streams.values())

    def step(self) -> list[LiveDelta]:
        busy = [s for s in self.streams.values() if _busy(s)]
        if busy:
            self.model.step(busy, self.max_frames)
            self.num_steps += 1
            self.max_batch = max(self.max_batch, len(busy))
        deltas = []
        for request_id, stream in list(self.streams.items()):
            got = stream.pop_delta()
            delta = LiveDelta(request_id, got.token_ids, got.pieces, got.text, stream.num_steps)
            if stream.finished:
                delta.finished = LiveEnd(stream.num_steps)
                del self.streams[request_id]
            if delta.token_ids or delta.text or delta.finished is not None:
                deltas.append(delta)
        return deltas


def _busy(stream: CausalStream) -> bool:
    return stream.wants_step or stream.num_ready_frames > 0 or (stream.ended and not stream.finished)
