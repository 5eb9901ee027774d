"""Request bodies are read when a handler asks for one, within a server-wide budget.

quart-trio reads every request's body into memory as it arrives, whether or not anyone wants
it: a keyless request with a 16 MiB body got its 401 and still buffered the body (40 such
connections: +543 MB). Here the body stays in the socket (hypercorn feeds the app through a
bounded queue, so TCP pushes back) until the handler awaits or iterates `request.body`. An
answer given before that (401, 403, 404, 429, ...) refuses the body unread: a small one is
drained and dropped so the connection can be reused, a larger one closes the connection
(transports/keepalive.py).

The bytes of bodies being read, on every connection together, are bounded by
--max-body-bytes-in-flight. A body that would go past it is refused at once with 503 and is
not read; rill does not wait for room, since a waiting request still
holds its connection and the client's retry is as good. A body of known length reserves its
length when the handler asks for it; a chunked one counts as it arrives. Bytes are given back
when the exchange ends, or as a streamed body (Mode A's NDJSON lines) is consumed.
"""

from __future__ import annotations

import trio
from quart_trio.wrappers.request import TrioBody, TrioRequest
from werkzeug.exceptions import ServiceUnavailable

BUDGET_KEY = "rill.body_budget"  # the BodyBudget in the Quart app's extensions


class BodyBudget:
    """The bytes of request bodies held at once, all connections together."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.num_bytes = 0

    def can_take(self, num_bytes: int) -> bool:
        return self.num_bytes + num_bytes <= self.max_bytes

    def take(self, num_bytes: int) -> None:
        assert self.can_take(num_bytes)
        self.num_bytes += num_bytes

    def give_back(self, num_bytes: int) -> None:
        self.num_bytes -= num_bytes
        assert self.num_bytes >= 0


class Gate:
    """One exchange's body: closed until the handler asks for it; refused when answered first."""

    def __init__(self, budget: BodyBudget | None, content_length: int | None):
        self.budget, self.content_length = budget, content_length
        self.opened = trio.Event()  # the handler asked, or the answer came first: reads may go on
        self.refused = False  # answered before being read: what arrives is dropped
        self.num_held = 0  # bytes of the budget this exchange holds
        self.body: TrioBody | None = None  # the request's, once Quart made it (GatedRequest)

    def open(self, body: TrioBody) -> None:
        """The handler asks for the body: reserve a known length, or refuse with 503."""
        if self.opened.is_set():
            return
        if self.content_length and not self._hold(self.content_length):
            body._must_raise = _over_budget(self.budget)  # raised in the handler: quart-trio's own channel
            return
        self.opened.set()

    def refuse(self) -> None:
        """The answer starts before the body was asked for: drop whatever arrives."""
        self.refused = True
        self.opened.set()

    def on_chunk(self, num_bytes: int) -> bool:
        """A chunk arrived for the handler; False when it must be dropped (refused, or past the budget)."""
        if self.refused:
            return False
        if self.content_length is None and not self._hold(num_bytes):
            if self.body is not None:
                self.body._must_raise = _over_budget(self.budget)
                self.body.set_complete()
            self.refused = True
            return False
        return True

    def consumed(self, num_bytes: int) -> None:
        """A streamed body handed num_bytes to the handler, which keeps them no longer here."""
        num_bytes = min(num_bytes, self.num_held)
        self.num_held -= num_bytes
        if self.budget is not None:
            self.budget.give_back(num_bytes)

    def close(self) -> None:
        self.consumed(self.num_held)

    def _hold(self, num_bytes: int) -> bool:
        if self.budget is None:
            return True
        if not self.budget.can_take(num_bytes):
            return False
        self.budget.take(num_bytes)
        self.num_held += num_bytes
        return True


def _over_budget(budget: BodyBudget) -> ServiceUnavailable:
    return ServiceUnavailable(f"the server holds its limit of {budget.max_bytes} bytes of request bodies "
                              "(--max-body-bytes-in-flight); retry shortly")


class GatedBody(TrioBody):
    """quart-trio's body; the first await or iteration opens the exchange's gate."""

    gate: Gate | None = None

    def __await__(self):
        if self.gate is not None:
            self.gate.open(self)
        return super().__await__()

    async def __anext__(self) -> bytes:
        if self.gate is not None:
            self.gate.open(self)
        data = await super().__anext__()
        if self.gate is not None:
            self.gate.consumed(len(data))
        return data


class GatedRequest(TrioRequest):
    """The app's request class: its body reads through the gate keepalive.py put in the scope."""

    body_class = GatedBody

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.body.gate = self.scope.get("rill.body_gate")
        if self.body.gate is not None:
            self.body.gate.body = self.body
