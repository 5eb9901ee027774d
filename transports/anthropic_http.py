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
from quart import Blueprint, Response

from rill.anthropic.errors import error_body
from rill.anthropic.events import sse_frame
from rill.anthropic.messages import count_tokens, create_message, message_events, prepare_message
from rill.openai.errors import ApiError
from rill.openai.serving import api_error
from rill.transports.http import _sse, traced

PREFIX = "/v1/messages"

anthropic_api = Blueprint("anthropic", __name__)


def anthropic_error(error: ApiError) -> Response:
    return Response(msgspec.json.encode(error_body(error)), status=error.status, headers=error.headers,
                    content_type="application/json")


@anthropic_api.post(PREFIX)
async def messages() -> Response:
    async def respond(serving, trace, body):
        job = await prepare_message(serving, trace, body)
        return _sse(_stream(serving, job)) if job.stream else await create_message(serving, job)

    return await traced(PREFIX, "msg", respond, anthropic_error)


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
    return await traced(PREFIX + "/count_tokens", "msgcount", count_tokens, anthropic_error)
