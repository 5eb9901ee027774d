"""The OpenAI-compatible HTTP app: quart-trio, served by hypercorn with the trio worker.

    POST /v1/chat/completions, /v1/completions   JSON in; JSON, or SSE when "stream": true
         the same with an NDJSON body            streaming input, Mode A (transports/streaming_input.py)
    /v1/streaming_input/sessions/...             streaming input, Mode B (the same module)
    POST /v1/audio/transcriptions                 speech to text (transports/audio_http.py)
    POST /v1/audio/speech, GET /v1/audio/voices    text to speech (transports/speech_http.py)
    WS   /v1/audio/speech/stream                  text in pieces, speech in pieces (transports/speech_stream_ws.py)
    POST /v1/responses                            OpenAI's Responses API (transports/responses_http.py)
    POST /v1/embeddings                           pooled hidden states (transports/embeddings_http.py)
    POST /v1/messages, /v1/messages/count_tokens  Anthropic's Messages API (transports/anthropic_http.py)
    GET  /v1/models, /v1/models/{model}, /health, /metrics
    POST /tokenize, /detokenize

`create_app(engine=...)` serves an engine its caller runs (`rill serve` does, from its root
nursery). `create_app()` opens one itself for the app's lifetime, so that
`hypercorn --worker-class trio 'rill.transports.http:create_app()'` works (RILL_* variables
configure it). Request logic lives in rill.openai; this module is the wire.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import msgspec
import trio
from quart import Blueprint, Response, current_app, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.gc_heap import freeze_startup_heap, thaw_heap
from rill.live_video.config import LiveVideoConfig
from rill.media.policy import MediaPolicy
from rill.openai import sse
from rill.openai.chat import complete_chat, load_chat_media, message_dict, prepare_chat, stream_chat, tool_dicts
from rill.openai.chat_media import load_media, parse_limits
from rill.openai.completions import complete, prepare_completion, stream_completion
from rill.openai.errors import ApiError, from_status
from rill.openai.requests import DetokenizeRequest, TokenizeRequest
from rill.openai.responses_api.config import ResponsesConfig
from rill.openai.chat_bodies import DetokenizeResponse, ModelList, TokenizeResponse
from rill.openai.served_models import ServedModels
from rill.openai.serving import (
    MAX_SEQUENCES_PER_REQUEST, Serving, ServingOptions, api_error, current_trace, decode_body,
)
from rill.openai.streaming import attach as attach_streaming_input
from rill.scaling.replica import id_prefix
from rill.sessions import SessionManager, StreamingInputConfig
from rill.sessions.ndjson import CONTENT_TYPE as NDJSON
from rill.transports import hypercorn_ws
from rill.anthropic.errors import authentication_error, key_matches
from rill.transports.api_keys import OPEN_PATHS, bearer_matches
from rill.transports.cross_site import CrossSitePolicy, guard
from rill.transports.draining import Draining
from rill.transports.body_gate import BUDGET_KEY as BODY_BUDGET
from rill.transports.body_gate import BodyBudget, GatedRequest
from rill.transports.keepalive import keep_alive_safe
from rill.transports.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rill.transports.metrics import Metrics
from rill.transports.realtime.driver import RealtimeConfig
from rill.transports.realtime.quart_route import install_realtime
from rill.transports.web import install_web

log = logging.getLogger("rill.server")

MAX_BODY_BYTES = 16 << 20
ANTHROPIC_PATHS = ("/v1/messages",)  # their key may come as x-api-key (transports/anthropic_http.py)
MAX_BODY_BYTES_IN_FLIGHT = 512 << 20
KEEP_ALIVE_TIMEOUT_S = 20.0  # ServerConfig.keep_alive_timeout_s


@dataclass
class ServerConfig:
    """What the HTTP layer needs besides the engine. `rill serve` fills it from flags and RILL_*."""

    api_key: str | None = None
    max_waiting: int | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    # All request bodies being read at once (transports/body_gate.py): past it, 503 at once
    max_body_bytes_in_flight: int = MAX_BODY_BYTES_IN_FLIGHT
    max_sequences_per_request: int = MAX_SEQUENCES_PER_REQUEST  # prompts x n of one request; past it, 400
    served_model_names: list[str] = field(default_factory=list)
    tool_call_parser: str | None = "hermes"
    reasoning_parser: str | None = None
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)  # /v1/realtime and --ws-port
    web_ui: bool = True  # GET /: the web page (transports/web.py); --no-web-ui: 404 there
    # Slow and oversized clients (hypercorn's and Quart's own limits): a connection that has not
    # sent a request's headers within the keep-alive timeout is closed (slow headers too); a JSON
    # body must arrive within body_timeout_s (408); headers past max_header_bytes are a 431.
    # read_timeout_s closes a connection that sends nothing for that long: off by default, since
    # an SSE reader sends nothing while a long answer streams.
    # Longer than the idle expiry of common clients' connection pools (httpx, and so the openai SDK: 5 s;
    # aiohttp: 15 s): with equal timeouts a request sent on a connection the pool still thinks alive, as
    # the server's timer fires, meets a closed connection ("Server disconnected", a reset), most often
    # when the event loop is busy and runs the timer late. Behind a proxy that keeps upstream
    # connections, set it above the proxy's idle timeout.
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S
    body_timeout_s: float = 60.0
    max_header_bytes: int = 16 << 10
    read_timeout_s: float | None = None
    # A client that stops reading: a write to it that takes longer than this closes its connection
    # (its request is aborted as on a disconnect; transports/send_guard.py). None: no limit.
    send_timeout_s: float | None = 30.0
    # Connections the kernel may hold for the accept loop: hypercorn's default of 100 made 256 clients
    # connecting at once get resets (the handshake's last ACK dropped while the queue was full, the
    # request then refused); 2048 is uvicorn's default. Linux caps it at net.core.somaxconn.
    backlog: int = 2048
    streaming_input: StreamingInputConfig = field(default_factory=StreamingInputConfig)  # Mode A and B
    max_audio_bytes: int = 25 * 1000 * 1000  # /v1/audio/transcriptions' file limit, OpenAI's 25 MB
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)  # stored and background responses
    media: MediaPolicy = field(default_factory=MediaPolicy)  # image/video sources and limits (rill.media)
    limit_mm_per_prompt: dict[str, int] | None = None  # images, videos per prompt (None: chat_media's defaults)
    live_video: LiveVideoConfig = field(default_factory=LiveVideoConfig)  # frame streams (rill.live_video)
    # behind a load balancer (rill.scaling): session and stored-response ids start with "NAME."
    replica_id: str | None = None
    # web pages against a keyless server (rill.transports.cross_site): names besides IP literals and
    # localhost that the Host header may carry; origins that may call it, with CORS (none by default)
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> ServerConfig:
        env = os.environ.get
        waiting = env("RILL_MAX_WAITING")
        names = env("RILL_SERVED_MODEL_NAME")
        return cls(
            api_key=env("RILL_API_KEY") or None,
            max_waiting=int(waiting) if waiting else None,
            max_body_bytes=int(env("RILL_MAX_BODY_BYTES", MAX_BODY_BYTES)),
            max_body_bytes_in_flight=int(env("RILL_MAX_BODY_BYTES_IN_FLIGHT", MAX_BODY_BYTES_IN_FLIGHT)),
            max_sequences_per_request=int(env("RILL_MAX_SEQUENCES_PER_REQUEST", MAX_SEQUENCES_PER_REQUEST)),
            served_model_names=names.split(",") if names else [],
            tool_call_parser=_parser_option(env("RILL_TOOL_CALL_PARSER", "hermes")),
            reasoning_parser=_parser_option(env("RILL_REASONING_PARSER", "none")),
            realtime=RealtimeConfig.from_env(),
            web_ui=not env("RILL_NO_WEB_UI"),
            streaming_input=StreamingInputConfig.from_env(),
            keep_alive_timeout_s=float(env("RILL_KEEP_ALIVE_TIMEOUT_S", KEEP_ALIVE_TIMEOUT_S)),
            body_timeout_s=float(env("RILL_BODY_TIMEOUT_S", 60.0)),
            max_header_bytes=int(env("RILL_MAX_HEADER_BYTES", 16 << 10)),
            read_timeout_s=float(env("RILL_READ_TIMEOUT_S")) if env("RILL_READ_TIMEOUT_S") else None,
            send_timeout_s=send_timeout_option(env("RILL_SEND_TIMEOUT_S", "30")),
            backlog=int(env("RILL_BACKLOG", 2048)),
            max_audio_bytes=int(env("RILL_MAX_AUDIO_BYTES", 25 * 1000 * 1000)),
            responses=ResponsesConfig.from_env(),
            media=MediaPolicy.from_env(),
            limit_mm_per_prompt=parse_limits(env("RILL_LIMIT_MM_PER_PROMPT", "")),
            live_video=LiveVideoConfig.from_env(),
            replica_id=env("RILL_REPLICA_ID") or None,
            allowed_hosts=_names(env("RILL_ALLOWED_HOSTS", "")),
            allowed_origins=_names(env("RILL_ALLOWED_ORIGINS", "")),
        )

    def serving_options(self, served_model_names: list[str] | None = None) -> ServingOptions:
        """Options of a Serving: served under `served_model_names` (one of several models), else the server's."""
        names = self.served_model_names if served_model_names is None else served_model_names
        return ServingOptions(names, self.tool_call_parser, self.reasoning_parser,
                              self.max_waiting, self.media, self.limit_mm_per_prompt or parse_limits(""),
                              self.live_video, self.max_sequences_per_request)


def send_timeout_option(value: str | float) -> float | None:
    """--send-timeout-s: 0 or none is no limit."""
    return None if str(value).lower() in ("0", "0.0", "none") else float(value)


def _names(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


def _parser_option(value: str) -> str | None:
    return None if value.lower() in ("", "none") else value


class AppState:
    """The engine-facing parts of one app; `models` (rill.openai.served_models) is set once the engines run."""

    def __init__(self, server: ServerConfig, num_models: int = 1):
        self.server = server
        self.metrics = Metrics(label_models=num_models > 1)  # several models: series labelled model_name
        self.models: ServedModels | None = None
        self.speech = None  # rill.transports.audio_http.SpeechServing, set by create_app
        self.speech_out = None  # the voice: rill.tts.worker.SpeechOut (rill serve --tts-model), or None
        self.responses = None  # rill.openai.responses_api.background.Responses, set by create_app
        self._stop = trio.Event()
        self.id_prefix = id_prefix(server.replica_id)  # "NAME." on the ids of state this replica holds
        self.sessions = SessionManager(server.streaming_input, id_prefix=self.id_prefix)  # reaper: app nursery
        attach_streaming_input(self.sessions)
        self.metrics.attach_sessions(self.sessions)
        self.open_paths = OPEN_PATHS  # routes that need no API key; the web page's files join them
        self.cross_site = CrossSitePolicy.make(api_key=server.api_key, allowed_hosts=server.allowed_hosts,
                                               allowed_origins=server.allowed_origins)
        self.draining = Draining()  # SSE streams a shutdown ends with an error event (rill.server)

    @property
    def serving(self) -> Serving | None:
        """The default model's Serving (the only one, unless rill serve --model was given several times)."""
        return None if self.models is None else self.models.default

    def serving_for(self, name: str | None) -> Serving:
        """The Serving a request naming `name` runs on (rill.openai.served_models.ServedModels.route)."""
        return self.models.route(name)

    def attach(self, engine) -> None:
        self.attach_models([(None, engine)])

    def attach_models(self, models: list[tuple[list[str] | None, object]]) -> None:
        """(served names, engine) pairs, default first; names None: the server's --served-model-name."""
        servings = []
        for names, engine in models:
            serving = Serving(engine, self.server.serving_options(names), on_done=self.metrics.on_request_done)
            self.metrics.attach(engine, serving.model_names[0])
            self.metrics.attach_live_video(serving.live_video, engine, serving.model_names[0])
            servings.append(serving)
        self.models = ServedModels(servings)

    async def run_engine(self, config: EngineConfig, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with open_engine(config) as engine:
            self.attach(engine)
            freeze_startup_heap()  # as `rill serve` does (rill.gc_heap)
            task_status.started()
            try:
                await self._stop.wait()
            finally:
                thaw_heap()

    async def stop_engine(self) -> None:  # async: Quart runs sync hooks in a worker thread
        self._stop.set()


def create_app(config: EngineConfig | None = None, server: ServerConfig | None = None, *, engine=None,
               speech=None, models: list[tuple[list[str], object]] | None = None, speech_out=None) -> QuartTrio:
    """The app. With `engine`, serve it; with `models`, (served names, engine) pairs its caller runs, serve
    each by name, the first by default; otherwise open one from `config` (default: RILL_MODEL or rill-tiny).
    `speech` (an AsyncSpeechEngine its caller runs) serves /v1/audio/transcriptions; None: 404 there.
    `speech_out` (a rill.tts.worker.SpeechOut its caller runs) is the voice: /v1/audio/speech, spoken answers."""
    app = QuartTrio("rill")
    hypercorn_ws.install()  # keepalive that ends with the WebSocket and closes dead peers; no deflate
    state = AppState(server or ServerConfig.from_env(), num_models=len(models or ()) or 1)
    # Host, Origin and CORS first: a refusal is answered before anything reads (or waits for) the body; a
    # body still coming then closes the connection (hypercorn), which no Quart task is left to cancel.
    app.asgi_app = guard(keep_alive_safe(app.asgi_app), state.cross_site)
    # Streams last as long as generation does: no response timeout.
    app.config.update(MAX_CONTENT_LENGTH=state.server.max_body_bytes, RESPONSE_TIMEOUT=None,
                      BODY_TIMEOUT=state.server.body_timeout_s)
    app.extensions["rill"] = state
    state.speech_out = speech_out
    app.request_class = GatedRequest  # bodies read when a handler asks, within a budget (transports/body_gate.py)
    app.extensions[BODY_BUDGET] = BodyBudget(state.server.max_body_bytes_in_flight)
    app.register_blueprint(api)
    if state.server.web_ui:
        state.open_paths = OPEN_PATHS | install_web(app)
    hub = install_realtime(app, state.server.realtime, state.server.api_key, lambda: state.models,
                           lambda: state.speech.engine if state.speech is not None else None,
                           lambda: getattr(state, "speech_out", None))  # the server's one voice: spoken answers
    state.metrics.attach_realtime(hub)
    hub.cross_site = state.cross_site  # both WebSocket listeners check Host and Origin at the upgrade
    _install_streaming_input(app, state)
    _install_transcriptions(app, state, speech)
    _install_responses_store(app, state)
    _install_responses(app)
    _install_embeddings(app)
    _install_anthropic(app)
    _install_speech_stream(app, state)
    _install_speech(app)
    app.register_error_handler(HTTPException, _http_error)
    if models is not None:
        state.attach_models(models)
    elif engine is not None:
        state.attach(engine)
    else:
        config = config or EngineConfig(model=os.environ.get("RILL_MODEL", "rill-tiny"))

        async def start_engine() -> None:
            await app.nursery.start(state.run_engine, config)

        app.before_serving(start_engine)
        app.after_serving(state.stop_engine)
    return app


def _install_streaming_input(app: QuartTrio, state: AppState) -> None:
    from rill.transports.streaming_input import streaming_input_api  # it imports this module

    async def start_sessions() -> None:
        await app.nursery.start(state.sessions.run)

    app.register_blueprint(streaming_input_api)
    app.before_serving(start_sessions)
    app.after_serving(state.sessions.stop)


def _install_responses_store(app: QuartTrio, state: AppState) -> None:
    from rill.transports.responses_store_http import install_responses_store  # it imports this module

    install_responses_store(app, state)


def _install_responses(app: QuartTrio) -> None:
    from rill.transports.responses_http import responses_api  # it imports this module

    app.register_blueprint(responses_api)


def _install_embeddings(app: QuartTrio) -> None:
    from rill.transports.embeddings_http import embeddings_api  # it imports this module

    app.register_blueprint(embeddings_api)


def _install_anthropic(app: QuartTrio) -> None:
    from rill.transports.anthropic_http import anthropic_api  # it imports this module

    app.register_blueprint(anthropic_api)


def _install_speech_stream(app: QuartTrio, state: AppState) -> None:
    from rill.transports.speech_stream_ws import install_speech_stream  # it imports rill.tts

    install_speech_stream(app, lambda: getattr(state, "speech_out", None))


def _install_speech(app: QuartTrio) -> None:
    from rill.transports.speech_http import install_speech  # it imports this module

    install_speech(app)


def _install_transcriptions(app: QuartTrio, state: AppState, speech) -> None:
    from rill.transports.audio_http import install_transcriptions  # it imports this module

    state.speech = install_transcriptions(app, speech, state.server.max_audio_bytes)


api = Blueprint("openai", __name__)


def _state() -> AppState:
    return current_app.extensions["rill"]


def _json(value, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(value), status=status, headers=headers, content_type="application/json")


def _error(error: ApiError) -> Response:
    return _json(error.body, error.status, error.headers)


async def _http_error(exc: HTTPException) -> Response:
    return _error(from_status(exc.code or 500, exc.description))


# -- one log line per request ----------------------------------------------------------------------------------

@api.before_app_request
async def _start_clock() -> None:
    g.rill_start_s = time.monotonic()


@api.after_app_request
async def _log_request(response: Response) -> Response:
    """One line for each request that made no trace (generation logs a fuller one when it ends):
    other routes, unknown paths, 401s, 405s, bodies refused before parsing."""
    if current_trace.get() is None:
        total_ms = (time.monotonic() - g.rill_start_s) * 1e3
        log.info("%s %s status=%d total_ms=%.1f", request.method, request.path, response.status_code, total_ms)
    return response


@api.after_app_request
async def _name_replica(response: Response) -> Response:
    """X-Rill-Replica: which replica answered, behind a load balancer (rill serve --replica-id)."""
    if (name := _state().server.replica_id) is not None:
        response.headers["X-Rill-Replica"] = name
    return response


# -- auth ------------------------------------------------------------------------------------------------------


@api.before_app_request
async def _authenticate() -> Response | None:
    key = _state().server.api_key
    if key is None or request.path in _state().open_paths:
        return None
    if request.path.startswith(ANTHROPIC_PATHS):  # Anthropic's clients: x-api-key, or Bearer (SDK 2.x)
        return _anthropic_auth(key)
    if bearer_matches(request.headers.get("Authorization", ""), key):
        return None
    return _error(ApiError(401, "a valid API key is required: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key"))


def _anthropic_auth(key: str) -> Response | None:
    from rill.transports.anthropic_http import anthropic_error  # it imports this module

    if key_matches(request.headers.get("x-api-key"), request.headers.get("Authorization"), key):
        return None
    return anthropic_error(authentication_error())


# -- generation ------------------------------------------------------------------------------------------------


async def traced(endpoint: str, prefix: str, respond, render_error=None) -> Response:
    """One request to a model: its body read, the served model it names found, and `respond(serving, trace,
    body)` awaited. A Response it returns (a stream, which finishes the trace itself) goes out as it is; any
    other result is the JSON answer. The trace ends with the status: 499 when the client left, the error's
    for a failure, which `render_error` writes in its API's shape (OpenAI's by default)."""
    serving = _state().serving
    trace = serving.new_trace(endpoint, prefix)
    try:
        body = await request.get_data()  # past the body limit: a 413
        serving = _state().models.route_body(body)  # the model it names; the trace goes with it (ids are per process)
        result = await respond(serving, trace, body)
    except trio.Cancelled:
        serving.finish(trace, 499)  # the client left
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes an error body in the API's shape
        error = _as_api_error(exc)
        serving.finish(trace, error.status)
        return (render_error or _error)(error)
    if isinstance(result, Response):
        return result
    serving.finish(trace, 200)
    return _json(result)


async def _generate(endpoint: str, prefix: str, prepare, stream, answer) -> Response:
    async def respond(serving, trace, body):
        job = await serving.prepare(prepare, trace, body)  # a large body off the trio thread
        if getattr(job, "media", None) is not None:
            await load_chat_media(serving, job)  # images and videos decoded off the trio thread; a 400 here
        return _sse(stream(serving, job)) if job.request.stream else await answer(serving, job)

    return await traced(endpoint, prefix, respond)


def _as_api_error(exc: Exception) -> ApiError:
    if isinstance(exc, HTTPException):  # 413 from the body limit
        return from_status(exc.code or 500, exc.description)
    return api_error(exc)


def _sse(frames) -> Response:
    frames = _state().draining.frames(frames)  # a shutdown ends it with an error event (transports/draining.py)
    return Response(frames, content_type=sse.CONTENT_TYPE,
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@api.post("/v1/chat/completions")
async def chat_completions() -> Response:
    if _is_ndjson():
        return await _mode_a("chat")
    return await _generate("/v1/chat/completions", "chatcmpl", prepare_chat, stream_chat, complete_chat)


@api.post("/v1/completions")
async def completions() -> Response:
    if _is_ndjson():
        return await _mode_a("completions")
    return await _generate("/v1/completions", "cmpl", prepare_completion, stream_completion, complete)


def _is_ndjson() -> bool:
    return request.mimetype == NDJSON


async def _mode_a(api_name: str) -> Response:
    """Streaming input in one request: NDJSON lines (rill.transports.streaming_input)."""
    from rill.transports.streaming_input import handle_mode_a  # it imports this module

    return await handle_mode_a(api_name)


# -- the rest ----------------------------------------------------------------------------------------------------


@api.get("/v1/models")
async def models() -> Response:
    from rill.transports.speech_http import model_cards as voice_cards

    state = _state()
    voices = voice_cards(state.speech_out, state.speech.created)
    return _json(ModelList(state.models.model_cards() + state.speech.model_cards() + voices))


@api.get("/v1/models/<path:model>")  # path: a served name may be a directory, slashes and all
async def model(model: str) -> Response:
    try:
        return _json(_state().models.model_card(model))
    except ApiError as exc:
        from rill.transports.speech_http import model_cards as voice_cards

        state = _state()
        cards = state.speech.model_cards() + voice_cards(state.speech_out, state.speech.created)
        card = next((c for c in cards if c.id == model), None)  # the speech model or the voice, when it is that one
        return _error(exc) if card is None else _json(card)


@api.get("/health")
async def health() -> Response:
    models = _state().models
    serving = None if models is None else models.first_dead()
    if models is None or serving is not None:  # one engine down takes the server down (rill.server)
        dead = None if serving is None else serving.engine.dead
        return _error(ApiError(503, f"the engine is not running: {dead!r}", code="engine_dead"))
    return Response(b"", status=200)


@api.get("/metrics")
async def metrics() -> Response:
    return Response(_state().metrics.render(), content_type=METRICS_CONTENT_TYPE)


@api.post("/tokenize")
async def tokenize() -> Response:
    serving = _state().serving
    try:
        req = decode_body(await request.get_data(), TokenizeRequest)
        serving = _state().models.route(req.model)
        serving.check_model(req.model)
        ids = await _tokenize(serving, req)
    except Exception as exc:  # noqa: BLE001
        return _error(_as_api_error(exc))
    return _json(TokenizeResponse(ids, len(ids), serving.max_model_len))


async def _tokenize(serving: Serving, req: TokenizeRequest) -> list[int]:
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(400, "send exactly one of prompt and messages", param="prompt", code="invalid_value")
    if req.prompt is not None:
        return serving.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    tools = None if req.tools is None else tool_dicts(req.tools)
    media = serving.media_parts()
    ids = serving.tokenizer.encode_chat(
        [message_dict(m, i, media) for i, m in enumerate(req.messages)], tools=tools,
        add_generation_prompt=req.add_generation_prompt, chat_template_kwargs=req.chat_template_kwargs,
    )
    if not media.refs:
        return ids
    # an image counts its placeholders, as the model sees them (vLLM's /tokenize does the same)
    return (await load_media(ids, media.refs, serving.options.media, serving.mm_inputs))[0]


@api.post("/detokenize")
async def detokenize() -> Response:
    serving = _state().serving
    try:
        req = decode_body(await request.get_data(), DetokenizeRequest)
        serving = _state().models.route(req.model)
        serving.check_model(req.model)
        _check_token_ids(req.tokens, serving.vocab_size)
    except Exception as exc:  # noqa: BLE001
        return _error(_as_api_error(exc))
    return _json(DetokenizeResponse(serving.tokenizer.decode(req.tokens, skip_special_tokens=False)))


def _check_token_ids(ids: list[int], vocab_size: int) -> None:
    for i, token_id in enumerate(ids):
        if not 0 <= token_id < vocab_size:
            raise ApiError(400, f"token id {token_id} is outside the vocabulary (0 to {vocab_size - 1})",
                           param=f"tokens[{i}]", code="invalid_value")
