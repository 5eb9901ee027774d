"""hypercorn's WebSockets, mended: keepalive that ends with its connection and closes a dead
peer, and no permessage-deflate.

hypercorn 0.18 pings every `websocket_ping_interval` seconds from a task in the connection's task
group (`WSStream._send_pings`: `while not self.closed: ping; sleep(interval)`). Two faults:
- after a clean close the task sleeps out the rest of its interval, and a graceful shutdown waits
  for it: SIGTERM after a realtime session that had closed waited up to 20 s with nothing in flight;
- it never looks for the pong, so a peer that vanished without a FIN (a laptop lid, a dropped
  NAT entry) keeps its connection, its realtime session and its KV for as long as TCP lets it.
Here the loop waits on an event that the stream's `closed` flag sets, and a peer from which
nothing at all arrived (pong or message) within one interval after a ping is closed with 1001,
as rill's raw listener does.

hypercorn also accepts permessage-deflate whenever a client offers it, and wsproto inflates a
frame without bound: a 400 MiB text message that compresses to a few hundred KB grew the server by
about 400 MB before the 16 MiB message cap closed the connection. Realtime events are small JSON
and audio is base64 PCM, which deflate barely helps, so rill accepts no extension (as the raw
trio-websocket listener never did); clients fall back to plain frames.

hypercorn has no hook for any of this (0.18.0 is its newest release), so `install()` swaps these
methods in, and only on the versions they were checked against.
"""

from __future__ import annotations

import logging
from importlib.metadata import version

import trio
from hypercorn.protocol.events import Body, Data, StreamClosed
from hypercorn.protocol.ws_stream import Handshake, WSStream
from wsproto.events import CloseConnection, Ping

log = logging.getLogger("rill.realtime")
CHECKED_VERSIONS = ("0.18.",)
CLOSE_GOING_AWAY = 1001
_original_handle = WSStream.handle
_original_accept = Handshake.accept


def install() -> bool:
    """Patch WSStream once; False (and a warning) on a hypercorn this was not checked against."""
    if isinstance(WSStream.__dict__.get("closed"), property):
        return True
    found = version("hypercorn")
    if not found.startswith(CHECKED_VERSIONS) or not hasattr(WSStream, "_send_pings"):
        log.warning("hypercorn %s: /v1/realtime keepalive and compression are hypercorn's own", found)
        return False
    Handshake.accept = _accept_uncompressed
    WSStream.closed = property(_is_closed, _set_closed)
    WSStream.handle = _handle
    WSStream._send_pings = _send_pings
    return True


def _state(stream: WSStream) -> dict:
    return stream.__dict__.setdefault("_rill_keepalive", {"closed": trio.Event(), "heard_s": 0.0})


def _is_closed(stream: WSStream) -> bool:
    return _state(stream)["closed"].is_set()


def _set_closed(stream: WSStream, value: bool) -> None:
    if value:
        _state(stream)["closed"].set()
    # hypercorn never reopens a stream; __init__ sets False on a fresh event


async def _handle(self: WSStream, event) -> None:
    if isinstance(event, (Body, Data)):  # bytes from the peer: it is alive
        _state(self)["heard_s"] = trio.current_time()
    await _original_handle(self, event)


async def _send_pings(self: WSStream) -> None:
    """hypercorn closes a connection (`send_eof`) outside the lock its sends take, so a ping that
    meets the close raises BusyResourceError in this task, and that brought the whole listener down
    (seen when a client's invalid UTF-8 closed its connection): a ping that cannot go out ends the
    pinging; the connection is closing anyway."""
    try:
        await _ping_until_closed(self)
    except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        log.debug("realtime keepalive ended with its connection: %r", exc)


async def _ping_until_closed(self: WSStream) -> None:
    state, interval_s = _state(self), self.config.websocket_ping_interval
    while not state["closed"].is_set():
        sent_s = trio.current_time()
        await self._send_wsproto_event(Ping())
        with trio.move_on_after(interval_s):
            await state["closed"].wait()
        if not state["closed"].is_set() and state["heard_s"] < sent_s:
            log.info("realtime client sent no pong within %.1f s: closing", interval_s)
            await self._send_wsproto_event(CloseConnection(code=CLOSE_GOING_AWAY, reason="no pong"))
            await self.send(StreamClosed(stream_id=self.stream_id))
            return


def _accept_uncompressed(self: Handshake, *args, **kwargs):
    self.extensions = None  # the client's offer is ignored: no permessage-deflate
    return _original_accept(self, *args, **kwargs)
