"""What both realtime WebSocket adapters share: the limits (`RealtimeConfig`), admission (API key,
connection cap; `RealtimeHub`), and `run_connection`, the task that pumps one WebSocket through
a `RealtimeConnection` and the engine's output channels into it.

One connection is three kinds of task joined by one bounded inbox: the client reader, one pump
per engine request, and the main loop, which feeds the handler and sends what it returns. When
the client leaves (or the idle timeout, or a missing pong, ends it) the handler aborts its engine
request, whose KV is then free by the engine's next step.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import msgspec
import trio

from rill.openai.errors import ApiError
from rill.openai.served_models import ServedModels
from rill.openai.serving import Serving
from rill.outputs import RequestDelta
from rill.transports.api_keys import bearer_matches
from rill.transports.realtime.audio_input import OPENAI_RATE_HZ, SUPPORTED_RATES_HZ
from rill.transports.realtime.connection import DEFAULT_MAX_MESSAGE_BYTES, RealtimeConnection
from rill.speech.live import SpeechFailed, SpeechStarted, SpeechStopped, TranscriptDelta, TranscriptDone
from rill.transports.realtime.events import RealtimeError, encode, error_event
from rill.transports.realtime.model_names import is_openai_realtime_model
from rill.transports.realtime.response import Dialect
from rill.transports.realtime.speech_link import ItemTranscribed, LiveSpeechLink
from rill.transports.realtime.speech_out_link import SPEECH_OUT_EVENTS, SpeechOutLink
from rill.transports.realtime.turn_end import TurnEndScorer
from rill.transports.realtime.video_link import VIDEO_EVENTS, VideoLink

log = logging.getLogger("rill.realtime")

INSECURE_KEY_PROTOCOL = "openai-insecure-api-key."  # browsers cannot set headers on a WebSocket
BETA_PROTOCOL = "openai-beta.realtime-v1"
# Frames past this close the connection (1009) in the WebSocket library itself; below it and over
# max_message_bytes they get an error event. hypercorn's default for websocket_max_message_size.
MAX_FRAME_BYTES = 16 << 20
INBOX_SIZE = 64
LIVE_EVENTS = (SpeechStarted, SpeechStopped, TranscriptDelta, TranscriptDone, SpeechFailed, ItemTranscribed)

CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL_ERROR = 1011


@dataclass
class RealtimeConfig:
    """Limits of /v1/realtime and of the raw listener. `rill serve` fills it from flags and RILL_*."""

    ws_port: int | None = None  # the raw trio-websocket listener; None: off
    idle_timeout_s: float = 300.0  # no client event and no output for this long: close
    max_connections: int = 256  # both listeners together
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    ping_interval_s: float | None = 20.0  # None: no pings; a pong must come back within the interval
    # an event the client does not take within this closes the connection (it stopped reading); None: no limit
    send_timeout_s: float | None = 30.0
    # PCM16's rate when a session does not name one: OpenAI's (24 kHz); a session opened vLLM's way
    # (session.update with the model at the top level) reads 16 kHz, as vLLM does (conversation.Settings).
    audio_rate_hz: int = OPENAI_RATE_HZ

    @classmethod
    def from_env(cls) -> RealtimeConfig:
        env = os.environ.get
        port, ping = env("RILL_WS_PORT"), env("RILL_WS_PING_INTERVAL_S")
        return cls(
            ws_port=int(port) if port else None,
            idle_timeout_s=float(env("RILL_WS_IDLE_TIMEOUT_S", 300.0)),
            max_connections=int(env("RILL_WS_MAX_CONNECTIONS", 256)),
            max_message_bytes=int(env("RILL_WS_MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES)),
            ping_interval_s=None if ping in ("0", "none") else float(ping or 20.0),
            send_timeout_s=float(env("RILL_SEND_TIMEOUT_S", 30.0)) or None,
            audio_rate_hz=int(env("RILL_REALTIME_AUDIO_RATE_HZ", OPENAI_RATE_HZ)),
        )


def add_realtime_args(p: argparse.ArgumentParser) -> None:
    """`rill serve` flags; their defaults come from RILL_WS_* (see RealtimeConfig.from_env)."""
    env = RealtimeConfig.from_env()
    g = p.add_argument_group("realtime WebSocket API (/v1/realtime, and the raw listener)")
    g.add_argument("--ws-port", type=int, default=env.ws_port,
                   help="also serve the realtime protocol on a raw WebSocket listener on this port (0: any free "
                   "port; default: off) [RILL_WS_PORT]")
    g.add_argument("--ws-idle-timeout-s", type=float, default=env.idle_timeout_s,
                   help="close a connection with no client event and no output for this long [RILL_WS_IDLE_TIMEOUT_S]")
    g.add_argument("--ws-max-connections", type=int, default=env.max_connections,
                   help="realtime connections open at once, both listeners together [RILL_WS_MAX_CONNECTIONS]")
    g.add_argument("--ws-max-message-bytes", type=int, default=env.max_message_bytes,
                   help="larger client events get an error event [RILL_WS_MAX_MESSAGE_BYTES]")
    g.add_argument("--ws-ping-interval-s", type=float, default=env.ping_interval_s or 0.0,
                   help="server pings; a pong must come back within one interval (0: off) [RILL_WS_PING_INTERVAL_S]")
    g.add_argument("--realtime-audio-rate-hz", type=int, default=env.audio_rate_hz, choices=SUPPORTED_RATES_HZ,
                   help="the rate of PCM16 audio from sessions that name none: OpenAI's 24000 by default; sessions "
                   "opened vLLM's way read 16000 [RILL_REALTIME_AUDIO_RATE_HZ]")


def realtime_config(args: argparse.Namespace) -> RealtimeConfig:
    return RealtimeConfig(ws_port=args.ws_port, idle_timeout_s=args.ws_idle_timeout_s,
                          max_connections=args.ws_max_connections, max_message_bytes=args.ws_max_message_bytes,
                          ping_interval_s=args.ws_ping_interval_s or None,
                          audio_rate_hz=args.realtime_audio_rate_hz,
                          send_timeout_s=getattr(args, "send_timeout_s", 30.0) or None)  # rill serve --send-timeout-s


@dataclass(frozen=True)
class Refusal:
    """A handshake answered with an HTTP status instead of an upgrade."""

    status: int
    code: str
    message: str

    def body(self) -> bytes:
        """The OpenAI error body both listeners send with the status."""
        return msgspec.json.encode(ApiError(self.status, self.message, code=self.code).body)


@dataclass(frozen=True)
class Handshake:
    """What the connection needs from the upgrade request."""

    dialect: Dialect
    subprotocol: str | None  # echoed back (browsers fail a connection that offers some and gets none)
    model: str | None


class RealtimeHub:
    """Admission for both listeners: API key, connection cap, engine readiness, the model named."""

    def __init__(self, config: RealtimeConfig, api_key: str | None, get_models: Callable[[], ServedModels | None],
                 get_speech: Callable[[], object | None] = lambda: None,
                 get_speech_out: Callable[[], object | None] = lambda: None):
        self.config, self.api_key = config, api_key
        self._get_models = get_models  # the served models (None until the engines run)
        self._get_speech = get_speech  # the AsyncSpeechEngine, or None: audio gets audio_not_supported
        self._get_speech_out = get_speech_out  # the server's speech-out worker (rill.tts.worker), or None: text answers
        self.num_connections = 0
        self.num_refused = 0
        self.cross_site = None  # rill.transports.cross_site.CrossSitePolicy, set by create_app; None: no checks

    @property
    def models(self) -> ServedModels | None:
        return self._get_models()

    @property
    def serving(self) -> Serving | None:
        """The default model's Serving."""
        models = self.models
        return None if models is None else models.default

    @property
    def speech(self):
        return self._get_speech()

    @property
    def speech_out(self):
        return self._get_speech_out()

    def admit(self, headers: Mapping[str, str], subprotocols: Sequence[str], query: Mapping[str, str]
              ) -> Handshake | Refusal:
        refusal = self._refusal(headers, subprotocols, query)
        if refusal is not None:
            self.num_refused += 1
            log.info("realtime handshake refused: %d %s", refusal.status, refusal.code)
            return refusal
        beta = BETA_PROTOCOL in subprotocols or "realtime=v1" in headers.get("openai-beta", "")
        model = query.get("model")
        if is_openai_realtime_model(model) and model not in self.models.names:
            model = None  # OpenAI's name: served by the default model (model_names)
        return Handshake(Dialect.BETA if beta else Dialect.GA, _pick_subprotocol(subprotocols), model)

    def _refusal(self, headers, subprotocols, query) -> Refusal | None:
        refused = None if self.cross_site is None else self.cross_site.refusal("", headers)
        if refused is not None:  # a web page on another origin, or a rebound name (DNS rebinding)
            return Refusal(refused.status, refused.code, refused.message)
        if not self._authorized(headers, subprotocols):
            return Refusal(401, "invalid_api_key", "a valid API key is required: send 'Authorization: Bearer <key>' "
                           f"or the subprotocol '{INSECURE_KEY_PROTOCOL}<key>'")
        models = self.models
        if models is None or not models.all_alive:
            return Refusal(503, "engine_dead", "the engine is not running")
        if self.num_connections >= self.config.max_connections:
            return Refusal(503, "too_many_connections", f"{self.num_connections} realtime connections are open "
                           f"(limit {self.config.max_connections}); retry shortly")
        model = query.get("model")
        if model is not None and model not in models.names and not is_openai_realtime_model(model):
            return Refusal(404, "model_not_found", f"the model {model!r} does not exist; this server serves "
                           f"{models.names}")
        return None

    def _authorized(self, headers: Mapping[str, str], subprotocols: Sequence[str]) -> bool:
        if self.api_key is None:
            return True
        offered = [headers.get("authorization", "")]
        offered += [f"Bearer {p[len(INSECURE_KEY_PROTOCOL):]}" for p in subprotocols
                    if p.startswith(INSECURE_KEY_PROTOCOL)]
        return any([bearer_matches(given, self.api_key) for given in offered])  # a list: no early exit

    @contextmanager
    def counted(self):
        """Hold a connection slot; enter it right after `admit` (no checkpoint between: the cap holds)."""
        self.num_connections += 1
        try:
            yield
        finally:
            self.num_connections -= 1


def _pick_subprotocol(offered: Sequence[str]) -> str | None:
    if "realtime" in offered:
        return "realtime"
    return next((p for p in offered if not p.startswith(INSECURE_KEY_PROTOCOL)), None)


class RealtimeSocket(Protocol):
    """An accepted WebSocket, as the adapters wrap it."""

    can_ping: bool

    async def receive(self) -> str | bytes | None: ...  # None: the client left
    async def send(self, text: str) -> None: ...
    async def close(self, code: int, reason: str) -> None: ...
    async def ping(self) -> None: ...  # returns when the pong arrives


class ChannelEngineLink:
    """EngineLink on the real engine: each request's output channel is pumped into one inbox."""

    def __init__(self, engine, nursery: trio.Nursery, inbox: trio.MemorySendChannel):
        self._engine, self._nursery, self._inbox = engine, nursery, inbox

    def use(self, engine) -> None:
        """Another model's engine, for a connection that has made no request yet (model_switch)."""
        self._engine = engine

    def submit(self, request_id, prompt_token_ids, params, mm_items=()) -> None:
        self._pump(self._engine.submit(request_id, prompt_token_ids, params, mm_items))

    def open_session(self, request_id, params, *, respond_per_chunk, prompt_token_ids, mm_items=()) -> None:
        self._pump(self._engine.open_session(request_id, params, start_after_tokens=1,
                                             respond_per_chunk=respond_per_chunk, prompt_token_ids=prompt_token_ids,
                                             mm_items=mm_items))

    def append(self, request_id, token_ids, mm_items=()) -> None:
        self._engine.append(request_id, token_ids, mm_items)

    def finish(self, request_id, max_tokens) -> None:
        self._engine.finish(request_id, max_tokens)

    def abort(self, request_id) -> None:
        self._engine.abort(request_id)

    def _pump(self, recv: trio.abc.ReceiveChannel) -> None:
        async def pump() -> None:
            with recv:
                async for delta in recv:
                    await self._inbox.send(delta)

        self._nursery.start_soon(pump)


class ClientGone:
    pass


async def run_connection(socket: RealtimeSocket, hub: RealtimeHub, handshake: Handshake) -> None:
    """Serve one accepted WebSocket until the client leaves or the connection times out (the adapter
    holds its slot: `with hub.counted()`)."""
    config = hub.config
    send_inbox, inbox = trio.open_memory_channel(INBOX_SIZE)
    async with trio.open_nursery() as nursery:
        speech = hub.speech
        link = LiveSpeechLink(speech, nursery, send_inbox.clone()) if speech is not None else None
        serving = hub.models.serving_for(handshake.model)  # ?model= on the URL (admit checked it)
        out = hub.speech_out
        voice = SpeechOutLink(out, nursery, send_inbox.clone()) if out is not None else None
        conn = RealtimeConnection(serving, ChannelEngineLink(serving.engine, nursery, send_inbox),
                                  dialect=handshake.dialect, model=handshake.model,
                                  max_message_bytes=config.max_message_bytes, speech=link,
                                  audio_rate_hz=config.audio_rate_hz,
                                  video=VideoLink(nursery, send_inbox.clone()), serving_for=hub.models.serving_for,
                                  speech_out=voice)
        if link is not None:
            link.turn_end = TurnEndScorer(conn)  # semantic_vad asks the connection's chat model
        log.info("realtime connection %s opened (%d open)", conn.session_id, hub.num_connections)
        try:
            nursery.start_soon(_read_client, socket, send_inbox.clone(), link)
            if socket.can_ping and config.ping_interval_s:
                nursery.start_soon(_keepalive, socket, config.ping_interval_s, nursery.cancel_scope)
            await _serve(_Sender(socket, config.send_timeout_s), conn, inbox, config.idle_timeout_s)
        except Exception:
            log.exception("realtime connection %s failed", conn.session_id)
            with trio.move_on_after(1.0, shield=True):
                await socket.close(CLOSE_INTERNAL_ERROR, "internal error")
        finally:
            conn.close()
            nursery.cancel_scope.cancel()
            log.info("realtime connection %s closed", conn.session_id)


async def _read_client(socket: RealtimeSocket, inbox: trio.MemorySendChannel, link: LiveSpeechLink | None) -> None:
    async with inbox:
        while True:
            if link is not None:
                await link.wait_for_room()  # back-pressure: audio beyond the recogniser's backlog waits in TCP
            if (message := await socket.receive()) is None:
                break
            await inbox.send(message)
        await inbox.send(ClientGone())


async def _serve(socket: RealtimeSocket, conn: RealtimeConnection, inbox, idle_timeout_s: float) -> None:
    """The main loop: one inbox item at a time through the handler, its events out in order."""
    if not await _send(socket, conn.start()):
        return
    last_activity_s = trio.current_time()
    while True:
        item = None
        with trio.move_on_at(float("inf") if conn.is_busy else last_activity_s + idle_timeout_s):
            item = await inbox.receive()
        if item is None:
            idle = RealtimeError("idle_timeout", f"no event for {idle_timeout_s:g} s: closing the connection")
            await _send(socket, [error_event(idle, None)])
            await socket.close(CLOSE_GOING_AWAY, "idle timeout")
            return
        if isinstance(item, ClientGone):
            return
        last_activity_s = trio.current_time()
        if isinstance(item, RequestDelta):
            events = conn.receive_delta(item)
        elif isinstance(item, LIVE_EVENTS):
            events = conn.receive_speech(item)
        elif isinstance(item, VIDEO_EVENTS):
            events = conn.receive_video(item)
        elif isinstance(item, SPEECH_OUT_EVENTS):
            events = conn.receive_speech_out(item)
        else:
            events = conn.receive_message(item)
        if not await _send(socket, events):
            return


async def _send(socket: RealtimeSocket, events) -> bool:
    try:
        for event in events:
            await socket.send(encode(event))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


class _Sender:
    """The socket, its sends bounded in time. A client that stops reading stalls the main loop, which
    stops draining the inbox, so its requests' output and its own events back up: past `timeout_s` on
    one event the client is taken as gone (what it was sent cannot be delivered) and the connection
    ends, releasing its slot, its tasks and its conversation, and aborting its requests. (On
    /v1/realtime hypercorn's write is bounded by the same timeout: transports/send_guard.py.)"""

    def __init__(self, socket: RealtimeSocket, timeout_s: float | None):
        self._socket, self._timeout_s = socket, timeout_s

    async def send(self, text: str) -> None:
        with trio.move_on_after(math.inf if self._timeout_s is None else self._timeout_s) as waited:
            await self._socket.send(text)
        if waited.cancelled_caught:
            log.info("realtime client took no event for %.1f s: closing", self._timeout_s)
            raise trio.BrokenResourceError("the client stopped reading")

    async def close(self, code: int, reason: str) -> None:
        with trio.move_on_after(math.inf if self._timeout_s is None else self._timeout_s):
            await self._socket.close(code, reason)


async def _keepalive(socket: RealtimeSocket, interval_s: float, scope: trio.CancelScope) -> None:
    """Ping every interval; a pong must come back within one (else the peer is gone: close)."""
    while True:
        await trio.sleep(interval_s)
        with trio.move_on_after(interval_s) as waited:
            try:
                await socket.ping()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
        if waited.cancelled_caught:
            log.info("realtime client sent no pong within %.1f s: closing", interval_s)
            await socket.close(CLOSE_GOING_AWAY, "no pong")
            scope.cancel()
            return
