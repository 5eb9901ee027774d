"""hypercorn's writes, bounded in time: a client that stops reading cannot hold its connection, its
request or a shutdown for longer than the send timeout (or the end of the grace).

hypercorn 0.18 writes every piece of every response and WebSocket message under a shielded cancel
scope (`TCPServer.protocol_send`: `await self.stream.send_all(data)`), so once a client's socket is
full nothing ends the write but the client: not a cancelled request, not hypercorn's own graceful
timeout (a SIGTERM with one client that had stopped reading waited until that client closed its
socket). The shield stays (a request's cancellation must not cut a frame in half), but here it gets
a deadline: `send_timeout_s` from the start of each write, and, once shutdown starts, the end of the
grace. Past it the connection is closed; the app sees the disconnect, so the request's handler is
cancelled and aborts its engine request (its KV is free by the engine's next step), as when a
client leaves.

hypercorn has no hook for this, so `install()` swaps `protocol_send` in, on the versions it was
checked against; a hypercorn Config carries its guard as `rill_send_guard` (rill.server sets it).
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from importlib.metadata import version

import trio
from hypercorn.events import Closed, RawData
from hypercorn.trio.tcp_server import TCPServer

log = logging.getLogger("rill.server")
CHECKED_VERSIONS = ("0.18.",)
ATTRIBUTE = "rill_send_guard"  # on a hypercorn.Config
_original_protocol_send = TCPServer.protocol_send


class SendGuard:
    """The deadline of every write of one server: `timeout_s` after it starts (None: none), and no
    later than `stop_at`'s deadline once shutdown set one."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self.num_timeouts = 0  # connections closed because a write ran past its deadline
        self._stop_at = math.inf
        self._writing: set[trio.CancelScope] = set()

    def stop_at(self, deadline: float) -> None:
        """No write outlives `deadline` (trio time): those in flight and those to come."""
        self._stop_at = min(self._stop_at, deadline)
        for scope in self._writing:
            scope.deadline = min(scope.deadline, deadline)

    @property
    def num_writing(self) -> int:
        return len(self._writing)

    @contextmanager
    def writing(self):
        """A shielded scope for one write, cancelled by its own deadline only."""
        own = math.inf if self.timeout_s is None else trio.current_time() + self.timeout_s
        with trio.CancelScope(shield=True, deadline=min(own, self._stop_at)) as scope:
            self._writing.add(scope)
            try:
                yield scope
            finally:
                self._writing.discard(scope)


def install() -> bool:
    """Patch TCPServer once; False (and a warning) on a hypercorn this was not checked against."""
    if TCPServer.protocol_send is _protocol_send:
        return True
    found = version("hypercorn")
    if not found.startswith(CHECKED_VERSIONS):
        log.warning("hypercorn %s: writes to a client that stopped reading are not bounded in time", found)
        return False
    TCPServer.protocol_send = _protocol_send
    return True


async def _protocol_send(self: TCPServer, event) -> None:
    guard: SendGuard | None = getattr(self.config, ATTRIBUTE, None)
    if guard is None or not isinstance(event, RawData):
        await _original_protocol_send(self, event)
        return
    async with self.send_lock:
        try:
            with guard.writing() as scope:
                await self.stream.send_all(event.data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())
            return
    if scope.cancelled_caught:  # the stream is broken mid-write: only closing it is left
        guard.num_timeouts += 1
        log.info("a write to a client waited past its deadline (send timeout %s s, or the shutdown grace): "
                 "closing the connection", guard.timeout_s)
        await self.stream.aclose()
        await self.protocol.handle(Closed())
