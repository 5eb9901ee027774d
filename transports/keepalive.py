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
  A body no handler asked for (transports/body_gate.py: a 401 or 404 before it was read) is
  dropped as it drains, and waited for only up to DRAIN_UNREAD_MAX_BYTES (Go's net/http's
  256 KiB): a larger one closes the connection rather than be read.
"""

from __future__ import annotations

import trio

from rill.transports.body_gate import BUDGET_KEY, Gate, GatedRequest

DRAIN_MAX_BYTES = 64 << 20
DRAIN_UNREAD_MAX_BYTES = 256 << 10
DRAIN_TIMEOUT_S = 5.0


def keep_alive_safe(app):
    """Wrap an ASGI app (Quart's `app.asgi_app`) with both mends; only HTTP scopes change. When the
    Quart app's request class is body_gate.GatedRequest, its bodies also go through the body gate,
    within the budget in its extensions (both are set after wrapping: see transports/http.py)."""
    quart_app = getattr(app, "__self__", None)

    async def asgi_app(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        gated = quart_app is not None and issubclass(quart_app.request_class, GatedRequest)
        budget = quart_app.extensions.get(BUDGET_KEY) if gated else None
        exchange = _Exchange(scope, receive, send, gated, budget)
        if exchange.gate is not None:
            scope = {**scope, "rill.body_gate": exchange.gate}
        try:
            return await app(scope, exchange.receive, exchange.send)
        finally:
            if exchange.gate is not None:
                exchange.gate.close()

    return asgi_app


class _Exchange:
    """One request/response cycle: watches the body arrive, and guards the response's end."""

    def __init__(self, scope, receive, send, gated: bool = False, budget=None):
        self._receive, self._send = receive, send
        self.body_done = trio.Event()
        self.length = length = _content_length(scope["headers"])
        self.may_drain = length is None or length <= DRAIN_MAX_BYTES  # None: chunked, unknown length
        has_body = bool(length) or _is_chunked(scope["headers"])
        self.gate = Gate(budget, length) if gated and has_body else None

    async def receive(self):
        gate = self.gate
        if gate is not None and not self.body_done.is_set():
            await gate.opened.wait()  # the body stays in the socket until a handler asks for it
        message = await self._receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self.body_done.set()
        if gate is not None and message.get("body") and not gate.on_chunk(len(message["body"])):
            message = {**message, "body": b""}  # refused: drained, not kept
        return message

    async def send(self, message):
        kind = message["type"]
        if kind == "http.response.start" and self.gate is not None and not self.gate.opened.is_set():
            self.gate.refuse()  # answered before the body was asked for
        if kind == "http.response.start" and self.gate is not None and self.gate.refused:
            self.may_drain = self.length is not None and self.length <= DRAIN_UNREAD_MAX_BYTES
        if kind == "http.response.start" and not (self.may_drain or self.body_done.is_set()):
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        if kind != "http.response.body" or message.get("more_body", False):
            return await self._send(message)
        if self.may_drain:
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                await self.body_done.wait()
        with trio.CancelScope(shield=True):  # hypercorn recycles or closes the connection in here
            await self._send(message)


def _is_chunked(headers) -> bool:
    return any(name.lower() == b"transfer-encoding" and b"chunked" in value.lower() for name, value in headers)


def _content_length(headers) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
