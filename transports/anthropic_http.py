"""Anthropic's Messages API on the wire (the logic is rill.anthropic).

    POST /v1/messages               JSON in; the `message` as JSON, or (stream) Anthropic's SSE events
    POST /v1/messages/count_tokens  {"input_tokens": N}

Errors come in Anthropic's shape (rill.anthropic.errors), before a stream starts as the HTTP
status, after it as an `error` event. The API key is checked in transports/http.py's auth hook,
which takes `x-api-key` as well as `Authorization: Bearer` on these paths. `anthropic-version` is
accepted whatever its value: rill answers one version of the API.
"""

from __future__ import annotations

from contextlib import aclosing

import msgspec
import trio
from quart import Blueprint, Response, request

from rill.anthropic.errors import error_body
from rill.anthropic.events import sse_frame
from rill.anthropic.messages import count_tokens, create_message, message_events, prepare_message
from rill.openai.errors import ApiError
from rill.openai.serving import api_error
from rill.transports.http import _as_api_error, _json, _sse, _state

PREFIX = "/v1/messages"

anthropic_api = Blueprint("anthropic", __name__)


def anthropic_error(error: ApiError) -> Response:
    return Response(msgspec.json.encode(error_body(error)), status=error.status, headers=error.headers,
                    content_type="application/json")


@anthropic_api.post(PREFIX)
async def messages() -> Response:
    serving = _state().serving
    trace = serving.new_trace(PREFIX, "msg")
    try:
        body = await request.get_data()  # past the body limit: a 413
        serving = _state().models.route_body(body)  # the model it names (404 otherwise)
        job = await prepare_message(serving, trace, body)
        if job.stream:
            return _sse(_stream(serving, job))
        result = await create_message(serving, job)
    except trio.Cancelled:
        serving.finish(trace, 499)  # the client left
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes an Anthropic error body
        error = _as_api_error(exc)
        serving.finish(trace, error.status)
        return anthropic_error(error)
    serving.finish(trace, 200)
    return _json(result)


async def _stream(serving, job):
    status = 499  # until the stream ends on its own: the client left
    try:
        async with aclosing(message_events(serving, job)) as events:
            async for event in events:
                yield sse_frame(event)
        status = 200
    except Exception as exc:  # noqa: BLE001 - the status is sent: the failure goes in the stream
        error = api_error(exc)
        status = error.status
        yield sse_frame(msgspec.to_builtins(error_body(error)))
    finally:
        serving.finish(job.chat.trace, status)


@anthropic_api.post(PREFIX + "/count_tokens")
async def messages_count_tokens() -> Response:
    serving = _state().serving
    trace = serving.new_trace(PREFIX + "/count_tokens", "msgcount")
    try:
        body = await request.get_data()
        serving = _state().models.route_body(body)
        result = await count_tokens(serving, trace, body)
    except Exception as exc:  # noqa: BLE001
        error = _as_api_error(exc)
        serving.finish(trace, error.status)
        return anthropic_error(error)
    serving.finish(trace, 200)
    return _json(result)
