"""hypercorn's WebSocket ping loop, made to end when its connection does.

hypercorn 0.18 pings every `websocket_ping_interval` seconds from a task in the connection's task
group (`WSStream._send_pings`): `while not self.closed: ping; sleep(interval)`. After a clean
close the task still sleeps out the rest of its interval, and a graceful shutdown waits for it:
SIGTERM after a realtime session that had closed waited up to the whole interval (20 s by
default) with nothing in flight. Here the loop waits on an event that the stream's `closed` flag
sets, so it ends at the close. hypercorn has no hook for this (0.18.0 is its newest release), so
`install()` swaps the one method and the flag for these, and only on the versions checked.
"""

from __future__ import annotations

import logging
from importlib.metadata import version

import trio
from hypercorn.protocol.ws_stream import WSStream
from wsproto.events import Ping

log = logging.getLogger("rill.server")
CHECKED_VERSIONS = ("0.18.",)


def install() -> bool:
    """Patch WSStream once; False (and a warning) on a hypercorn this was not checked against."""
    if isinstance(WSStream.__dict__.get("closed"), property):
        return True
    found = version("hypercorn")
    if not found.startswith(CHECKED_VERSIONS) or not hasattr(WSStream, "_send_pings"):
        log.warning("hypercorn %s: WebSocket ping tasks may delay shutdown by one ping interval", found)
        return False
    WSStream.closed = property(_is_closed, _set_closed)
    WSStream._send_pings = _send_pings
    return True


def _closed_event(stream: WSStream) -> trio.Event:
    return stream.__dict__.setdefault("_rill_closed_event", trio.Event())


def _is_closed(stream: WSStream) -> bool:
    return _closed_event(stream).is_set()


def _set_closed(stream: WSStream, value: bool) -> None:
    if value:
        _closed_event(stream).set()
    # hypercorn never reopens a stream; __init__ sets False on a fresh event


async def _send_pings(self: WSStream) -> None:
    closed = _closed_event(self)
    while not closed.is_set():
        await self._send_wsproto_event(Ping())
        with trio.move_on_after(self.config.websocket_ping_interval):
            await closed.wait()
