"""The trio bridge: one worker thread owns EngineCore; trio tasks talk to it through a
thread-safe inbox and get each step's outputs back in one cross-thread call.

    async with rill.open_engine(EngineConfig()) as engine:
        async for delta in engine.generate(prompt_ids, params):
            ...
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import trio

from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.engine.delta_stream import DeltaStream
from rill.engine.outbox import Outbox
from rill.errors import EngineDeadError, RillError
from rill.outputs import RequestDelta, coalesce, merge_deltas
from rill.sampling_params import SamplingParams

# Request ids ("req-N") come from one counter for every engine in the process, so that with several
# models served (rill.model_set) a response id such as chatcmpl-req-7 and its log line name one request.
_REQUEST_IDS = itertools.count()

log = logging.getLogger("rill.engine")

# What a queued delta costs in memory, roughly (tracemalloc: a one-token delta with a short text is
# about 300 bytes): the price of what waits for a reader (EngineConfig.max_stream_buffer_bytes).
DELTA_BYTES = 200
TOKEN_BYTES = 72  # an int and its list slot
LOGPROB_BYTES = 256  # a TokenLogprob with a few alternatives

BRAKE_TIMEOUT_S = 1.0  # the longest the worker waits for trio to take its steps (EngineConfig.max_steps_ahead)


SLOW_READER_ERROR = ("the client read the output too slowly: more than --max-stream-buffer-bytes of it waited "
                     "to be sent, and the request was aborted")


def delta_bytes(delta: RequestDelta) -> int:
    """About what a queued delta holds in memory."""
    size = DELTA_BYTES + len(delta.text) + TOKEN_BYTES * len(delta.token_ids)
    return size if delta.logprobs is None else size + LOGPROB_BYTES * len(delta.logprobs)


# Messages into the worker: small frozen structs (STYLE.md principle 6).
class Submit(msgspec.Struct, frozen=True):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    mm_items: tuple = ()  # rill.multimodal.inputs.MultiModalItem, placed in the prompt


class OpenSession(msgspec.Struct, frozen=True):
    request_id: str
    params: SamplingParams
    start_after_tokens: int | None
    respond_per_chunk: bool
    prompt_token_ids: list[int] = []
    mm_items: tuple = ()


class Append(msgspec.Struct, frozen=True):
    request_id: str
    token_ids: list[int]
    mm_items: tuple = ()  # images or video pieces in token_ids (offsets within them)


class Rebase(msgspec.Struct, frozen=True):
    """A live session's context replaced by a shorter one (engine/live_sessions.py)."""

    request_id: str
    token_ids: list[int]
    mm_items: tuple = ()


class FinishInput(msgspec.Struct, frozen=True):
    request_id: str
    max_tokens: int | None = None


class Abort(msgspec.Struct, frozen=True):
    request_id: str


class Shutdown(msgspec.Struct, frozen=True):
    pass


class RankFailed(msgspec.Struct, frozen=True):
    """A tensor-parallel rank died (sent by its monitor thread): the worker raises it and the engine is dead."""

    error: BaseException


class AsyncEngine:
    """Trio-side handle. submit/append/finish/abort are non-blocking and thread-safe."""

    def __init__(self, core: EngineCore, trio_token: trio.lowlevel.TrioToken):
        self.core = core
        self.tokenizer = core.tokenizer
        self._token = trio_token
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, DeltaStream[RequestDelta]] = {}
        self._n: dict[str, int] = {}  # samples per live request
        self._done: dict[str, set[int]] = {}  # finished sample indices per live request
        self._ids = _REQUEST_IDS  # one sequence per process: several models' engines never share an id
        self.dead: BaseException | None = None
        self.died = trio.Event()  # set with `dead`, for whoever must act on it (rill serve exits)
        self.stats = core.snapshot()  # refreshed once per step, read by /metrics
        # Worker -> trio: each step's deltas go to the outbox, and one trio callback at a time
        # drains it. When trio falls behind (a fast model, many streams) the steps that pile up
        # reach trio together, in one call, each sequence's deltas merged into one (coalesce):
        # the callback queue stays one long, and each reader wakes once for several steps' tokens.
        self._outbox = Outbox(trio_token, self._drain)  # batches of (deltas, stats, steps)
        self.num_deliveries = 0  # trio-side callbacks that delivered deltas
        self.num_delivered_steps = 0  # engine steps whose deltas they carried
        # The worker's brake (EngineConfig.max_steps_ahead): it waits, without the GIL, while this
        # many steps' deltas wait for trio; a second at most, so a stalled trio never stalls it for good.
        self.max_steps_ahead = core.config.max_steps_ahead
        self._progress = trio.lowlevel.ParkingLot()  # tasks waiting for live sessions' input progress
        # --stream-interval N (EngineConfig.stream_interval): tokens held back per sequence until N gather
        self.stream_interval = core.config.stream_interval
        self._held: dict[tuple[str, int], RequestDelta] = {}
        self._streaming: set[tuple[str, int]] = set()  # sequences whose first text went out
        # A reader holding more than this of unread output (its client stopped reading) is dropped: the
        # request is aborted, as a disconnect would, and the reader gets an error after what it holds.
        self.max_stream_buffer_bytes = core.config.max_stream_buffer_bytes
        self.num_slow_readers = 0  # requests dropped for it

    # -- trio side ----------------------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        return self.dead is None

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def _send(self, msg) -> None:
        self._inbox.put(msg)
        self._wake.set()

    def _open_stream(self, request_id: str) -> DeltaStream[RequestDelta]:
        if self.dead is not None:
            raise EngineDeadError(f"the engine is dead: {self.dead!r}")
        if request_id in self._streams:
            raise RillError(f"request id {request_id!r} is already live")
        # The engine never blocks on a slow reader: what waits for it is priced, and a reader past
        # max_stream_buffer_bytes is dropped (_deliver).
        stream = self._streams[request_id] = DeltaStream(delta_bytes if self.max_stream_buffer_bytes else None)
        return stream

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, mm_items=()):
        recv = self._open_stream(request_id)
        self._n[request_id] = params.n
        self._send(Submit(request_id, list(prompt_token_ids), params, tuple(mm_items)))
        return recv

    def check_fits(self, num_prompt_tokens: int, max_tokens: int | None) -> int:
        """Length validation before submitting (reads only the engine's immutable limits)."""
        return self.core.check_fits(num_prompt_tokens, max_tokens)

    def open_session(self, request_id, params, *, start_after_tokens=1, respond_per_chunk=False, prompt_token_ids=(),
                     mm_items=()):
        recv = self._open_stream(request_id)
        self._send(OpenSession(request_id, params, start_after_tokens, respond_per_chunk, list(prompt_token_ids),
                               tuple(mm_items)))
        return recv

    def append(self, request_id: str, token_ids: list[int], mm_items=()) -> None:
        """mm_items: images or video pieces among token_ids, their offsets counted within token_ids."""
        self._send(Append(request_id, list(token_ids), tuple(mm_items)))

    def rebase(self, request_id: str, token_ids: list[int], mm_items=()) -> None:
        """Replace a live session's context by a shorter one, prefilled beside it (engine/live_sessions.py)."""
        self._send(Rebase(request_id, list(token_ids), tuple(mm_items)))

    def input_progress(self, request_id: str):
        """The latest InputProgress of a session with images or video (None: none reported)."""
        progress = self.stats.input_progress
        return None if progress is None else progress.get(request_id)

    async def wait_input_progress(self) -> None:
        """Until the engine next reports (a step, or a change while idle), or dies."""
        if self.dead is not None:
            raise EngineDeadError(f"the engine is dead: {self.dead!r}")
        await self._progress.park()

    def finish(self, request_id: str, max_tokens: int | None = None) -> None:
        self._send(FinishInput(request_id, max_tokens))

    def abort(self, request_id: str) -> None:
        """Idempotent. The request's KV is free by the end of the engine's next step."""
        stream = self._streams.pop(request_id, None)
        self._n.pop(request_id, None)
        self._done.pop(request_id, None)
        self._forget_held(request_id)
        if stream is not None:
            stream.end()
        self._send(Abort(request_id))

    async def generate(self, prompt_token_ids, params: SamplingParams, request_id: str | None = None,
                       mm_items=()) -> AsyncIterator[RequestDelta]:
        """Deltas until every sample finishes; leaving early (or cancellation) aborts. mm_items: the
        prompt's images and videos, placed by the model's processor (engine.core.mm_inputs.expand)."""
        request_id = request_id or self.new_request_id()
        recv = self.submit(request_id, prompt_token_ids, params, mm_items)
        try:
            with recv:  # sync close: no checkpoint between closing and aborting
                async for delta in recv:
                    yield delta
        finally:
            self.abort(request_id)

    def _post(self, deltas: list[RequestDelta], stats, steps: int = 1) -> None:
        """Worker thread: one step's deltas (steps=0: a snapshot alone) for the trio thread."""
        self._outbox.post((deltas, stats, steps))

    def _drain(self, batches: list[tuple[list[RequestDelta], object, int]]) -> None:
        # Runs in the trio thread: everything posted since the last drain, in one delivery.
        deltas = [delta for batch, _, _ in batches for delta in batch]
        steps = sum(n for _, _, n in batches)
        self.num_delivered_steps += steps
        self.num_deliveries += bool(deltas or steps)  # a snapshot alone (an idle engine's abort) is no delivery
        self._deliver(coalesce(deltas) if steps > 1 else deltas, batches[-1][1])

    def _deliver(self, deltas: list[RequestDelta], stats) -> None:
        # Runs in the trio thread, once per drain (one or more engine steps).
        self.stats = stats
        if self._progress:
            self._progress.unpark_all()
        if self.stream_interval > 1:
            deltas = self._hold(deltas)
        streams = self._streams
        for delta in deltas:
            stream = streams.get(delta.request_id)
            if stream is None:
                continue  # aborted on this side already
            if not stream.put(delta):
                self.abort(delta.request_id)  # the reader left without aborting
                continue
            if self.max_stream_buffer_bytes and stream.num_bytes > self.max_stream_buffer_bytes:
                self._drop_slow_reader(delta.request_id, stream)
                continue
            if delta.error is not None or (delta.finished and self._all_done(delta)):
                streams.pop(delta.request_id).end()
                self._n.pop(delta.request_id, None)
                self._done.pop(delta.request_id, None)
                self._forget_held(delta.request_id)

    def _drop_slow_reader(self, request_id: str, stream: DeltaStream[RequestDelta]) -> None:
        """Abort a request whose reader fell too far behind; it reads what it holds, then an error."""
        self.num_slow_readers += 1
        log.warning("%s: dropped, %d bytes of its output waited for a reader (max_stream_buffer_bytes %d)",
                    request_id, stream.num_bytes, self.max_stream_buffer_bytes)
        stream.put(RequestDelta(request_id, 0, [], "", finish_reason="abort", error=SLOW_READER_ERROR))
        self.abort(request_id)  # ends the stream after that error

    def _hold(self, deltas: list[RequestDelta]) -> list[RequestDelta]:
        """--stream-interval N: what goes out now. A sequence's tokens go at once until the first
        that brings text (time to first token is untouched), then in groups of at least N; whatever
        ends the request or its turn, or fails, goes at once with everything held before it. A delta
        without tokens passes unless tokens are held."""
        out = []
        for delta in deltas:
            if delta.request_id not in self._streams:
                continue  # aborted on this side already: nothing of it is kept
            key = (delta.request_id, delta.index)
            held = self._held.pop(key, None)
            if held is not None:
                delta = merge_deltas(held, delta)
            ends = delta.finish_reason is not None or delta.turn_finish_reason is not None or delta.error is not None
            if (ends or not delta.token_ids or key not in self._streaming
                    or len(delta.token_ids) >= self.stream_interval):
                out.append(delta)
                if ends:
                    self._streaming.discard(key)  # a session's next answer starts at once too
                elif delta.text:  # a token that is part of a character brings no text yet: not the first
                    self._streaming.add(key)
            else:
                self._held[key] = delta
        return out

    def _forget_held(self, request_id: str) -> None:
        if self._held or self._streaming:
            for key in [k for k in (*self._held, *self._streaming) if k[0] == request_id]:
                self._held.pop(key, None)
                self._streaming.discard(key)

    def _all_done(self, delta: RequestDelta) -> bool:
        done = self._done.setdefault(delta.request_id, set())
        done.add(delta.index)
        return len(done) >= self._n.get(delta.request_id, 1)

    def _fail_all(self, error: BaseException) -> None:
        self._held.clear()
        self._streaming.clear()
        self.dead = error
        self.died.set()
        self._progress.unpark_all()
        for request_id, stream in list(self._streams.items()):
            stream.put(RequestDelta(request_id, 0, [], "", finish_reason="error", error=f"engine failed: {error!r}"))
            stream.end()  # refused when nobody is reading
        self._streams.clear()

    # -- worker thread ----------------------------------------------------------------------------

    def run_worker(self) -> None:
        try:
            while (num_applied := self._apply_inbox()) is not None:
                if self.core.has_work or self.core._pending:
                    deltas = self.core.step()
                    self._post(deltas, self.core.snapshot())
                    if self.max_steps_ahead:
                        self._outbox.wait_below(self.max_steps_ahead, BRAKE_TIMEOUT_S)
                else:
                    if num_applied:  # an abort or a parked session changed the state: /metrics shows it now
                        self._post([], self.core.snapshot(), steps=0)
                    self._wake.wait()
                    self._wake.clear()
        except BaseException as exc:  # the engine must never leave a caller hanging
            log.exception("engine worker died")
            self._token.run_sync_soon(self._fail_all, exc)

    def _apply_inbox(self) -> int | None:
        """Apply every message waiting; how many, or None at Shutdown."""
        num_applied = 0
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return num_applied
            if isinstance(msg, Shutdown):
                return None
            if isinstance(msg, RankFailed):
                raise msg.error
            self._apply(msg)
            num_applied += 1

    def _apply(self, msg) -> None:
        core = self.core
        try:
            match msg:
                case Submit():
                    core.add_request(msg.request_id, msg.prompt_token_ids, msg.params, msg.mm_items)
                case OpenSession():
                    core.open_session(
                        msg.request_id, msg.params, start_after_tokens=msg.start_after_tokens,
                        respond_per_chunk=msg.respond_per_chunk, prompt_token_ids=msg.prompt_token_ids,
                        mm_items=msg.mm_items,
                    )
                case Append():
                    core.append_input(msg.request_id, msg.token_ids, msg.mm_items)
                case Rebase():
                    core.rebase_input(msg.request_id, msg.token_ids, msg.mm_items)
                case FinishInput():
                    core.finish_input(msg.request_id, msg.max_tokens)
                case Abort():
                    core.abort(msg.request_id)
        except RillError as exc:
            # A bad request fails alone; the engine goes on.
            if not isinstance(msg, Abort):
                core.abort(msg.request_id)
                error = RequestDelta(msg.request_id, 0, [], "", finish_reason="error", error=str(exc))
                self._post([error], core.snapshot(), steps=0)

    def shutdown(self) -> None:
        self._send(Shutdown())

    def rank_failed(self, error: BaseException) -> None:
        """Any thread: a tensor-parallel rank died; the worker fails every request, even when idle."""
        self._send(RankFailed(error))


@asynccontextmanager
async def open_engine(config: EngineConfig | None = None) -> AsyncIterator[AsyncEngine]:
    """Load the model (in a thread), run the engine's worker thread for the block's duration."""
    config = config or EngineConfig()
    core = await trio.to_thread.run_sync(EngineCore, config)
    engine = AsyncEngine(core, trio.lowlevel.current_trio_token())
    core.watch_ranks(engine.rank_failed)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: trio.to_thread.run_sync(engine.run_worker, limiter=trio.CapacityLimiter(1))
            )
            try:
                yield engine
            finally:
                engine.shutdown()
    finally:
        with trio.CancelScope(shield=True):  # the worker thread is done: stop tensor-parallel ranks
            await trio.to_thread.run_sync(core.close)
