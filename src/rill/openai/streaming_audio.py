"""Spoken chunks in Mode A and Mode B: `{"modality": "audio", "payload": base64 PCM16, "sample_rate": N}`
transcribed as they arrive by the served speech model, the words fed to the prompt like text chunks.

One LiveTranscriber (rill.speech.live, or a causal model's: rill.speech.causal_live) per run, started
with its first audio chunk:
- `respond_at_end` (default): no turn detection; final words are appended to the prompt as they are
  recognised (prefilled while the audio still arrives). End of input commits the audio, and the
  answer starts once the last words are in (its final pass is the only wait).
- `respond_per_chunk`: server VAD; each spoken turn, once its transcript is complete, is one chunk
  and is answered at once, as a text chunk would be.
A text or tokens chunk after audio waits until the audio before it is final (a commit ends it), so
the prompt keeps the chunks' order. A Mode A body is read no faster than its audio is recognised
(`wait_for_room`); a Mode B chunk past the backlog is 429 `rate_limited`.
"""

from __future__ import annotations

import base64
import binascii
from collections import deque

import numpy as np
import trio

from rill.sessions.chunks import InputChunk, Modality
from rill.sessions.errors import SessionError, UnsupportedModality
from rill.speech.audio import AudioError, pcm16_to_float, to_mono_16k
from rill.speech.causal_live import CausalLiveTranscriber, live_transcriber
from rill.speech.live import LiveConfig, LiveEvent, SpeechFailed, TranscriptDelta, TranscriptDone
from rill.speech.vad import TurnDetection

DEFAULT_RATE_HZ = 16_000


class RateLimited(SessionError):
    status = 429
    code = "rate_limited"


def decode_audio_chunk(chunk: InputChunk) -> np.ndarray:
    """A chunk's base64 PCM16 at its sample_rate -> 16 kHz mono float32; AudioError (400) when malformed."""
    samples, rate = chunk_audio(chunk)
    return to_mono_16k(samples, rate)


def chunk_audio(chunk: InputChunk) -> tuple[np.ndarray, int]:
    """A chunk's base64 PCM16 -> (float32 samples as sent, their rate); AudioError (400) when malformed."""
    try:
        raw = base64.b64decode(chunk.payload, validate=True)
    except (binascii.Error, ValueError):
        raise AudioError("an audio chunk's payload must be base64 PCM16", param="payload") from None
    try:
        samples = pcm16_to_float(raw)
    except AudioError as exc:
        raise AudioError(exc.message, param="payload") from None
    return samples, chunk.sample_rate or DEFAULT_RATE_HZ


class RunAudio:
    """The audio side of one StreamRun; `run` is the StreamRun whose prompt the words join."""

    def __init__(self, run, speech, per_chunk: bool):
        self.run = run
        self.per_chunk = per_chunk
        turn = TurnDetection() if per_chunk else None
        self.live = live_transcriber(speech, LiveConfig(turn_detection=turn), self._on_event)  # Whisper or causal
        self.scope = trio.CancelScope()
        self.waiting: deque[InputChunk] = deque()  # chunks after audio not yet final, in order
        self.num_open_commits = 0
        self.has_uncommitted = False
        self.finish_pending = False
        self.transcript = ""  # every word recognised so far (Mode B's session status shows it)
        self.turn_opens = True  # the next delta is a turn's first
        run.manager.start_soon(self._run)

    async def _run(self) -> None:
        with self.scope:
            await self.live.run()

    def close(self) -> None:
        self.scope.cancel()

    @property
    def is_settled(self) -> bool:
        """No audio in flight: what comes next may go straight to the prompt."""
        return not (self.has_uncommitted or self.num_open_commits or self.waiting)

    def check_room(self) -> None:
        if self.live.backlog_s > self.live.config.max_backlog_s:
            raise RateLimited(f"{self.live.backlog_s:.1f} s of audio wait to be recognised (at most "
                              f"{self.live.config.max_backlog_s:g}); send audio no faster than it is recognised",
                              param="payload")

    def take(self, chunk: InputChunk) -> None:
        """A chunk in sequence order, once audio has been seen in this run."""
        if self.waiting or (chunk.modality is not Modality.AUDIO and not self.is_settled):
            self._hold(chunk)
        elif chunk.modality is Modality.AUDIO:
            self._feed(chunk)
        else:
            self.run._apply(chunk)

    def finish(self) -> bool:
        """End of input: True when it must wait for the audio (then the run finishes from here)."""
        if self.is_settled:
            return False
        self.finish_pending = True
        self._commit(final=True)
        return True

    def _feed(self, chunk: InputChunk) -> None:
        samples, rate = chunk_audio(chunk)
        samples_16k = to_mono_16k(samples, rate)
        if isinstance(self.live, CausalLiveTranscriber):  # its model may hear at the rate sent (Kyutai: 24 kHz)
            self.live.feed(samples_16k, samples, rate)
        else:
            self.live.feed(samples_16k)
        self.has_uncommitted = True

    def _hold(self, chunk: InputChunk) -> None:
        self._commit()
        self.waiting.append(chunk)

    def _commit(self, final: bool = False) -> None:
        if self.has_uncommitted:
            self.has_uncommitted = False
            self.num_open_commits += 1
            self.live.commit(final)

    # -- recogniser events ---------------------------------------------------------------------------

    def _on_event(self, event: LiveEvent) -> None:
        try:
            self._handle(event)
        except Exception:  # noqa: BLE001 - the run's _guard has failed the session and recorded why
            self.close()

    def _handle(self, event: LiveEvent) -> None:
        run = self.run
        if isinstance(event, TranscriptDelta):
            self.transcript += self._spaced(event.text, self.transcript, self.turn_opens)
        if isinstance(event, TranscriptDelta) and not self.per_chunk:
            run._guard(lambda: run._apply(InputChunk(payload=self._spaced(event.text, run.text, self.turn_opens))))
        if isinstance(event, TranscriptDelta):
            self.turn_opens = False
        elif isinstance(event, TranscriptDone):
            self.turn_opens = True
            if self.per_chunk and event.text:
                run._guard(lambda: run._apply(InputChunk(payload=event.text)))
            if event.by_commit:
                self.num_open_commits -= 1
                self._drain()
        elif isinstance(event, SpeechFailed):
            run._guard(lambda: _raise(UnsupportedModality(f"speech recognition failed: {event.message}",
                                                          param="payload", code="speech_failed")))

    @staticmethod
    def _spaced(text: str, before: str, turn_opens: bool) -> str:
        """A turn's first words start without a space: one goes between them and text before them. Later
        deltas are taken as they come (a causal model may end a delta inside a word)."""
        if turn_opens and before and not before[-1].isspace() and text and not text[0].isspace():
            return " " + text
        return text

    def _drain(self) -> None:
        """The audio before the waiting chunks is final: apply them (until the next audio among them)."""
        while self.waiting and not self.num_open_commits:
            chunk = self.waiting.popleft()
            if chunk.modality is Modality.AUDIO:
                self._feed(chunk)
            elif self.has_uncommitted:
                self.waiting.appendleft(chunk)
                self._commit()
            else:
                self.run._guard(lambda chunk=chunk: self.run._apply(chunk))
        if self.finish_pending and self.is_settled:
            self.run._guard(self.run._finish_input)
        elif self.finish_pending and not self.num_open_commits:
            self._commit(final=True)


def _raise(exc: Exception) -> None:
    raise exc
