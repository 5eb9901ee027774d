"""The raw realtime listener (`rill serve --ws-port`): trio-websocket on its own port, speaking the
same protocol as /v1/realtime through the same driver, admitted by the same hub (so one
connection cap and one API key cover both). Every path serves the protocol; a `model` query
parameter is checked as on /v1/realtime.
"""

from __future__ import annotations

from functools import partial
from urllib.parse import parse_qsl, urlsplit

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from rill.transports.realtime.driver import MAX_FRAME_BYTES, RealtimeHub, Refusal, run_connection

CONNECT_TIMEOUT_S = 10.0
DISCONNECT_TIMEOUT_S = 5.0


async def serve_ws(hub: RealtimeHub, host: str, port: int, *, stop: trio.Event | None = None,
                   task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen until `stop` is set (or forever); task_status gets the bound ws:// URL. Stopping
    cancels open connections, whose handlers abort their engine requests."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(
            serve_websocket, partial(_handle, hub), host, port, None, max_message_size=MAX_FRAME_BYTES,
            connect_timeout=CONNECT_TIMEOUT_S, disconnect_timeout=DISCONNECT_TIMEOUT_S,
        ))
        task_status.started(f"ws://{host}:{server.port}")
        await (stop if stop is not None else trio.Event()).wait()
        nursery.cancel_scope.cancel()


async def _handle(hub: RealtimeHub, request: WebSocketRequest) -> None:
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
    # wsproto takes Host out of the headers trio-websocket shows; the Host check (DNS rebinding) needs it
    headers["host"] = request._event.host
    query = dict(parse_qsl(urlsplit(request.path).query))
    admitted = hub.admit(headers, request.proposed_subprotocols, query)
    if isinstance(admitted, Refusal):
        extra = [(b"content-type", b"application/json")]
        if admitted.status == 503:
            extra.append((b"retry-after", b"1"))
        await request.reject(admitted.status, extra_headers=extra, body=admitted.body())
        return
    with hub.counted():
        ws = await request.accept(subprotocol=admitted.subprotocol)
        await run_connection(TrioSocket(ws), hub, admitted)


class TrioSocket:
    can_ping = True

    def __init__(self, ws: WebSocketConnection):
        self._ws = ws

    async def receive(self) -> str | bytes | None:
        try:
            return await self._ws.get_message()
        except ConnectionClosed:
            return None

    async def send(self, text: str) -> None:
        try:
            await self._ws.send_message(text)
        except ConnectionClosed as exc:
            raise trio.BrokenResourceError("the client left") from exc

    async def close(self, code: int, reason: str) -> None:
        with trio.move_on_after(DISCONNECT_TIMEOUT_S):  # a peer that never answers: the stream closes anyway
            await self._ws.aclose(code, reason)

    async def ping(self) -> None:
        try:
            await self._ws.ping()
        except ConnectionClosed as exc:
            raise trio.BrokenResourceError("the client left") from exc
