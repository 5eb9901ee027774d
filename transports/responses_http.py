"""POST /v1/responses: OpenAI's Responses API on the wire (the logic is rill.openai.responses_api).

    stream false   run, then the response object as JSON (stored when `store`)
    stream true    SSE: `event: <type>` + `data: <event>` per event, sequence numbers from 0
    background     handed to the background runner (responses_api/background.py): the queued
                   response at once, or (with stream) its event log followed live

A client that leaves a non-background response (closed connection, cancelled handler) closes the
run, which aborts the engine request as chat does. The stored-response routes (GET, DELETE, cancel,
input_items) are transports/responses_store_http.py's.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any

from quart import Blueprint, Response, request

from rill.openai.errors import ApiError, bad_request
from rill.openai.responses_api.events import sse_frame
from rill.openai.responses_api.run import (
    ResponseJob, ResponseRun, ResponsesContext, new_response_id, prepare_response,
)
from rill.openai.serving import api_error
from rill.scaling.replica import ROUTED_HEADER, redirect_for
from rill.transports.http import _as_api_error, _error, _json, _sse, _state
from rill.transports.responses_store_http import follow_frames, join_session_response
from rill.transports.streaming_input import owner

ENDPOINT = "/v1/responses"

responses_api = Blueprint("responses", __name__)


def _context() -> ResponsesContext:
    hub = _state().responses  # rill.openai.responses_api.background.Responses, when installed
    return ResponsesContext(_state().serving, None if hub is None else hub.store, owner())


@responses_api.post(ENDPOINT)
async def create_response() -> Response:
    ctx = _context()
    body = await request.get_data()  # past the body limit: a 413 from the app's handler
    if (moved := redirect_for(_state().server.replica_id, body, ENDPOINT, ROUTED_HEADER in request.headers)):
        return Response(b"", status=307, headers={"Location": moved})  # another replica's state (rill.scaling)
    if (joined := await join_session_response(ctx, body)) is not None:  # a Mode B session's answer (item 5)
        return joined
    trace = ctx.serving.new_trace(ENDPOINT, "resp")
    try:
        ctx = _route(ctx, body)
        job = prepare_response(ctx, body, trace)
        if job.request.background:
            return await _background(ctx, job)
    except Exception as exc:  # noqa: BLE001 - every failure before a run becomes an OpenAI error body
        error = _as_api_error(exc)
        ctx.serving.finish(trace, error.status)
        return _error(error)
    run = ResponseRun(ctx, job, response_id=new_response_id(_state().id_prefix), created_at=int(time.time()))
    if job.request.stream:
        return _sse(_stream(ctx, run))
    return await _answer(ctx, run)


def _route(ctx: ResponsesContext, body: bytes) -> ResponsesContext:
    """The context of the model the body names (404 model_not_found for a name none has)."""
    serving = _state().models.route_body(body)
    return ctx if serving is ctx.serving else ResponsesContext(serving, ctx.store, ctx.owner)


async def _answer(ctx: ResponsesContext, run: ResponseRun) -> Response:
    """The whole response as JSON. A run that failed on the engine is a 500 in OpenAI's error shape
    (it is stored as failed all the same)."""
    final = await run.run(_ignore)
    _store(ctx, run.job, final)
    if final["status"] == "failed":
        return _error(ApiError(500, final["error"]["message"], code="engine_error"))
    return _json(final)


async def _stream(ctx: ResponsesContext, run: ResponseRun):
    try:
        async with aclosing(run.events()) as events:
            async for event in events:
                yield sse_frame(event)
        _store(ctx, run.job, run.final)
    except Exception as exc:  # noqa: BLE001 - the status is sent: the failure goes in the stream
        error = api_error(exc)
        yield sse_frame(run.builder.error(error.code, error.message, error.param))


def _store(ctx: ResponsesContext, job: ResponseJob, final: dict[str, Any] | None) -> None:
    if final is not None and job.request.stores and ctx.store is not None:
        ctx.store.put(final, input_items=job.input_items, prior_items=job.prior_items, owner=ctx.owner)


async def _background(ctx: ResponsesContext, job: ResponseJob) -> Response:
    """Start the run in the background runner (it stores and logs it); answer with the queued
    response, or (stream) follow its event log from the start."""
    hub = _state().responses
    if hub is None:
        raise bad_request("background responses are not available on this server", "background", "unsupported")
    run = ResponseRun(ctx, job, response_id=new_response_id(_state().id_prefix), created_at=int(time.time()))
    record = hub.runs.start(run.run, initial=run.snapshot("queued"), input_items=job.input_items,
                            prior_items=job.prior_items, owner=ctx.owner, snapshot=run.snapshot)
    if not job.request.stream:
        return _json(record.response)
    return _sse(follow_frames(record))


async def _ignore(event: dict[str, Any]) -> None:
    """A JSON answer needs only the final object."""
