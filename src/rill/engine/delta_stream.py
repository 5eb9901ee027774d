"""One request's deltas, from the engine's bridge to the task that reads them (both in the trio thread).

What a trio memory channel did here, for less. The bridge `put`s each delivery's deltas (never
blocking: a request's deltas are bounded by its own max_tokens) and `end`s the stream when the request
is over; one reader takes them with `async for`, `receive()` or `receive_nowait()`, and closes it when
it leaves (then puts are refused, and the bridge aborts the request). A delivery wakes every running
request's reader, so a put's cost is paid per stream and per delivery: at 1,024 streams a put is a
deque append and, for a parked reader, one `trio.lowlevel.reschedule`, about 0.6x of a memory channel's
`send_nowait` (`benchmarks/trio-send-floor.py`).

It is a `trio.abc.ReceiveChannel` for its reader: the same `receive` semantics as a memory channel's
(a checkpoint each call, state unchanged when cancelled, `EndOfChannel` after the last item,
`ClosedResourceError` once closed, `BusyResourceError` for a second concurrent reader), and closed by
`with`, `async with` or `aclose()`.

`size_of` (optional) prices each item in bytes; `num_bytes` is then what waits for the reader, so the
bridge can drop a reader that stopped reading (a client whose socket is full) before its backlog grows
without bound (EngineConfig.max_stream_buffer_bytes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import trio
from trio.lowlevel import Abort, cancel_shielded_checkpoint, checkpoint_if_cancelled, current_task, reschedule

T = TypeVar("T")


class DeltaStream(trio.abc.ReceiveChannel[T], Generic[T]):
    __slots__ = ("_items", "_reader", "_ended", "_closed", "_size_of", "num_bytes")

    def __init__(self, size_of: Callable[[T], int] | None = None) -> None:
        self._items: deque[T] = deque()
        self._size_of = size_of
        self.num_bytes = 0  # the priced size of what is queued (0 without size_of)
        self._reader: trio.lowlevel.Task | None = None  # the task parked in receive(), if any
        self._ended = False  # the writer is done: the reader gets what is queued, then the end
        self._closed = False  # the reader closed it: puts are refused

    # -- the writer (the engine's bridge) ---------------------------------------------------------

    def put(self, item: T) -> bool:
        """Queue item for the reader. False, with nothing queued, once the reader has closed the stream."""
        if self._closed:
            return False
        if self._ended:
            raise trio.ClosedResourceError("put after the stream ended")
        self._items.append(item)
        if self._size_of is not None:
            self.num_bytes += self._size_of(item)
        self._wake()
        return True

    def end(self) -> None:
        """No more items: the reader gets those queued, then EndOfChannel. Idempotent."""
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        task = self._reader
        if task is not None:
            self._reader = None
            reschedule(task)

    # -- the reader ---------------------------------------------------------------------------------

    def receive_nowait(self) -> T:
        self._check_open()
        if self._items:
            return self._take()
        if self._ended:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    def receive(self) -> Awaitable[T]:
        return self._receive(trio.EndOfChannel)

    def __anext__(self) -> Awaitable[T]:
        # receive(), with StopAsyncIteration for the end: the coroutine itself, one frame less per item than
        # ReceiveChannel.__anext__ awaiting receive()
        return self._receive(StopAsyncIteration)

    async def _receive(self, end: type[Exception]) -> T:
        await checkpoint_if_cancelled()
        while not self._items:  # no exception on the way: a reader parks once per delivery
            self._check_open()
            if self._ended:
                raise end
            await self._park()
            if self._items:  # parking was the checkpoint: what woke the reader is taken without another
                return self._take()
        item = self._take()  # taken before the checkpoint, as a memory channel does
        await cancel_shielded_checkpoint()
        return item

    def _take(self) -> T:
        item = self._items.popleft()
        if self._size_of is not None:
            self.num_bytes -= self._size_of(item)
        return item

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream was closed")

    async def _park(self) -> None:
        """Until put, end or close (cancellation leaves the stream as it was)."""
        if self._reader is not None:
            raise trio.BusyResourceError("another task is already receiving from this stream")
        self._reader = current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _raise_cancel) -> Abort:
        self._reader = None  # cancelled while parked: nothing was taken
        return Abort.SUCCEEDED

    def close(self) -> None:
        """The reader leaves: what is queued is dropped, later puts are refused, a parked receive() raises
        ClosedResourceError. Idempotent, and synchronous: no put lands between closing and what follows."""
        self._closed = True
        self._items.clear()
        self.num_bytes = 0
        self._wake()

    def __enter__(self) -> DeltaStream[T]:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()
