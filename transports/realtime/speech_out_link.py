"""A realtime connection's voice on the server's speech-out worker (rill.tts.worker): one task per
spoken answer in the connection's nursery, whose clauses' audio joins the connection's inbox in order.

The answer's text arrives in engine deltas; `feed` cuts it into clauses (rill.tts.clauses) and hands
each complete one to the worker at once, so the voice starts at the first clause boundary while the
model is still writing. The worker gives back one clip per clause, in order: `ClauseSpoken` pairs
each clip with its clause's text (the transcript piece sent with it), and `SpeechOutEnded` follows
the last. `cancel` stops an answer (barge-in, response.cancel): nothing more of it reaches the inbox.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import msgspec
import numpy as np
import trio

from rill.errors import RillError
from rill.tts.clauses import ClauseSplitter

log = logging.getLogger("rill.realtime")


class ClauseSpoken(msgspec.Struct, frozen=True):
    """One clause of answer `key`, and its audio (float32 mono at the voice's rate)."""

    key: str
    text: str
    samples: np.ndarray


class SpeechOutEnded(msgspec.Struct, frozen=True):
    """Answer `key` is all spoken (error: the reason it could not be)."""

    key: str
    error: str | None = None


SPEECH_OUT_EVENTS = (ClauseSpoken, SpeechOutEnded)


class _Answer:
    def __init__(self, send: trio.MemorySendChannel):
        self.send = send
        self.splitter = ClauseSplitter()
        self.texts: deque[str] = deque()  # clauses handed to the worker, not yet spoken
        self.scope = trio.CancelScope()


class SpeechOutLink:
    """`out`: the server's one speech-out worker (rill.tts.worker's `open_speech_out`), shared by every
    connection; each call here returns at once."""

    def __init__(self, out, nursery: trio.Nursery, inbox: trio.MemorySendChannel):
        self.out = out
        self._nursery, self._inbox = nursery, inbox
        self._answers: dict[str, _Answer] = {}

    @property
    def backend(self):
        return self.out.backend

    @property
    def sample_rate(self) -> int:
        return self.out.backend.sample_rate

    def resolve_voice(self, voice: str) -> str:
        """The backend's id for a voice name; rill.tts.backend.UnknownVoice if it has none."""
        return self.out.backend.resolve_voice(voice)

    def start(self, key: str, voice: str, speed: float) -> None:
        send, recv = trio.open_memory_channel(math.inf)  # bounded by the answer's clauses
        answer = self._answers[key] = _Answer(send)
        self._nursery.start_soon(self._run, key, answer, recv, voice, speed)

    def feed(self, key: str, text: str) -> None:
        answer = self._answers.get(key)
        if answer is not None:
            self._hand_over(answer, answer.splitter.feed(text))

    def finish(self, key: str) -> None:
        """The answer's text is complete: its last clause goes, and the answer ends once it is spoken."""
        answer = self._answers.get(key)
        if answer is not None:
            self._hand_over(answer, answer.splitter.finish())
            answer.send.close()

    def cancel(self, key: str) -> None:
        answer = self._answers.pop(key, None)
        if answer is not None:
            answer.scope.cancel()
            answer.send.close()

    def close(self) -> None:
        for key in list(self._answers):
            self.cancel(key)

    def _hand_over(self, answer: _Answer, clauses: list[str]) -> None:
        for clause in clauses:
            answer.texts.append(clause)
            answer.send.send_nowait(clause)

    async def _run(self, key: str, answer: _Answer, recv: trio.MemoryReceiveChannel, voice: str,
                   speed: float) -> None:
        with answer.scope:
            error = None
            try:
                async with recv:
                    async for samples in self.out.speak(recv, voice=voice, speed=speed):
                        await self._inbox.send(ClauseSpoken(key, answer.texts.popleft(), samples))
            except (RillError, ValueError) as exc:  # the voice failed: the answer ends with what was said
                log.warning("speech out failed for %s: %s", key, exc)
                error = str(exc)
            self._answers.pop(key, None)
            await self._inbox.send(SpeechOutEnded(key, error))
