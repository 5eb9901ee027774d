"""Worker thread -> trio thread, for the engines' bridges (rill.engine.async_engine, rill.speech.async_speech)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio


class Outbox:
    """The worker posts batches; the trio thread gets every batch posted since its last callback in
    one `deliver(batches)` call, in order. At most one callback is scheduled at a time, so a worker
    faster than trio coalesces its batches instead of flooding trio's run queue.

    `wait_below(n)` is the worker's brake: it blocks, without the GIL, while n or more batches wait
    for trio. A worker that never waits can run many steps ahead of a busy trio thread and, holding
    the GIL between its steps, slow that thread down further; one that waits leaves trio the
    interpreter until the batches are delivered, which bounds the time from a step to its delivery."""

    def __init__(self, token: trio.lowlevel.TrioToken, deliver: Callable[[list], None]):
        self._token, self._deliver = token, deliver
        self._batches: list = []
        self._scheduled = False
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)

    def post(self, batch) -> None:
        """Worker thread: queue one batch; schedule a drain unless one is already due."""
        with self._lock:
            self._batches.append(batch)
            if self._scheduled:
                return
            self._scheduled = True
        self._token.run_sync_soon(self._drain)

    def wait_below(self, n: int, timeout: float) -> bool:
        """Worker thread: block until fewer than n batches wait for trio, or `timeout` seconds pass
        (a stalled trio thread must not stall the worker for ever). False when it timed out."""
        with self._lock:
            return self._drained.wait_for(lambda: len(self._batches) < n, timeout)

    def _drain(self) -> None:
        # Trio thread: everything posted since the last drain.
        with self._lock:
            batches, self._batches = self._batches, []
            self._scheduled = False
            self._drained.notify_all()
        self._deliver(batches)
