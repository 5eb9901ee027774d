"""Stored responses over HTTP (the Responses API's routes besides POST /v1/responses):

    GET    /v1/responses/{id}                 the response object (a background run's current state)
    GET    /v1/responses/{id}?stream=true&starting_after=N
                                              a background run's events after sequence number N, then
                                              the live ones until it ends (SSE with `event:` lines)
    DELETE /v1/responses/{id}                 forget it (a run in flight is cancelled first)
    POST   /v1/responses/{id}/cancel          cancel a background run: status "cancelled", KV freed
    GET    /v1/responses/{id}/input_items     its input items, OpenAI's list object (after, limit, order)
    POST   /v1/responses with {"streaming_input": {"session_id": …}}
                                              the answer of a Mode B session as a response
                                              (join_session_response, which POST's route calls first)

A response belongs to the API key that created it (as Mode B sessions do); other keys get 404.
The logic is rill.openai.responses_api; this module is the wire.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
from quart import Blueprint, Response, request
from werkzeug.exceptions import HTTPException

from rill.openai.errors import ApiError, bad_request
from rill.openai.responses_api.background import Responses
from rill.openai.responses_api.event_log import EventsDropped
from rill.openai.responses_api.events import sse_frame
from rill.openai.responses_api.run import ResponsesContext, new_response_id
from rill.openai.responses_api.session_join import JoinedResponse, check_joinable, join_options, names_session
from rill.openai.responses_api.store import StoredResponse, list_page
from rill.openai.serving import Serving
from rill.openai.streaming import StreamRun, as_api_error
from rill.sessions.state import CloseReason
from rill.transports.http import AppState, _as_api_error, _error, _json, _sse, _state
from rill.transports.streaming_input import owner

RESPONSES = "/v1/responses"
MAX_PAGE = 100  # OpenAI's limit on a list page

responses_store_api = Blueprint("responses_store", __name__)


def install_responses_store(app, state: AppState) -> None:
    """The routes, and the background runs' nursery inside the app's (so a shutdown cancels them)."""
    state.responses = Responses(state.server.responses)
    state.metrics.attach_responses(state.responses)

    async def start_runs() -> None:
        await app.nursery.start(state.responses.runs.serve)

    app.register_blueprint(responses_store_api)
    app.before_serving(start_runs)


def _responses() -> Responses:
    return _state().responses


@responses_store_api.errorhandler(Exception)
async def _failed(exc: Exception) -> Response:
    return _error(_as_api_error(exc) if isinstance(exc, HTTPException) else as_api_error(exc))


# -- SSE ---------------------------------------------------------------------------------------------------


def follow_frames(record: StoredResponse, starting_after: int | None = None) -> AsyncIterator[bytes]:
    """A background run's events after `starting_after`, then live ones until it ends. Checked now,
    so that a bad cursor is an HTTP 400 rather than an error inside a stream. A reader that leaves
    does not cancel the run."""
    if record.log is None:
        raise bad_request(f"response {record.id!r} was not created with background: true: it has no "
                          "events to stream; GET it without stream=true", param="stream")
    try:
        record.log.check_resumable(starting_after)
    except EventsDropped as exc:
        raise bad_request(str(exc), param="starting_after") from exc
    return _frames(record, starting_after)


async def _frames(record: StoredResponse, starting_after: int | None) -> AsyncIterator[bytes]:
    try:
        async for event in record.log.follow(starting_after):
            yield sse_frame(event)
    except EventsDropped as exc:  # a reader so slow that the log dropped events it had not read
        yield b"event: error\ndata: " + msgspec.json.encode(
            {"type": "error", "code": "events_dropped", "message": str(exc), "param": None}) + b"\n\n"


# -- a response joining a Mode B session ------------------------------------------------------------------


async def join_session_response(ctx: ResponsesContext, body: bytes) -> Response | None:
    """POST /v1/responses naming a streaming-input session: end its input and answer as a response
    (JSON, or SSE with `stream`); None when the body names no session. A client that leaves before
    the end closes the session, which aborts its engine request, as any stream that is not
    background."""
    if not names_session(body):
        return None
    try:
        req, options = join_options(body)
        named = _state().serving_for(req.model)
        named.check_model(req.model)  # 404 for a name no model has
        run = _joinable_run(options.session_id, ctx.owner, named if req.model is not None else None)
    except Exception as exc:  # noqa: BLE001 - nothing ran yet: an HTTP error
        return _error(_as_api_error(exc) if isinstance(exc, HTTPException) else as_api_error(exc))
    joined = JoinedResponse(run, req, response_id=new_response_id(_state().id_prefix), created_at=int(time.time()))
    if req.stream:
        return _sse(_joined_frames(ctx, joined))
    try:
        async with aclosing(joined.events()) as events:
            async for _ in events:
                pass
    finally:
        _keep_or_close(ctx, joined)
    return _json(joined.final)


def _joinable_run(session_id: str, caller: str | None, named: Serving | None = None) -> StreamRun:
    sessions = _state().sessions
    if not sessions.config.enabled:
        raise ApiError(404, "streaming input is disabled on this server", param="streaming_input.session_id",
                       code="streaming_input_disabled")
    run = sessions.get(session_id, caller).run
    check_joinable(run)
    if named is not None and named is not run.serving:  # several models: the session's answers it
        raise bad_request(f"session {session_id!r} runs on {run.serving.model_names[0]!r}, not on "
                          f"{named.model_names[0]!r}: name its model or none", "model")
    run.finish()  # the end of input (idempotent): the answer starts
    return run


async def _joined_frames(ctx: ResponsesContext, joined: JoinedResponse) -> AsyncIterator[bytes]:
    try:
        async with aclosing(joined.events()) as events:
            async for event in events:
                yield sse_frame(event)
    finally:
        _keep_or_close(ctx, joined)


def _keep_or_close(ctx: ResponsesContext, joined: JoinedResponse) -> None:
    """Store the finished response (unless `store: false`); a reader that left closes the session."""
    if joined.final is None:
        _state().sessions.close(joined.run.session, CloseReason.CLIENT_GONE)  # no-op once it completed
    elif joined.builder.fields["store"] and ctx.store is not None:
        ctx.store.put(joined.final, input_items=joined.input_items(), prior_items=[], owner=ctx.owner)


# -- routes ------------------------------------------------------------------------------------------------


@responses_store_api.get(f"{RESPONSES}/<response_id>")
async def retrieve(response_id: str) -> Response:
    record = _responses().store.get(response_id, owner())
    if _flag("stream"):
        return _sse(follow_frames(record, _int_arg("starting_after", None, minimum=0)))
    return _json(record.response)


@responses_store_api.delete(f"{RESPONSES}/<response_id>")
async def delete(response_id: str) -> Response:
    _responses().runs.delete(response_id, owner())
    return _json({"id": response_id, "object": "response", "deleted": True})


@responses_store_api.post(f"{RESPONSES}/<response_id>/cancel")
async def cancel(response_id: str) -> Response:
    return _json(await _responses().runs.cancel(response_id, owner()))


@responses_store_api.get(f"{RESPONSES}/<response_id>/input_items")
async def input_items(response_id: str) -> Response:
    record = _responses().store.get(response_id, owner())
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc', not {order!r}", param="order")
    limit = _int_arg("limit", 20, minimum=1)
    if limit > MAX_PAGE:
        raise bad_request(f"limit must be at most {MAX_PAGE}", param="limit")
    return _json(list_page(record.input_items, after=request.args.get("after"), limit=limit, order=order))


def _flag(name: str) -> bool:
    value = request.args.get(name, "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise bad_request(f"{name} must be true or false, not {value!r}", param=name)
    return value in ("true", "1")


def _int_arg(name: str, default: int | None, *, minimum: int) -> int | None:
    text = request.args.get(name)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < minimum:
        raise ApiError(400, f"{name} must be an integer >= {minimum}, not {text!r}", param=name,
                       code="invalid_value")
    return int(text)
