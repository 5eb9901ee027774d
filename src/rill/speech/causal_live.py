"""Live recognition with a causal speech model: LiveTranscriber's interface and events, no re-decoding.

    live = CausalLiveTranscriber(speech_engine, LiveConfig(turn_detection=TurnDetection()), emit)
    nursery.start_soon(live.run)
    live.feed(samples_16k); live.commit(); live.clear()      # non-blocking, in order
    await live.wait_for_room()                                # back-pressure for the audio's source

The audio goes at once into one live stream of the speech worker (rill.speech.causal), at the rate the
client sent it when the model hears at that rate (`feed(samples_16k, native, rate_hz)`: Kyutai's 24 kHz
in a GA session), else at 16 kHz; the voice activity detector always hears the 16 kHz copy. The stream writes
each word once, the model's delay after it was spoken; `TranscriptDelta` carries whole words (a word
is whole at the next pad or the next word's start), so the chat prompt gets words as typed text does.

Turns:
- A commit ends the stream: the worker flushes the model's delay with silence (as a whole recording
  is padded), the turn's transcript is complete at the stream's last step, and the next audio opens a
  new stream. A turn's transcript is thus the whole-recording transcript of its audio.
- server_vad: the detector's end of speech at t ends the turn at the step that hears t + the model's
  delay (plus a frame); the stream goes on. If the client's audio does not reach that far within the
  delay (plus FILL_AFTER_S), the missing part is fed as silence (the speaker was silent already). A word
  still being written at that step (a word's tokens come one a frame: a spelled-out word or a number takes
  several) holds the turn's end until the word is whole (the next pad or word), at most MAX_HOLD_FRAMES:
  the turn's last word is not cut in two.
- semantic_vad: at a pause, once the words up to it are out (the same step rule) and the word in flight
  is whole (the same hold), the chat model is asked whether they end the turn
  (rill.speech.semantic_vad), as LiveTranscriber does: it reads whole words, and a turn it ends is not
  cut inside its last word.
Nothing here runs a model on the trio thread: the VAD runs in `trio.to_thread`, the model in the worker.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import soxr
import trio

from rill.errors import RillError
from rill.speech.live import (LiveConfig, LiveEvent, QueuedInput, SpeechFailed, SpeechStarted, SpeechStopped,
                              TranscriptDelta, TranscriptDone, _Mark)
from rill.speech.semantic_vad import CHECK_PAUSE_MS, TurnEndScorer, ends_turn
from rill.speech.vad import SAMPLE_RATE, Activity, VadEvent, VoiceActivity

MARGIN_FRAMES = 1  # a turn ends one frame after the step that hears its end plus the delay
FILL_AFTER_S = 0.3  # past the model's delay: how long a turn's end waits for the client's own audio
MAX_HOLD_FRAMES = 12  # how far past its step a turn's end waits for the word in flight to be whole


@dataclass(frozen=True)
class _Boundary:
    step: int  # the turn's words are in once the stream has run past this step
    check: bool  # semantic_vad's question (True) or the detector's end of the turn
    pause: int = 0  # semantic_vad: which pause (a later onset makes the question moot)
    speech_end: int = 0


@dataclass
class _Live:
    """One stream of the worker and where its turns end."""

    handle: object  # LiveHandle
    start: int  # stream index (16 kHz) of its first sample
    rate: int = SAMPLE_RATE  # what the stream takes (the model's own rate, or 16 kHz)
    num_fed: float = 0  # audio fed, inserted silence included, counted in 16 kHz samples
    num_inserted: float = 0  # silence fed at turn ends (16 kHz samples)
    num_steps: int = 0  # the worker's steps of it read so far
    boundaries: deque[_Boundary] = field(default_factory=deque)
    final: bool | None = None  # set by the commit that ended it
    closing: int | None = None  # server_vad: a turn's end held for the word in flight; at this step at the latest
    checking: tuple[_Boundary, int] | None = None  # semantic_vad: a pause's question held for the word in flight


class CausalLiveTranscriber(QueuedInput):
    """One live stream's recogniser over a causal model; `run` it in a nursery, feed it from trio."""

    def __init__(self, speech, config: LiveConfig, emit: Callable[[LiveEvent], None],
                 turn_end: TurnEndScorer | None = None):
        self.speech = speech  # AsyncSpeechEngine over a core with `live` streams
        self.config = config
        self.info = speech.core.causal_info
        self._emit, self._turn_end = emit, turn_end
        turn = config.turn_detection
        pause_ms = min(config.pause_ms, CHECK_PAUSE_MS) if turn is not None and turn.is_semantic else config.pause_ms
        self._vad = VoiceActivity(turn, pause_ms) if turn is not None else None
        self._incoming: deque[np.ndarray | _Mark] = deque()
        self._native: deque[tuple[np.ndarray, int] | None] = deque()  # beside each 16 kHz piece: as sent
        self._ready, self._progress = trio.Event(), trio.Event()
        self._send_live, self._recv_live = trio.open_memory_channel(math.inf)  # streams, read in order
        self._live: _Live | None = None  # the stream audio goes to now
        self._reading: _Live | None = None  # the stream whose deltas are read now
        self._nursery: trio.Nursery | None = None  # run()'s
        self._in_turn = False
        self._num_pauses = 0
        self._words: list[str] = []  # the turn's words emitted
        self._held = ""  # the word being written
        self._heard_any = False  # a word was emitted in an earlier turn (TranscriptDelta.gap)
        self._gap = ""  # the space written before the turn's first word, until the word comes
        self._turn_start = 0
        self.num_samples = 0  # fed by the client
        self._num_streamed = 0  # of those, given to a stream (the detector's sample indices count the same)
        self._streamed_at = 0.0  # when the client's audio last went to a stream (trio clock)
        self.num_streams = 0
        self.failed = False

    # -- trio side: non-blocking input ------------------------------------------------------------------

    @property
    def backlog_s(self) -> float:
        """Audio taken but not yet heard by the model (queued here or in the worker)."""
        queued = sum(len(x) for x in self._incoming if not isinstance(x, _Mark)) / SAMPLE_RATE
        lives = {id(live): live for live in (self._reading, self._live) if live is not None}
        return queued + sum(max(0.0, live.num_fed / SAMPLE_RATE - self._heard_s(live)) for live in lives.values())

    def feed(self, samples: np.ndarray, native: np.ndarray | None = None, rate_hz: int = SAMPLE_RATE) -> None:
        """16 kHz samples (for the detector, and for the model unless it hears at `rate_hz`), and the same
        audio as the client sent it (`native`, at `rate_hz`; None: a resampler's tail, 16 kHz only)."""
        samples = np.asarray(samples, dtype=np.float32)
        self.num_samples += len(samples)
        self._native.append(None if native is None else (np.asarray(native, dtype=np.float32), rate_hz))
        self._push(samples)

    # -- tasks ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._input_loop)
                await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            for live in (self._live, self._reading):
                if live is not None:
                    live.handle.close()  # the worker frees the stream
            self._drain_queued()

    def _drain_queued(self) -> None:
        while True:
            try:
                self._recv_live.receive_nowait().handle.close()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return

    async def _input_loop(self) -> None:
        while not self.failed:
            await self._ready.wait()
            self._ready = trio.Event()
            while self._incoming:
                item = self._incoming.popleft()
                if isinstance(item, _Mark):
                    self._mark(item)
                else:
                    self._to_stream(item, self._native.popleft())
                    if self._vad is not None:
                        events = await trio.to_thread.run_sync(self._vad.feed, item)
                        for event in events:
                            self._on_activity(event)
                self._signal_progress()

    def _to_stream(self, samples: np.ndarray, native: tuple[np.ndarray, int] | None) -> None:
        if self._live is None:
            rate = native[1] if native is not None and native[1] == self.info.sample_rate else SAMPLE_RATE
            self._live = _Live(self.speech.open_live(rate), self._num_streamed, rate)
            self.num_streams += 1
            self._send_live.send_nowait(self._live)
        pcm = self._stream_audio(self._live.rate, samples, native)
        if pcm.size:
            self._live.handle.feed(pcm)
            self._live.num_fed += len(pcm) * SAMPLE_RATE / self._live.rate
        self._num_streamed += len(samples)
        self._streamed_at = trio.current_time()

    @staticmethod
    def _stream_audio(rate: int, samples: np.ndarray, native: tuple[np.ndarray, int] | None) -> np.ndarray:
        """What a stream at `rate` takes of one piece: the 16 kHz samples, or the audio as sent."""
        if rate == SAMPLE_RATE:
            return samples
        if native is None:  # the 16 kHz resampler's tail: the stream has had this audio as sent already
            return samples[:0]
        if native[1] == rate:
            return native[0]
        return soxr.resample(native[0], native[1], rate).astype(np.float32)  # the session's format changed

    def _mark(self, mark: _Mark) -> None:
        if mark.kind == "clear":
            for live in (self._live, self._reading):
                if live is not None:
                    live.handle.close()
            self._drain_queued()
            self._live = None
            self._words, self._held, self._gap = [], "", ""
            return
        if self._live is None:  # nothing heard since the last commit: an empty turn
            self._live = _Live(self.speech.open_live(SAMPLE_RATE), 0)
            self._send_live.send_nowait(self._live)
        self._live.final = mark.final
        self._live.handle.end()
        self._live = None

    # -- the detector's events ------------------------------------------------------------------------

    def _on_activity(self, event: VadEvent) -> None:
        if event.kind in (Activity.SPEECH_STARTED, Activity.RESUMED):
            self._num_pauses += 1  # a question about an earlier pause is moot now
            if not self._in_turn:
                self._in_turn = True
                self._emit(SpeechStarted(event.at_sample * 1000 // SAMPLE_RATE))
        elif event.kind is Activity.PAUSED and self._in_turn and self.config.turn_detection.is_semantic:
            self._add_boundary(event.at_sample, check=True)
        elif event.kind is Activity.SPEECH_STOPPED and self._in_turn:
            self._in_turn = False
            self._emit(SpeechStopped(event.at_sample * 1000 // SAMPLE_RATE))
            self._add_boundary(event.at_sample, check=False)

    def _add_boundary(self, at_sample: int, check: bool) -> None:
        live = self._live
        if live is None:
            return
        info = self.info
        heard_at = (at_sample - live.start + live.num_inserted) / SAMPLE_RATE
        step = math.ceil((heard_at + info.prefix_s + info.delay_s) / info.frame_s) + MARGIN_FRAMES
        live.boundaries.append(_Boundary(step, check, self._num_pauses, at_sample))
        if not check:
            self._nursery.start_soon(self._fill_silence, live, self._needed(step))

    def _needed(self, step: int) -> int:
        """16 kHz samples a stream must have been fed for its step `step` to run."""
        return math.ceil(((step + 1) * self.info.frame_s - self.info.prefix_s) * SAMPLE_RATE)

    async def _fill_silence(self, live: _Live, needed: int) -> None:
        """The turn must end even if the client stops sending after it: audio still missing once the
        model's delay has passed in wall time is fed as silence (a streaming client's own audio, when it
        comes in time, keeps the stream exactly what it heard)."""
        await trio.sleep(self.info.delay_s + FILL_AFTER_S)
        self._fill(live, needed)

    async def _fill_hold(self, live: _Live, closing: int) -> None:
        """A turn's end held for its last word: once the client has sent no audio for FILL_AFTER_S, what the
        hold's last step needs is fed as silence. A client that keeps sending, silence included, is never
        padded out (inserted silence would delay all its later words), and a pad ends the hold sooner."""
        while live.closing == closing and live is self._live:
            quiet_s = trio.current_time() - self._streamed_at
            if quiet_s >= FILL_AFTER_S:
                self._fill(live, self._needed(closing))
                return
            await trio.sleep(FILL_AFTER_S - quiet_s)

    def _fill(self, live: _Live, needed: int) -> None:
        missing = needed - live.num_fed
        if missing > 0 and live is self._live:
            count = math.ceil(missing * live.rate / SAMPLE_RATE)
            live.handle.feed(np.zeros(count, np.float32))
            live.num_fed += count * SAMPLE_RATE / live.rate
            live.num_inserted += count * SAMPLE_RATE / live.rate

    # -- the model's words ----------------------------------------------------------------------------

    def _heard_s(self, live: _Live) -> float:
        return max(0.0, live.num_steps * self.info.frame_s - self.info.prefix_s)

    async def _read_loop(self) -> None:
        async for live in self._recv_live:
            self._reading = live
            try:
                await self._read(live)
            except RillError as exc:  # the speech engine died or refused: one event, then nothing more
                self.failed = True
                self._emit(SpeechFailed(str(exc)))
                self._signal_progress()
                return
            finally:
                live.handle.close()
                self._reading = None

    async def _read(self, live: _Live) -> None:
        try:
            async for delta in live.handle:
                first = delta.num_steps - len(delta.token_ids)
                for i, piece in enumerate(delta.pieces):
                    await self._reach(live, first + i)
                    whole = not piece or piece[:1].isspace()  # the word in flight (if any) is whole
                    if live.closing is not None and (whole or first + i >= live.closing):
                        self._end_held(live)  # the held turn's last word is whole (or the hold ran out)
                    if live.checking is not None and (whole or first + i >= live.checking[1]):
                        boundary, live.checking = live.checking[0], None
                        await self._check(boundary)
                    self._write(piece, delta.token_ids[i] if i < len(delta.token_ids) else None)
                live.num_steps = delta.num_steps
                await self._reach(live, delta.num_steps)
                if delta.finished is not None and live.final is not None:
                    live.closing = None  # the commit ends the turn, whatever was in flight
                    self._close_turn(by_commit=True, final=live.final)
                self._signal_progress()
        except trio.ClosedResourceError:
            return  # cleared: its words are dropped

    async def _reach(self, live: _Live, step: int) -> None:
        """The stream has run every step before `step`: the boundaries behind it take effect."""
        while live.boundaries and live.boundaries[0].step < step:
            boundary = live.boundaries.popleft()
            if live.closing is not None:  # a later boundary came while a turn's end was held: it ends now
                self._end_held(live)
            live.checking = None  # a later boundary makes a held question moot (speech resumed, or the turn ended)
            if not boundary.check:
                if self._held:  # a word in flight: the turn ends once it is whole
                    live.closing = step + MAX_HOLD_FRAMES
                    self._nursery.start_soon(self._fill_hold, live, live.closing)
                else:
                    self._close_turn(by_commit=False, final=False)
            elif self._held:  # a word in flight: asked once it is whole
                live.checking = (boundary, step + MAX_HOLD_FRAMES)
            else:
                await self._check(boundary)

    async def _check(self, boundary: _Boundary) -> None:
        if await self._turn_ends(boundary):
            self._in_turn = False
            self._emit(SpeechStopped(boundary.speech_end * 1000 // SAMPLE_RATE))
            self._close_turn(by_commit=False, final=False)

    async def _turn_ends(self, boundary: _Boundary) -> bool:
        """semantic_vad: the words up to the pause are out; do they end the turn (and is it still paused)?"""
        text = " ".join("".join(self._words + [self._held]).split())
        if not text or self._turn_end is None or not self._paused(boundary):
            return False
        probability = await self._turn_end(text)
        return self._paused(boundary) and ends_turn(self.config.turn_detection.eagerness, probability)

    def _paused(self, boundary: _Boundary) -> bool:
        return self._in_turn and boundary.pause == self._num_pauses

    def _write(self, piece: str, token_id: int | None) -> None:
        """A word is whole at a pad (no text) or at the next word's start (a leading space)."""
        if not piece or piece[:1].isspace():
            self._release()
        self._held += piece

    def _release(self) -> None:
        word, self._held = self._held, ""
        gap = ""
        if not self._words:  # a turn's first word: its space goes to `gap` (kept until a word comes)
            self._gap += word[: len(word) - len(word.lstrip())]
            word, gap = word.lstrip(), self._gap
        if word:
            self._words.append(word)
            self._emit(TranscriptDelta(word, gap if self._heard_any else ""))
            self._heard_any, self._gap = True, ""

    def _end_held(self, live: _Live) -> None:
        live.closing = None
        self._close_turn(by_commit=False, final=False)

    def _close_turn(self, by_commit: bool, final: bool) -> None:
        self._release()
        text = "".join(self._words).strip()
        end = self._vad.num_samples if self._vad is not None else self.num_samples
        audio_s = max(0, end - self._turn_start) / SAMPLE_RATE
        self._words, self._turn_start = [], end
        self._emit(TranscriptDone(text, audio_s, final, by_commit))


def live_transcriber(speech, config: LiveConfig, emit: Callable[[LiveEvent], None],
                     turn_end: TurnEndScorer | None = None):
    """The recogniser for the served speech model: causal (its core runs live streams) or Whisper's."""
    from rill.speech.live import LiveTranscriber

    kind = CausalLiveTranscriber if getattr(speech.core, "live", None) is not None else LiveTranscriber
    return kind(speech, config, emit, turn_end=turn_end)
