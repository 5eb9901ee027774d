"""Streaming input over HTTP: the wire of Mode A and Mode B (the logic is rill.openai.streaming).

Mode A: POST /v1/chat/completions or /v1/completions with Content-Type: application/x-ndjson.
        Line 1 is the request, each later line an InputChunk; the response is the usual SSE
        stream (or JSON with "stream": false).
Mode B: /v1/streaming_input/sessions: create (201), chunks (202), finish, events (SSE with
        ids, resumable), result (200 done / 202 running), state, delete.

A session belongs to the API key that created it (a hash of its bearer token); other keys get 404.
"""

from __future__ import annotations

import hashlib
from collections import deque

import msgspec
import trio
from quart import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from rill.openai.errors import ApiError
from rill.openai.serving import decode_body
from rill.openai.streaming import StreamRun, as_api_error, open_run
from rill.openai.streaming_prompt import APIS, StreamingOptionsOnly
from rill.openai.streaming_video import VideoStatus
from rill.sessions.chunks import InputChunk
from rill.sessions.config import OutputMode
from rill.sessions.ndjson import Line, NdjsonFramer
from rill.sessions.output import with_id
from rill.sessions.session import StreamingSession
from rill.sessions.state import CloseReason, SessionState
from rill.transports.http import _as_api_error, _error, _json, _sse, _state

SESSIONS = "/v1/streaming_input/sessions"
# A chunk line holds its payload JSON-escaped (up to 6 bytes per byte, \\uXXXX) plus its fields.
_LINE_OVERHEAD_BYTES = 1024

streaming_input_api = Blueprint("streaming_input", __name__)


class SessionCreated(msgspec.Struct):
    session_id: str
    expires_in: float
    state: SessionState
    started: bool
    next_sequence_id: int
    object: str = "streaming_input.session"


class ChunkAccepted(msgspec.Struct):
    started: bool
    next_sequence_id: int
    state: SessionState


class SessionStatus(msgspec.Struct):
    session_id: str
    state: SessionState
    close_reason: CloseReason | None
    created_at: float
    expires_in: float | None
    started: bool
    next_sequence_id: int
    num_pending_chunks: int
    num_chunks_received: int
    num_payload_bytes: int
    object: str = "streaming_input.session"
    transcript: str | None = None  # audio chunks: the words recognised so far
    video: VideoStatus | None = None  # image and video chunks: frames received, dropped, in the context


class FinishRequest(msgspec.Struct, forbid_unknown_fields=True):
    last_sequence_id: int | None = None  # ids up to it must have arrived


def owner() -> str | None:
    """Who the caller is for session visibility: a hash of the bearer token (checked already when
    the server requires keys), or None for callers without one."""
    given = request.headers.get("Authorization", "")
    return hashlib.sha256(given.encode()).hexdigest()[:32] if given else None


def _started(session: StreamingSession) -> bool:
    return session.state is not SessionState.OPEN


def _manager():
    return _state().sessions


# -- Mode B ------------------------------------------------------------------------------------------------


@streaming_input_api.before_request
async def _enabled() -> Response | None:
    if not _manager().config.enabled:
        return _error(ApiError(404, "streaming input is disabled on this server", code="streaming_input_disabled"))
    return None


@streaming_input_api.errorhandler(Exception)
async def _failed(exc: Exception) -> Response:
    return _error(_api_error(exc))


def _api_error(exc: Exception) -> ApiError:
    """Session errors keep their status; framework errors (413 body limit) theirs; the rest as elsewhere."""
    return _as_api_error(exc) if isinstance(exc, HTTPException) else as_api_error(exc)


@streaming_input_api.post(SESSIONS)
async def create_session() -> Response:
    body = await request.get_data()
    options = decode_body(body, StreamingOptionsOnly).streaming_input
    api = APIS.get(options.api if options else "chat")
    if api is None:
        raise ApiError(400, f"streaming_input.api must be one of {sorted(APIS)}", param="streaming_input.api")
    req = decode_body(body, api.request_type)
    run = open_run(_state().serving_for(req.model), _manager(), api, req, owner(), addressable=True,
                   endpoint=SESSIONS, speech=_speech_engine(), voice_out=_voice_out())
    session = run.session
    created = SessionCreated(session.session_id, session.timeout_s, session.state, _started(session),
                             session.next_sequence_id)
    return _json(created, 201, {"Location": f"{SESSIONS}/{session.session_id}"})


def _session(session_id: str) -> StreamingSession:
    return _manager().get(session_id, owner())


@streaming_input_api.post(f"{SESSIONS}/<session_id>/chunks")
async def add_chunk(session_id: str) -> Response:
    session = _session(session_id)
    chunk = decode_body(await request.get_data(), InputChunk)
    if chunk.sequence_id is None:
        raise ApiError(400, "sequence_id is required", param="sequence_id", code="missing_required_parameter")
    await session.run.prepare(chunk)  # a frame is decoded first: a bad one is refused alone
    session.run.push(chunk)
    return _json(ChunkAccepted(_started(session), session.next_sequence_id, session.state), 202)


@streaming_input_api.post(f"{SESSIONS}/<session_id>/finish")
async def finish(session_id: str) -> Response:
    session = _session(session_id)
    body = await request.get_data()
    last = decode_body(body, FinishRequest).last_sequence_id if body.strip() else None
    session.run.finish(last)
    return _json(_status(session), 202)


@streaming_input_api.get(f"{SESSIONS}/<session_id>/events")
async def events(session_id: str) -> Response:
    session = _session(session_id)
    start = _resume_index(request.headers.get("Last-Event-ID"))

    async def frames():
        async for i, frame in session.output.follow(start):
            yield with_id(i, frame)

    return _sse(frames())


def _resume_index(last_event_id: str | None) -> int:
    if last_event_id is None:
        return 0  # replay from the start
    if not last_event_id.strip().isdigit():
        raise ApiError(400, f"Last-Event-ID {last_event_id!r} is not an event id of this stream",
                       param="Last-Event-ID")
    return int(last_event_id) + 1


@streaming_input_api.get(f"{SESSIONS}/<session_id>/result")
async def result(session_id: str) -> Response:
    session = _session(session_id)
    if not session.output.is_closed:
        return _json(_status(session), 202, {"Retry-After": "1"})
    return _json(await session.run.result())


@streaming_input_api.get(f"{SESSIONS}/<session_id>")
async def status(session_id: str) -> Response:
    return _json(_status(_session(session_id)))


def _status(session: StreamingSession) -> SessionStatus:
    return SessionStatus(
        session.session_id, session.state, session.close_reason, session.created_at,
        session.expires_in_s(_manager().clock()), _started(session), session.next_sequence_id,
        session.window.num_pending, session.num_chunks_received, session.num_payload_bytes,
        transcript=session.run.audio.transcript if session.run is not None and session.run.audio is not None else None,
        video=session.run.video.status() if session.run is not None and session.run.video is not None else None,
    )


@streaming_input_api.delete(f"{SESSIONS}/<session_id>")
async def delete(session_id: str) -> Response:
    """Abort; idempotent (a deleted or expired session deletes again with 204)."""
    manager = _manager()
    if not manager.is_gone(session_id, owner()):
        manager.close(_session(session_id), CloseReason.DELETED)
    return Response(b"", status=204)


# -- Mode A ------------------------------------------------------------------------------------------------


async def handle_mode_a(api_name: str) -> Response:
    """One NDJSON request: line 1 the request, later lines chunks. Every error before the answer
    starts is an HTTP error naming the line; the body's end is the end of input."""
    state, api = _state(), APIS[api_name]
    if not state.sessions.config.enabled:
        return _error(ApiError(415, "streaming input is disabled on this server", code="streaming_input_disabled"))
    lines = BodyLines(request.body, NdjsonFramer(state.server.max_body_bytes))
    run: StreamRun | None = None
    try:
        run = await _open_from_first_line(api, lines)
        return await _answer(run, lines)
    except Exception as exc:  # noqa: BLE001 - nothing was sent yet: an HTTP error
        error = _mode_a_error(run, exc)
        if run is not None:
            _fail(run, error)
        return _error(error)
    except BaseException:  # cancelled: the client left mid-upload
        if run is not None:
            state.sessions.close(run.session, CloseReason.CLIENT_GONE)
        raise


async def _open_from_first_line(api, lines: BodyLines) -> StreamRun:
    first = await lines.next()
    if first is None:
        raise ApiError(400, "the body is empty: line 1 must be the request", code="invalid_ndjson_line")
    req = _at_line(first.number, decode_body, first.data, api.request_type)
    lines.framer.max_line_bytes = _manager().config.max_chunk_bytes * 6 + _LINE_OVERHEAD_BYTES
    return open_run(_state().serving_for(req.model), _manager(), api, req, owner(), addressable=False,
                    endpoint=api.endpoint, speech=_speech_engine(), voice_out=_voice_out())


def _voice_out():
    """The server's speech-out worker, which speaks answers that ask for audio; None when it has no voice."""
    return getattr(_state(), "speech_out", None)


def _speech_engine():
    """The served speech model's engine, which hears audio chunks; None when there is none."""
    speech = _state().speech
    return speech.engine if speech is not None else None


async def _answer(run: StreamRun, lines: BodyLines) -> Response:
    if run.mode is OutputMode.RESPOND_PER_CHUNK:  # answers stream while the body still arrives
        _manager().start_soon(_read_input_or_fail, run, lines)
        return _sse(_follow(run))
    await _read_input(run, lines)
    if run.job.request.stream:
        return _sse(_follow(run))
    return _json(await run.result())


async def _read_input(run: StreamRun, lines: BodyLines) -> None:
    """Chunks into the run until end_of_input or the body's end; cancelled if the session closes."""
    with trio.CancelScope() as scope:
        run.input_scope = scope
        num_chunks = 0
        while True:
            await run.wait_for_audio_room()  # spoken input is read no faster than it is recognised
            if (line := await lines.next()) is None:
                run.finish()  # the body ended: that is the end of input
                break
            chunk = _at_line(line.number, decode_body, line.data, InputChunk)
            if chunk.sequence_id is None:  # Mode A numbers chunks by their order in the body
                chunk = msgspec.structs.replace(chunk, sequence_id=num_chunks)
            num_chunks += 1
            try:
                await run.prepare(chunk)  # a frame is decoded off the trio thread first
            except Exception as exc:  # noqa: BLE001 - raised again, naming the line
                _at_line(line.number, _raise, exc)
            _at_line(line.number, run.push, chunk)
            if run.session.state is not SessionState.OPEN and run.session.state is not SessionState.STARTED:
                break
    run.input_scope = None
    if scope.cancelled_caught:
        raise run.closed_error()


async def _read_input_or_fail(run: StreamRun, lines: BodyLines) -> None:
    try:
        await _read_input(run, lines)
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error goes in it
        _fail(run, _mode_a_error(run, exc))


class BodyLines:
    """A request body's NDJSON lines as they arrive. An object rather than an async generator:
    reading stops at end_of_input and the rest of the body is left unread."""

    def __init__(self, body, framer: NdjsonFramer):
        self.framer = framer
        self._body = body
        self._ready: deque[Line] = deque()
        self._ended = False

    async def next(self) -> Line | None:
        while not self._ready and not self._ended:
            try:
                self._ready.extend(self.framer.feed(await anext(self._body)))
            except StopAsyncIteration:
                self._ended = True
                self._ready.extend(self.framer.close())
        return self._ready.popleft() if self._ready else None


async def _follow(run: StreamRun):
    """The run's frames as they come; a reader that leaves early aborts the run."""
    try:
        async for _, frame in run.session.output.follow():
            yield frame
    finally:
        run.manager.close(run.session, CloseReason.CLIENT_GONE)  # no-op once it completed


def _raise(exc: Exception):
    raise exc


def _at_line(number: int, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        error = _api_error(exc)
        raise ApiError(error.status, f"line {number}: {error.message}", param=error.param, code=error.code) from exc


def _mode_a_error(run: StreamRun | None, exc: Exception) -> ApiError:
    if run is not None and run.session.close_reason is CloseReason.EXPIRED and run.error is None:
        timeout_s = run.session.timeout_s
        return ApiError(408, f"no input line for {timeout_s:g} s (the session timeout); the request is closed",
                        code="session_expired")
    return _api_error(exc)


def _fail(run: StreamRun, error: ApiError) -> None:
    run.error = run.error or error
    run.manager.close(run.session, CloseReason.FAILED)
