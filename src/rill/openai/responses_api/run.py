"""One response, from a validated request to its final object: the seam between the POST route
(transports/responses_http.py) and background runs (responses_api/background.py).

`prepare_response` does everything that can fail on the request's own account before anything runs
or is written (so a bad request is a 400 whether it streams, runs in the background or neither).
`ResponseRun.events()` runs it on the chat path's engine run (`Serving.run`, with chat's
`ChoiceStream` splitting reasoning, text and tool calls) and yields the Responses events;
`ResponseRun.run(emit)` is the same driven by a callback. Leaving early, or a cancelled scope,
closes the engine run, which aborts the request and frees its KV blocks at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import msgspec

from rill.openai.chat import ChatJob, ChoiceStream, prepare_chat_request
from rill.openai.errors import ApiError, bad_request
from rill.openai.responses_api.events import ResponseEvents, new_id, usage_dict
from rill.openai.responses_api.schema import ResponsesRequest
from rill.openai.responses_api.translate import chat_request, renamed, request_items, stored_items
from rill.openai.serving import RequestTrace, Serving, api_error, decode_body

Emit = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class ResponsesContext:
    serving: Serving
    store: Any = None  # the ResponseStore (responses_api/store.py); None: nothing is kept
    owner: str | None = None  # the caller's API key hash: stored responses are visible to it alone


@dataclass
class ResponseJob:
    """A validated Responses request, rendered on the chat path and ready to run."""

    request: ResponsesRequest
    chat: ChatJob
    input_items: list[dict[str, Any]]  # this request's input as stored items (instructions aside)
    prior_items: list[dict[str, Any]]  # the earlier turns' items (previous_response_id), in order

    @property
    def trace(self) -> RequestTrace:
        return self.chat.trace


def new_response_id(prefix: str = "") -> str:
    """prefix: the replica's ("NAME.", rill.scaling.replica), so that a router finds the stored response."""
    return prefix + new_id("resp")


def prepare_response(ctx: ResponsesContext, body: bytes, trace: RequestTrace) -> ResponseJob:
    """Decode, check and render a request; ApiError (400/404) for anything wrong with it."""
    req = decode_body(body, ResponsesRequest)
    if req.background and not req.stores:
        raise bad_request("background responses must be stored: leave store unset or true", "store")
    earlier = _earlier(ctx, req.previous_response_id)
    items = request_items(req)
    try:
        chat = prepare_chat_request(ctx.serving, trace, chat_request(req, earlier, items))
    except ApiError as exc:
        raise renamed(exc) from exc
    except Exception as exc:  # ValidationError and the like: named as chat names them
        raise renamed(api_error(exc)) from exc
    input_items = stored_items(items)
    return ResponseJob(req, chat, input_items, earlier)


def _earlier(ctx: ResponsesContext, previous_response_id: str | None) -> list[dict[str, Any]]:
    if previous_response_id is None:
        return []
    if ctx.store is None:
        raise bad_request("previous_response_id needs stored responses, which this server does not keep",
                          "previous_response_id", "unsupported")
    return ctx.store.conversation(previous_response_id, ctx.owner)


def response_fields(job: ResponseJob, response_id: str, created_at: int) -> dict[str, Any]:
    """The response object's fields that echo the request."""
    req = job.request
    return {
        "id": response_id, "object": "response", "created_at": created_at, "model": job.chat.model,
        "background": bool(req.background), "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id, "reasoning": _builtins(req.reasoning),
        "store": req.stores, "temperature": job.chat.params.temperature, "top_p": job.chat.params.top_p,
        "text": _builtins(req.text) or {"format": {"type": "text"}},
        "tool_choice": _builtins(req.tool_choice) or "auto", "tools": [_tool_dict(t) for t in req.tools or ()],
        "truncation": "disabled", "user": req.user,
    }


def _builtins(value):
    return None if value is None else msgspec.to_builtins(value)


def _tool_dict(tool) -> dict[str, Any]:
    out = _builtins(tool)
    out["strict"] = True if tool.strict is None else tool.strict
    return {k: v for k, v in out.items() if v is not None}


class ResponseRun:
    """One response on the engine: its events as they happen, its object at any moment."""

    def __init__(self, ctx: ResponsesContext, job: ResponseJob, *, response_id: str, created_at: int):
        self.serving, self.job = ctx.serving, job
        self.builder = ResponseEvents(response_fields(job, response_id, created_at))
        self.final: dict[str, Any] | None = None
        self.num_cached_tokens = 0
        self.num_reasoning_tokens = 0
        self._undecided_tokens = 0  # output tokens not yet known to be reasoning or answer
        self._answered = False  # the answer's text or a call has begun
        self._choice = ChoiceStream(ctx.serving, job.chat, 0)

    def snapshot(self, status: str) -> dict[str, Any]:
        """The response object with the output so far: "queued" before it runs, "cancelled" after."""
        done = status in ("cancelled", "completed", "incomplete", "failed")
        response = self.builder.response(status, self._usage() if done else None,
                                         completed_at=int(time.time()) if done else None)
        for item in response["output"] if done else ():
            if item["status"] == "in_progress":  # the item it was writing when it stopped
                item["status"] = "incomplete"
        return response

    async def run(self, emit: Emit) -> dict[str, Any]:
        async with aclosing(self.events()) as events:
            async for event in events:
                await emit(event)
        return self.final

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """created, in_progress, the items' events, then exactly one terminal event (the final
        object is `self.final` afterwards). Engine failures end in response.failed."""
        status = 499  # until it ends on its own: cancelled, or the reader left
        try:
            for event in self.builder.start():
                yield event
            try:
                end = None
                async with aclosing(self._engine_run()) as deltas:
                    async for event_list, end in deltas:
                        for event in event_list:
                            yield event
                events, self.final = self._finish(end)
            except Exception as exc:  # noqa: BLE001 - after the start, a failure is the response's status
                events, self.final = self._fail(api_error(exc))
            for event in events:
                yield event
            status = 500 if self.final["status"] == "failed" else 200
        finally:
            self.serving.finish(self.job.trace, status)

    async def _engine_run(self):
        chat = self.job.chat
        async for _, delta in self.serving.run(chat.trace, [chat.prompt_ids], chat.params):
            if delta.error is not None:
                raise ApiError(500, delta.error, code="engine_error")
            out = self._choice.on_delta(delta)
            self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
            self._count_reasoning(out, delta)
            yield self.builder.on_delta(out), delta

    def _count_reasoning(self, out, delta) -> None:
        """Tokens up to the answer's first text or call are reasoning once reasoning text came of them
        (a token whose text the parser still holds back waits to be decided; the delta that ends the
        reasoning and starts the answer counts as answer)."""
        if self._answered:
            return
        self._undecided_tokens += len(delta.token_ids)
        if out.content or out.tool_calls:
            self._answered, self._undecided_tokens = True, 0
        elif out.reasoning_content or (delta.finished and self.num_reasoning_tokens):
            self.num_reasoning_tokens += self._undecided_tokens
            self._undecided_tokens = 0

    def _usage(self) -> dict[str, Any]:
        return usage_dict(len(self.job.chat.prompt_ids), self.num_cached_tokens, self._choice.num_output_tokens,
                          self.num_reasoning_tokens)

    def _finish(self, end) -> tuple[list[dict], dict]:
        done_at = int(time.time())
        if end is not None and end.finish_reason == "length":
            return self.builder.finish("incomplete", self._usage(), incomplete_reason="max_output_tokens",
                                       completed_at=done_at)
        return self.builder.finish("completed", self._usage(), completed_at=done_at)

    def _fail(self, error: ApiError) -> tuple[list[dict], dict]:
        return self.builder.finish("failed", self._usage(), failure=(error.code, error.message, error.param))


async def run_response(ctx: ResponsesContext, job: ResponseJob, *, response_id: str, created_at: int,
                       emit: Emit) -> dict[str, Any]:
    """Run one response, `await emit(event)` for each event in order; the final response object."""
    return await ResponseRun(ctx, job, response_id=response_id, created_at=created_at).run(emit)

