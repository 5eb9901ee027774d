"""Keep-alive after an answer given before the request body arrived (hypercorn's trio worker).

hypercorn 0.18 ends an HTTP/1.1 exchange from inside the application's own task: the response's
last `send` runs h11's end of cycle, and when the request body has not all arrived, hypercorn
closes the connection from there (`H11Protocol._maybe_recycle` -> `TCPServer._close`). Just
before that it hands the app `http.disconnect`, and quart-trio answers `http.disconnect` by
cancelling the very task that is closing. The close is cut short at its first checkpoint, the
socket stays open, h11 waits for a cycle that never restarts, and the client's next request on
the connection hangs forever. A 404 or 405 to a POST with a body (Quart answers before the body
is read) or an early 413 hits it whenever the body arrives after the answer. The asyncio worker
cancels differently and is not affected.

Two mends, as ASGI middleware so the app under it stays as it is:
- the response's last send runs shielded, so hypercorn's end of cycle (recycle or close) always
  completes;
- an answer given before the body has arrived waits, bounded in time, for the rest of a body of
  at most `DRAIN_MAX_BYTES`, as Go's net/http and nginx do. The connection is then reused rather
  than closed under a client that is still sending, whose kernel would reset it and could drop
  the answer. A larger body is not waited for: the answer says `connection: close` at once.
"""

from __future__ import annotations

import trio

DRAIN_MAX_BYTES = 64 << 20
DRAIN_TIMEOUT_S = 5.0


def keep_alive_safe(app):
    """Wrap an ASGI app (Quart's `app.asgi_app`) with both mends; only HTTP scopes change."""

    async def asgi_app(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        exchange = _Exchange(scope, receive, send)
        return await app(scope, exchange.receive, exchange.send)

    return asgi_app


class _Exchange:
    """One request/response cycle: watches the body arrive, and guards the response's end."""

    def __init__(self, scope, receive, send):
        self._receive, self._send = receive, send
        self.body_done = trio.Event()
        length = _content_length(scope["headers"])
        self.may_drain = length is None or length <= DRAIN_MAX_BYTES  # None: chunked, unknown length

    async def receive(self):
        message = await self._receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self.body_done.set()
        return message

    async def send(self, message):
        kind = message["type"]
        if kind == "http.response.start" and not (self.may_drain or self.body_done.is_set()):
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        if kind != "http.response.body" or message.get("more_body", False):
            return await self._send(message)
        if self.may_drain:
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                await self.body_done.wait()
        with trio.CancelScope(shield=True):  # hypercorn recycles or closes the connection in here
            await self._send(message)


def _content_length(headers) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
