"""Streaming recognition of one live audio stream: VAD-segmented LocalAgreement through the speech worker.

    live = LiveTranscriber(speech_engine, LiveConfig(turn_detection=TurnDetection()), emit)
    nursery.start_soon(live.run)
    live.feed(samples_16k); live.commit(); live.clear()      # non-blocking, in order
    await live.wait_for_room()                                # back-pressure for the audio's source

`emit` gets, in order: `SpeechStarted` / `SpeechStopped` (server VAD), `TranscriptDelta` as words
become final, `TranscriptDone` when a turn's transcript is complete (the VAD's end of speech, or a
commit), and `SpeechFailed` if the speech engine fails. With semantic_vad (rill.speech.semantic_vad)
a pause whose words sound finished ends the turn too: `turn_end` (the chat model's end-of-turn
probability, asked of the engine) is awaited after the pause's final pass.

How (rill.speech.vad, rill.speech.prefix_agreement):
- Every appended piece is labelled by the VAD in a worker thread. Speech opens a segment (from
  `prefix_padding_ms` before the onset); a pause of `pause_ms` closes it, as does a commit; one
  that fills the model's window is cut at its quietest 30 ms near the end. Silence outside
  segments is never decoded (Whisper invents words in silence).
- While a segment is open it is decoded again whenever `pass_interval_s` of new audio has come and
  the previous pass is done: at most one pass per stream in flight, so a busy machine makes passes
  rarer rather than queueing them. Each pass forces the committed words as its prefix; words two
  passes agree on go out at once. A closed segment gets one final pass that commits the rest,
  unless its last pass already heard all its speech: when the VAD hears speech pause, a pass starts
  at once, so by the end of the turn's silence the last words are usually in.
- A pass costs one encoder window (the audio is at most one window, padded as Whisper pads) plus
  the new words' decoder steps, however long the stream: an hour costs the same per second as a
  minute. Passes of all streams meet in the speech worker, which batches them.
- Memory is bounded: the stream keeps the open segment (at most one window), closed segments that
  wait for their final pass and audio not yet labelled; `wait_for_room` holds the source while
  the last two are over `max_backlog_s`.
Nothing here runs a model on the trio thread: the VAD runs in `trio.to_thread`, passes in the
speech worker.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np
import trio

from rill.errors import RillError
from rill.speech.decoding import TranscribeParams
from rill.speech.prefix_agreement import PrefixAgreement
from rill.speech.semantic_vad import CHECK_PAUSE_MS, TurnEndScorer, ends_turn
from rill.speech.vad import SAMPLE_RATE, Activity, TurnDetection, VadEvent, VoiceActivity, quietest_sample

CUT_SEARCH_S = 1.5  # a full window is cut at its quietest frame within this much of its end
WINDOW_MARGIN_S = 0.25  # a segment is cut this much before it would fill the model's window
TOKENS_PER_S = 12  # a pass decodes at most this many tokens per second of audio (plus MIN_TOKENS)
MIN_TOKENS = 8
# A pass that hears this much past the last speech frame has heard the whole word: when speech pauses,
# a pass starts at once, and if the segment then closes that pass's words are final (no final pass).
COVER_SAMPLES = 3 * 480


class LiveConfig(msgspec.Struct, frozen=True, kw_only=True):
    turn_detection: TurnDetection | None = TurnDetection()  # None: turns end at commit only
    language: str | None = None
    prompt: str | None = None  # the decoder's previous-text prompt (input_audio_transcription.prompt)
    pass_interval_s: float = 0.3
    # A segment's interim passes start once it holds this much audio (prefix padding included): from less,
    # a model trained on whole utterances guesses the question's frame, and two early passes can agree on
    # the same wrong guess (rill-tiny-speech's recipe at 1,500 steps committed "Uppercase" 0.6 s into "Add 558
    # and 1"; at 3,000 steps, with 1.0 s, "What is the weather in" for "What is twelve plus thirty?"). The
    # model trained on cut questions for longer hears 1.0 s as its offline transcripts do, now that numbers
    # wait for three passes (rill.speech.prefix_agreement); 1.5 s cost 0.2 s of lag at p50 in `rill bench voice`.
    min_interim_s: float = 1.0
    pause_ms: int = 250  # a segment closes at this much silence (at most silence_duration_ms)
    max_backlog_s: float = 30.0
    hold_last_word: bool = True


# -- events out ----------------------------------------------------------------------------------------


class SpeechStarted(msgspec.Struct, frozen=True):
    audio_start_ms: int  # from the start of the stream, prefix padding included


class SpeechStopped(msgspec.Struct, frozen=True):
    audio_end_ms: int


class TranscriptDelta(msgspec.Struct, frozen=True):
    text: str  # final words; the turn's first delta has no leading space
    gap: str = ""  # what the model wrote before a later turn's first word: its space, or nothing (a word a
    # turn's end cut in two goes on); vLLM's running transcript puts it back


class TranscriptDone(msgspec.Struct, frozen=True):
    text: str  # the turn's whole transcript
    audio_s: float  # speech decoded for it
    final: bool = False  # the stream ended (a commit with final: true)
    by_commit: bool = False  # a commit ended the turn (not the VAD)


class SpeechFailed(msgspec.Struct, frozen=True):
    message: str


LiveEvent = SpeechStarted | SpeechStopped | TranscriptDelta | TranscriptDone | SpeechFailed


# -- what the recogniser works through ---------------------------------------------------------------------


@dataclass
class _Segment:
    start: int  # sample index in the stream
    audio: list[np.ndarray] = field(default_factory=list)
    num_samples: int = 0
    agreement: PrefixAgreement = field(default_factory=PrefixAgreement)
    num_passed_samples: int = 0  # audio the latest pass began with
    speech_end: int = 0  # stream index after the segment's last speech frame (the VAD's)
    num_heard_samples: int = 0  # audio the latest completed interim pass heard
    num_reused_samples: int = 0  # audio of the segment it continues (semantic_vad), already counted

    @property
    def heard_all_speech(self) -> bool:
        """The latest completed interim pass heard every speech frame (and a margin after): what it said
        is what a final pass would say, so the segment can close on it without another pass."""
        return self.num_heard_samples > 0 and self.start + self.num_heard_samples >= self.speech_end + COVER_SAMPLES

    @property
    def speech_has_paused(self) -> bool:
        """The VAD heard COVER_SAMPLES of non-speech after the last speech frame."""
        return self.start + self.num_samples >= self.speech_end + COVER_SAMPLES

    def add(self, samples: np.ndarray) -> None:
        if len(samples):
            self.audio.append(samples)
            self.num_samples += len(samples)

    def samples(self) -> np.ndarray:
        if len(self.audio) > 1:
            self.audio = [np.concatenate(self.audio)]
        return self.audio[0] if self.audio else np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class _TurnEnd:
    final: bool
    by_commit: bool = True


@dataclass(frozen=True)
class _TurnCheck:
    """semantic_vad: after the pause's final pass, ask whether the words so far end the turn."""

    speech_end: int  # the pause's start (stream index): the turn ends there if they do


@dataclass(frozen=True)
class _Mark:
    kind: str  # "commit" | "clear"
    final: bool = False


class QueuedInput:
    """The recognisers' shared front (this module's LiveTranscriber, rill.speech.causal_live's): audio and
    marks queue in `_incoming` for the recogniser's own task, and a client waits for room while the backlog
    is past `config.max_backlog_s`. A subclass sets `_incoming`, `_ready`, `_progress`, `failed` and `config`,
    and says what `backlog_s` is."""

    def commit(self, final: bool = False) -> None:
        """The turn ends here (manual commit): its segment closes and its transcript completes."""
        self._push(_Mark("commit", final))

    def clear(self) -> None:
        """Forget the audio not yet transcribed and the turn so far."""
        self._push(_Mark("clear"))

    async def wait_for_room(self) -> None:
        while self.backlog_s > self.config.max_backlog_s and not self.failed:
            await self._progress.wait()

    def _push(self, item) -> None:
        self._incoming.append(item)
        self._ready.set()

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()


class LiveTranscriber(QueuedInput):
    """One live stream's recogniser; `run` it in a nursery, feed it from the trio thread."""

    def __init__(self, speech, config: LiveConfig, emit: Callable[[LiveEvent], None],
                 turn_end: TurnEndScorer | None = None):
        self.speech = speech  # AsyncSpeechEngine
        self.config = config
        self._emit = emit
        self._turn_end = turn_end  # semantic_vad's scorer (None: the cap of silence ends every turn)
        runtime = speech.core.runtime
        self._tokenizer = runtime.tokenizer
        self.window_samples = speech.core.features.config.n_samples
        self._vad = VoiceActivity(config.turn_detection, self._pause_ms(config))
        self._in_turn = False  # a turn was announced (SpeechStarted) and has not ended
        self._scored: tuple[str, float | None] | None = None  # semantic_vad: the latest words asked about
        # semantic_vad: the turn's segment closed at its latest pause and the audio since, which speech
        # resuming in the same turn continues (see _continue_segment)
        self._resumable: _Segment | None = None
        self._gap: list[np.ndarray] = []
        self._incoming: deque[np.ndarray | _Mark] = deque()
        self._num_incoming = 0
        self._ready, self._work, self._progress = trio.Event(), trio.Event(), trio.Event()
        self._recent = np.zeros(0, dtype=np.float32)  # the latest audio outside a segment (prefix padding)
        self._open: _Segment | None = None
        self._closed: deque[_Segment | _TurnEnd] = deque()
        self._generation = 0  # bumped by clear: results of passes begun before it are dropped
        self._interim_scope: trio.CancelScope | None = None  # the interim pass in flight
        self._turn_words: list[str] = []
        self._heard_any = False  # words were emitted in an earlier turn (TranscriptDelta.gap)
        self._turn_samples = 0
        self._num_labelled = 0  # samples through the VAD
        self._num_routed = 0  # samples placed in a segment or in _recent
        self.num_samples = 0  # fed so far
        self.num_passes = 0
        self.num_final_passes = 0
        self.failed = False

    @staticmethod
    def _pause_ms(config: LiveConfig) -> int:
        turn = config.turn_detection
        return min(config.pause_ms, CHECK_PAUSE_MS) if turn is not None and turn.is_semantic else config.pause_ms

    @property
    def _semantic(self) -> bool:
        return self.config.turn_detection is not None and self.config.turn_detection.is_semantic

    # -- trio side: non-blocking input ---------------------------------------------------------------

    @property
    def backlog_s(self) -> float:
        """Audio taken but not yet worked through: not yet labelled, or in closed segments that wait for
        their final pass. The open segment is not counted: the model's window bounds it, and it only
        closes when more audio comes (counting it, a full window would wait for room forever)."""
        pending = sum(s.num_samples for s in self._closed if isinstance(s, _Segment))
        return (self._num_incoming + pending) / SAMPLE_RATE

    def feed(self, samples: np.ndarray) -> None:
        """16 kHz mono float32, in stream order."""
        self._push(np.asarray(samples, dtype=np.float32))
        self._num_incoming += len(samples)
        self.num_samples += len(samples)

    # -- tasks --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Label audio and run passes until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._label_loop)
            await self._pass_loop()
            nursery.cancel_scope.cancel()

    async def _label_loop(self) -> None:
        while True:
            await self._ready.wait()
            self._ready = trio.Event()
            while self._incoming:
                item = self._incoming.popleft()
                if isinstance(item, _Mark):
                    self._mark(item)
                else:
                    events = await trio.to_thread.run_sync(self._vad.feed, item)
                    self._num_incoming -= len(item)
                    self._take(item, events)
                self._work.set()
                self._signal_progress()

    async def _pass_loop(self) -> None:
        while not self.failed:
            job = self._next_job()
            if job is None:
                await self._work.wait()
                self._work = trio.Event()
                continue
            try:
                await job
            except RillError as exc:  # the speech engine died or refused: one event, then nothing more
                self.failed = True
                self._emit(SpeechFailed(str(exc)))
            self._signal_progress()

    # -- labelled audio into segments -------------------------------------------------------------------

    def _take(self, samples: np.ndarray, events: list[VadEvent]) -> None:
        """`samples` (stream indices [end - len, end)) with the VAD's events in them."""
        start = self._num_labelled
        end = self._num_labelled = start + len(samples)
        cursor = start
        for event in events:
            at = min(max(event.at_sample, cursor), end)
            self._route(samples[cursor - start:at - start], cursor)
            cursor = at
            self._on_activity(event)
        self._route(samples[cursor - start:], cursor)
        if self._open is not None:
            self._open.speech_end = max(self._vad.speech_end, self._open.start)
        self._cut_if_full()

    def _route(self, piece: np.ndarray, at: int) -> None:
        self._num_routed = at + len(piece)
        if self._open is not None:
            self._open.add(piece)
            return
        if self._resumable is not None:
            self._gap.append(piece)
        keep = self._padding_samples()  # the audio right before `at + len(piece)`, for an onset there
        self._recent = np.concatenate([self._recent, piece])[-keep:] if keep else self._recent[:0]

    def _padding_samples(self) -> int:
        turn = self.config.turn_detection or TurnDetection()
        return turn.prefix_padding_ms * SAMPLE_RATE // 1000

    def _on_activity(self, event: VadEvent) -> None:
        kind = event.kind
        if kind in (Activity.SPEECH_STARTED, Activity.RESUMED):
            self._open_segment(event)
        elif kind is Activity.PAUSED:
            self._close_segment()
            if self._semantic and self._in_turn:
                self._closed.append(_TurnCheck(event.at_sample))
        elif kind is Activity.SPEECH_STOPPED and self.config.turn_detection is not None and self._in_turn:
            self._stop_turn(event.at_sample)

    def _stop_turn(self, speech_end: int) -> None:
        """The detector's end of the turn: SpeechStopped now, the transcript once its passes are done."""
        self._in_turn = False
        self._resumable, self._gap = None, []
        self._emit(SpeechStopped(speech_end * 1000 // SAMPLE_RATE))
        self._closed.append(_TurnEnd(final=False, by_commit=False))

    def _open_segment(self, event: VadEvent) -> None:
        pad, self._recent = self._recent, self._recent[:0]  # it ends where the onset was routed
        segment = self._continue_segment() if event.kind is Activity.RESUMED else None
        if segment is None:
            segment = _Segment(start=self._num_routed - len(pad))
            segment.add(pad.copy())
        self._resumable, self._gap = None, []
        self._open = segment
        # After a semantic end of turn the VAD still holds its turn (until the cap): speech then starts a new one.
        if not self._in_turn and self.config.turn_detection is not None:
            self._in_turn = True
            self._emit(SpeechStarted(segment.start * 1000 // SAMPLE_RATE))

    def _continue_segment(self) -> _Segment | None:
        """semantic_vad waits through pauses, and a recogniser trained on whole utterances hears the words
        after one badly on their own ("thirty?" alone came out as "Reverse Number of letters"): speech that
        resumes in the same turn continues the paused segment, its audio and the silence since in front
        and its words forced as the prefix, while that leaves at least a second of the model's window."""
        previous = self._resumable
        if previous is None or not self._in_turn:
            return None
        gap = sum(len(piece) for piece in self._gap)
        limit = self.window_samples - int((WINDOW_MARGIN_S + 1.0) * SAMPLE_RATE)
        if previous.num_samples + gap > limit:
            return None
        segment = _Segment(start=previous.start, agreement=previous.agreement, speech_end=previous.speech_end,
                           num_reused_samples=previous.num_samples)
        segment.add(previous.samples())
        for piece in self._gap:
            segment.add(piece)
        return segment

    def _close_segment(self) -> None:
        if self._open is not None:
            if self._semantic:
                self._resumable, self._gap = self._open, []
            self._closed.append(self._open)
            self._open = None
            covers = self._closed[-1].start + self._closed[-1].num_passed_samples >= \
                self._closed[-1].speech_end + COVER_SAMPLES
            if self._interim_scope is not None and not covers:
                self._interim_scope.cancel()  # it did not hear the end: the final pass will, starting now

    def _cut_if_full(self) -> None:
        """A segment about to fill the model's window closes at its quietest point near the end; the
        audio after that point opens the next segment."""
        segment = self._open
        limit = self.window_samples - int(WINDOW_MARGIN_S * SAMPLE_RATE)
        if segment is None or segment.num_samples < limit:
            return
        audio = segment.samples()
        cut = quietest_sample(audio, max(0, len(audio) - int(CUT_SEARCH_S * SAMPLE_RATE)))
        cut = min(cut, limit)
        head = _Segment(start=segment.start, agreement=segment.agreement,
                        num_reused_samples=min(segment.num_reused_samples, cut))
        head.add(audio[:cut])
        self._closed.append(head)
        rest = _Segment(start=segment.start + cut)
        rest.add(audio[cut:].copy())
        self._open = rest

    def _mark(self, mark: _Mark) -> None:
        if mark.kind == "clear":
            self._generation += 1
            self._open, self._closed = None, deque()
            self._turn_words, self._turn_samples = [], 0
            self._resumable, self._gap = None, []
            return
        self._close_segment()
        self._resumable, self._gap = None, []  # the commit ended the turn: what follows is not its continuation
        self._closed.append(_TurnEnd(final=mark.final))

    # -- passes -------------------------------------------------------------------------------------

    def _next_job(self):
        if self._closed:
            item = self._closed.popleft()
            if isinstance(item, _TurnCheck):
                return self._check_turn(item)
            return self._end_turn(item) if isinstance(item, _TurnEnd) else self._final_pass(item)
        segment = self._open
        if segment is None or segment.num_samples < self.config.min_interim_s * SAMPLE_RATE:
            return None
        new = segment.num_samples - segment.num_passed_samples
        unheard_end = segment.speech_has_paused and segment.start + segment.num_passed_samples < \
            segment.speech_end + COVER_SAMPLES
        if new < self.config.pass_interval_s * SAMPLE_RATE and not unheard_end:
            return None  # nothing new enough, unless speech just paused: then a pass hears its end now
        return self._interim_pass(segment)

    async def _interim_pass(self, segment: _Segment) -> None:
        """A pass over the open segment so far. Its segment closing meanwhile cancels it (the speech
        worker drops the request): the final pass, which then starts at once, hears more."""
        generation, audio = self._generation, segment.samples()
        segment.num_passed_samples = len(audio)
        with trio.CancelScope() as scope:
            self._interim_scope = scope
            text = await self._decode(audio, segment.agreement.prefix)
        self._interim_scope = None
        if scope.cancelled_caught or generation != self._generation:
            return
        segment.num_heard_samples = len(audio)
        self._commit(segment.agreement.insert(text, speaking=not segment.heard_all_speech))
        if self._semantic and segment.heard_all_speech:
            await self._prescore(segment)

    async def _prescore(self, segment: _Segment) -> None:
        """The pass heard the speech up to the pause: its words will be the final ones (rill.speech.live's
        final pass is skipped), so the end-of-turn question is asked now and the check at the pause finds
        its answer ready."""
        text = _words("".join(self._turn_words) + segment.agreement.unconfirmed)
        if text and self._turn_end is not None and (self._scored is None or self._scored[0] != text):
            generation = self._generation
            probability = await self._turn_end(text)
            if generation == self._generation:
                self._scored = (text, probability)

    async def _final_pass(self, segment: _Segment) -> None:
        generation, audio = self._generation, segment.samples()
        if segment.heard_all_speech:  # the last interim pass heard it all: its words are the final ones
            text = segment.agreement.unconfirmed
        else:
            text = await self._decode(audio, segment.agreement.prefix)
            self.num_final_passes += 1
        if generation == self._generation:
            self._turn_samples += len(audio) - segment.num_reused_samples
            self._commit(segment.agreement.finish(text))

    async def _check_turn(self, check: _TurnCheck) -> None:
        """semantic_vad at a pause: the turn ends at the pause when its words sound finished and the
        speaker is still silent once the model has answered; otherwise the cap (the VAD) ends it."""
        text = _words("".join(self._turn_words))
        if not text or self._turn_end is None or not self._still_paused():
            return
        generation = self._generation
        ready = self._scored is not None and self._scored[0] == text
        probability = self._scored[1] if ready else await self._turn_end(text)
        if generation == self._generation and self._still_paused() and ends_turn(
                self.config.turn_detection.eagerness, probability):
            self._stop_turn(check.speech_end)

    def _still_paused(self) -> bool:
        """No speech since the pause (no segment open) and the turn not yet ended."""
        return self._in_turn and self._open is None

    async def _end_turn(self, end: _TurnEnd) -> None:
        text = "".join(self._turn_words).strip()
        audio_s = self._turn_samples / SAMPLE_RATE
        self._turn_words, self._turn_samples, self._scored = [], 0, None
        self._emit(TranscriptDone(text, audio_s, end.final, end.by_commit))

    def _commit(self, words: list[str]) -> None:
        if not words:
            return
        text, gap = "".join(words), ""
        if not self._turn_words:  # a turn's first words: their space is the gap after an earlier turn
            stripped = text.lstrip()
            gap, text = text[: len(text) - len(stripped)] if self._heard_any else "", stripped
        self._turn_words += words
        if text:
            self._emit(TranscriptDelta(text, gap))
            self._heard_any = True

    async def _decode(self, audio: np.ndarray, prefix: str) -> str:
        """One pass through the speech worker -> the text after `prefix`, its leading space kept."""
        self.num_passes += 1
        seconds = len(audio) / SAMPLE_RATE
        params = TranscribeParams(language=self.config.language, prompt=self.config.prompt, prefix=prefix or None,
                                  max_new_tokens=MIN_TOKENS + math.ceil(TOKENS_PER_S * seconds))
        async for delta in self.speech.transcribe(audio[:self.window_samples], params):
            if delta.finished is not None:
                return self._tokenizer.decode(delta.finished.token_ids)
        raise RillError("the speech engine ended a pass without a transcription")


def _words(text: str) -> str:
    return " ".join(text.split())
