"""WS /v1/realtime on the HTTP port: the quart-trio route that drives the realtime protocol.

hypercorn answers client pings and, with `websocket_ping_interval`, sends its own (ASGI gives an
app no ping of its own, so a missing pong is noticed by the idle timeout here rather than by the
keepalive the raw listener runs). A refused handshake is an HTTP answer with an OpenAI error body.
"""

from __future__ import annotations

from quart import Blueprint, Response, current_app, websocket
from quart_trio import QuartTrio

from rill.transports.realtime.driver import RealtimeConfig, RealtimeHub, Refusal, run_connection

realtime_api = Blueprint("realtime", __name__)
_EXTENSION = "rill.realtime"


def install_realtime(app: QuartTrio, config: RealtimeConfig, api_key: str | None, get_models,
                     get_speech=lambda: None, get_speech_out=lambda: None) -> RealtimeHub:
    """Add the route; the hub it returns also admits the raw listener's connections (one cap for both).
    `get_models` gives the served models (rill.openai.served_models), `get_speech` the speech engine
    that hears input audio (None: audio is refused), `get_speech_out` the speech-out worker that speaks
    answers (None: answers are text)."""
    hub = RealtimeHub(config, api_key, get_models, get_speech, get_speech_out)
    app.extensions[_EXTENSION] = hub
    app.register_blueprint(realtime_api)
    return hub


def realtime_hub(app: QuartTrio) -> RealtimeHub:
    return app.extensions[_EXTENSION]


class QuartSocket:
    can_ping = False  # hypercorn's websocket_ping_interval does it

    async def receive(self) -> str | bytes:
        data = await websocket.receive()  # the client leaving cancels this task (quart-trio)
        return b"" if data is None else data  # quart-trio reads an empty binary frame as None

    async def send(self, text: str) -> None:
        await websocket.send(text)

    async def close(self, code: int, reason: str) -> None:
        await websocket.close(code, reason)

    async def ping(self) -> None:
        raise NotImplementedError("ASGI has no ping; see can_ping")


@realtime_api.websocket("/v1/realtime")
async def realtime_route():
    hub = realtime_hub(current_app)
    headers = {name.lower(): value for name, value in websocket.headers.items()}
    admitted = hub.admit(headers, websocket.requested_subprotocols, websocket.args)
    if isinstance(admitted, Refusal):
        retry = {"Retry-After": "1"} if admitted.status == 503 else {}
        return Response(admitted.body(), status=admitted.status, headers=retry,
                        content_type="application/json")
    with hub.counted():
        await websocket.accept(subprotocol=admitted.subprotocol)
        await run_connection(QuartSocket(), hub, admitted)
    return None
