"""The speech-out worker: one thread owns the voice (a VoiceBackend) and synthesizes the next clause of
every request that has one, in one batched call; trio tasks hand it clauses and get audio back.

    async with open_speech_out(EspeakBackend()) as out:
        async for frames in out.speak(clauses, voice="alloy", speed=1.0):   # clauses: AsyncIterable[str]
            ...   # float32 mono at out.backend.sample_rate, one array per clause, in order

The clauses of a request are read by a task of the worker's own nursery while its audio is being made,
so a clause that arrives while the previous one is still speaking is queued at once (text streaming in
from an LLM or a caption feed). Leaving the loop early, or being cancelled, aborts the request: its
queued clauses are dropped and nothing of it stays on either side. The same bridge shape as the speech-in
worker (rill.speech.async_speech): a thread-safe inbox in, rill.engine.outbox out; a separate thread
from both other workers, because a clause must not wait behind an LLM prefill or a Whisper window.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import numpy as np
import trio

from rill.engine.outbox import Outbox
from rill.errors import EngineDeadError
from rill.tts.backend import Utterance, VoiceBackend

log = logging.getLogger("rill.tts")


class Say(msgspec.Struct, frozen=True):
    request_id: int
    utterance: Utterance


class Forget(msgspec.Struct, frozen=True):
    request_id: int


class Shutdown(msgspec.Struct, frozen=True):
    pass


class Spoken(msgspec.Struct, frozen=True):
    """Worker -> trio: one clause's audio, or the error that stopped it."""

    request_id: int
    audio: np.ndarray | None = None
    error: BaseException | None = None


_SOURCE_DONE = object()  # the clause source is exhausted (sent by the pump on the request's own channel)


class SpeechOut:
    """Trio-side handle of the speech-out worker. `speak` is the whole API."""

    def __init__(self, backend: VoiceBackend, trio_token: trio.lowlevel.TrioToken, nursery: trio.Nursery):
        self.backend = backend
        self._nursery = nursery
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[int, trio.MemorySendChannel] = {}
        self._pumps: dict[int, trio.CancelScope] = {}  # the task reading each request's clauses
        self._ids = itertools.count()
        self._outbox = Outbox(trio_token, self._drain)
        self._token = trio_token
        self.dead: BaseException | None = None
        # Worker-side state (the worker thread alone touches these):
        self._queues: dict[int, deque[Utterance]] = {}
        self.num_calls = 0  # synthesize calls made
        self.audio_seconds = 0.0  # audio made, all requests together
        self.busy_seconds = 0.0  # wall time inside synthesize

    @property
    def num_requests(self) -> int:
        """Requests the trio side is waiting on (0 when idle: nothing leaks)."""
        return len(self._streams)

    @property
    def num_queued(self) -> int:
        """Requests the worker holds clauses for (an int read across threads: a snapshot)."""
        return len(self._queues)

    async def speak(self, clauses: AsyncIterable[str], *, voice: str, speed: float = 1.0
                    ) -> AsyncIterator[np.ndarray]:
        """Audio for each clause of `clauses`, in order, as soon as it is made. `voice` must be one the
        backend resolves (resolve it first to answer a bad name before any audio)."""
        if self.dead is not None:
            raise EngineDeadError(f"the speech-out worker is dead: {self.dead!r}")
        voice = self.backend.resolve_voice(voice)
        request_id = next(self._ids)
        send, recv = trio.open_memory_channel(math.inf)  # bounded by the text: one item per clause
        self._streams[request_id] = send
        pending = 0
        source_done = False
        self._nursery.start_soon(self._pump, request_id, clauses, voice, speed, send.clone())
        try:
            with recv:
                while not (source_done and pending == 0):
                    item = await recv.receive()
                    if item is _SOURCE_DONE:
                        source_done = True
                    elif isinstance(item, int):
                        pending += item  # the pump queued a clause
                    elif isinstance(item, BaseException):
                        raise item
                    elif item.error is not None:
                        raise item.error
                    else:
                        pending -= 1
                        yield item.audio
        finally:
            scope = self._pumps.pop(request_id, None)
            if scope is not None:
                scope.cancel()
            self._forget(request_id)

    async def _pump(self, request_id: int, clauses: AsyncIterable[str], voice: str, speed: float,
                    send: trio.MemorySendChannel) -> None:
        # Reads the caller's clauses while their audio is made; `speak` cancels it when the caller leaves.
        if request_id not in self._streams:
            send.close()
            return  # the caller left before this task started
        with send, trio.CancelScope() as scope:
            self._pumps[request_id] = scope
            try:
                async for clause in clauses:
                    if clause and clause.strip():
                        send.send_nowait(1)  # counted before the worker can answer it
                        self._send(Say(request_id, Utterance(clause, voice, speed)))
                send.send_nowait(_SOURCE_DONE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the caller left
            except Exception as exc:  # the source failed: the caller sees its error
                try:
                    send.send_nowait(exc)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            finally:
                self._pumps.pop(request_id, None)

    def _forget(self, request_id: int) -> None:
        send = self._streams.pop(request_id, None)
        if send is not None:
            send.close()
            self._send(Forget(request_id))

    def _send(self, msg) -> None:
        self._inbox.put(msg)
        self._wake.set()

    def _drain(self, batches: list[list[Spoken]]) -> None:
        # Trio thread: everything the worker posted since the last drain, in order.
        for batch in batches:
            for spoken in batch:
                send = self._streams.get(spoken.request_id)
                if send is not None:
                    try:
                        send.send_nowait(spoken)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        self._forget(spoken.request_id)

    def _fail_all(self, error: BaseException) -> None:
        self.dead = error
        for request_id, send in list(self._streams.items()):
            try:
                send.send_nowait(Spoken(request_id, error=EngineDeadError(f"speech-out worker failed: {error!r}")))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    # -- worker thread -----------------------------------------------------------------------------

    def run_worker(self) -> None:
        try:
            while self._apply_inbox():
                batch = self._next_batch()
                if batch:
                    self._post(self._synthesize(batch))
                else:
                    self._wake.wait()
                    self._wake.clear()
        except BaseException as exc:  # never leave a caller hanging
            log.exception("speech-out worker died")
            self._token.run_sync_soon(self._fail_all, exc)

    def _apply_inbox(self) -> bool:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if isinstance(msg, Shutdown):
                return False
            if isinstance(msg, Forget):
                self._queues.pop(msg.request_id, None)
            else:
                self._queues.setdefault(msg.request_id, deque()).append(msg.utterance)

    def _next_batch(self) -> list[tuple[int, Utterance]]:
        """The head clause of each request, oldest request first, up to the backend's max_batch; the
        requests served go to the back so that a long text does not starve a new one."""
        batch = []
        for request_id in list(self._queues)[: max(1, self.backend.max_batch)]:
            pending = self._queues.pop(request_id)
            batch.append((request_id, pending.popleft()))
            if pending:
                self._queues[request_id] = pending  # to the back of the line
        return batch

    def _synthesize(self, batch: list[tuple[int, Utterance]]) -> list[Spoken]:
        started = time.perf_counter()
        try:
            audio = self.backend.synthesize([u for _, u in batch])
        except Exception as exc:  # a bad clause fails its requests alone; the voice goes on
            if len(batch) > 1:
                return [spoken for item in batch for spoken in self._synthesize([item])]
            log.warning("speech-out: synthesis failed: %r", exc)
            return [Spoken(batch[0][0], error=exc)]
        self.num_calls += 1
        self.busy_seconds += time.perf_counter() - started
        self.audio_seconds += sum(a.size for a in audio) / self.backend.sample_rate
        return [Spoken(rid, audio=np.asarray(a, dtype=np.float32)) for (rid, _), a in zip(batch, audio, strict=True)]

    def _post(self, items: list[Spoken]) -> None:
        self._outbox.post(items)

    def shutdown(self) -> None:
        self._send(Shutdown())


@asynccontextmanager
async def open_speech_out(backend: VoiceBackend) -> AsyncIterator[SpeechOut]:
    """Run the speech-out worker thread for the block's duration."""
    async with trio.open_nursery() as nursery:
        out = SpeechOut(backend, trio.lowlevel.current_trio_token(), nursery)
        nursery.start_soon(lambda: trio.to_thread.run_sync(out.run_worker, limiter=trio.CapacityLimiter(1)))
        try:
            yield out
        finally:
            out.shutdown()
            nursery.cancel_scope.cancel()  # the pumps of requests still open; the thread ends on Shutdown
