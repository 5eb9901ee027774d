"""A response whose input streamed in: POST /v1/responses joining a Mode B session (issue 27, item 5).

    POST /v1/responses {"streaming_input": {"session_id": "sess_…"}, "stream": true}

The session (created with chat fields at /v1/streaming_input/sessions, its chunks appended as they
were typed or spoken) already holds the prompt, prefilled as it arrived. Joining ends its input
(as /finish does) and answers as a Response: the session's chat deltas, read from its output log,
go through the Responses event builder (responses_api/events.py), so the events and the final
object are those of any other response. The prompt and its sampling were fixed when the session was
created, so the fields that would set them again are refused. The realtime API's `response.create`
plays the same part on a WebSocket: the conversation is already in, and it asks for the answer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from rill.openai import sse
from rill.openai.chat import render_prompt
from rill.openai.chat_bodies import ChatDelta
from rill.openai.errors import bad_request
from rill.openai.responses_api.events import ResponseEvents, new_id, usage_dict
from rill.openai.responses_api.schema import ResponsesRequest
from rill.openai.streaming import StreamRun
from rill.openai.streaming_prompt import _with_user_text  # the chat rule for where streamed text goes
from rill.sessions.config import OutputMode
from rill.tokenizer.chat_template import STREAMED_TEXT_PLACEHOLDER, split_at_placeholder

# Fields the session fixed when it was created (its messages, tools and sampling).
FIXED_BY_SESSION = ("input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "temperature",
                    "top_p", "reasoning", "parallel_tool_calls", "previous_response_id", "background")


class JoinOptions(msgspec.Struct, forbid_unknown_fields=True):
    session_id: str


class _JoinBody(msgspec.Struct):
    streaming_input: Any = None


class _Choice(msgspec.Struct):
    delta: ChatDelta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []


def names_session(body: bytes) -> bool:
    """Whether a POST /v1/responses body asks to join a session (a body that does not decode: no)."""
    try:
        return msgspec.json.decode(body, type=_JoinBody).streaming_input is not None
    except msgspec.MsgspecError:
        return False


def join_options(body: bytes) -> tuple[ResponsesRequest, JoinOptions]:
    """The request and its session; 400 naming a field the session fixed, or a malformed option."""
    req = msgspec.json.decode(body, type=ResponsesRequest)
    for name in FIXED_BY_SESSION:
        if getattr(req, name) is not None:
            raise bad_request(f"{name} cannot be set on a response that joins a streaming-input session: the "
                              "session's create request set the prompt and its sampling", name, "unsupported")
    options = msgspec.json.decode(body, type=_JoinBody).streaming_input
    return req, msgspec.convert(options, JoinOptions)


def check_joinable(run: StreamRun) -> None:
    if run.api.name != "chat":
        raise bad_request("only a chat session (streaming_input.api 'chat') can answer as a response",
                          "streaming_input.session_id", "unsupported")
    if run.mode is not OutputMode.RESPOND_AT_END:
        raise bad_request("only a respond_at_end session can answer as one response",
                          "streaming_input.session_id", "unsupported")


class JoinedResponse:
    """The Responses events of a session's answer, as its chat deltas come."""

    def __init__(self, run: StreamRun, req: ResponsesRequest, *, response_id: str, created_at: int):
        self.run = run
        self.builder = ResponseEvents(_fields(run, req, response_id, created_at))
        self.final: dict[str, Any] | None = None

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        for event in self.builder.start():
            yield event
        finish_reason, failure = None, None
        async for _, frame in self.run.session.output.follow():
            kind, value = parse_frame(frame)
            if kind == "error":
                failure = value
            for choice in value.choices if kind == "chunk" else ():
                finish_reason = choice.finish_reason or finish_reason
                for event in self.builder.on_delta(choice.delta or ChatDelta()):
                    yield event
        events, self.final = self._finish(finish_reason, failure)
        for event in events:
            yield event

    def _finish(self, finish_reason: str | None, failure: dict | None) -> tuple[list[dict], dict]:
        usage, done_at = self._usage(), int(time.time())
        if failure is not None or finish_reason is None:
            error = failure or {"code": "session_closed", "message": "the session ended without an answer"}
            return self.builder.finish("failed", usage, failure=(error.get("code"), error.get("message", ""),
                                                                 error.get("param")))
        if finish_reason == "length":
            return self.builder.finish("incomplete", usage, incomplete_reason="max_output_tokens",
                                       completed_at=done_at)
        return self.builder.finish("completed", usage, completed_at=done_at)

    def _usage(self) -> dict[str, Any]:
        deltas = self.run.deltas
        num_prompt = max((d.num_prompt_tokens for d in deltas), default=len(self.run.ids))
        num_cached = max((d.num_cached_tokens for d in deltas), default=0)
        return usage_dict(num_prompt, num_cached, sum(len(d.token_ids) for d in deltas), 0)

    def input_items(self) -> list[dict[str, Any]]:
        """What the model read: the session's messages, the streamed text where the chat rule put it."""
        return [_item(message) for message in _with_user_text(self.run.job, streamed_text(self.run))]


def parse_frame(frame: bytes) -> tuple[str, Any]:
    """A chat SSE frame of the session's log: ("chunk", _Chunk), ("error", error dict) or ("done", None)."""
    if frame == sse.DONE:
        return "done", None
    if frame.startswith(b"event: error\n"):
        body = msgspec.json.decode(frame.split(b"data: ", 1)[1])
        return "error", body.get("error", body)
    return "chunk", msgspec.json.decode(frame.removeprefix(b"data: "), type=_Chunk)


def streamed_text(run: StreamRun) -> str:
    """The text that streamed in: the prompt text between the template's prefix and its suffix."""
    messages = _with_user_text(run.job, STREAMED_TEXT_PLACEHOLDER)
    prefix, _ = split_at_placeholder(render_prompt(run.serving, run.job, messages), STREAMED_TEXT_PLACEHOLDER)
    end = len(run.text) - len(run.suffix_text)
    return run.text[len(prefix):end]


def _item(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as a Responses input item."""
    role, text = message["role"], message.get("content") or ""
    if role == "tool":
        return {"id": new_id("fco"), "type": "function_call_output", "call_id": message.get("tool_call_id"),
                "output": text}
    kind = "output_text" if role == "assistant" else "input_text"
    return {"id": new_id("msg"), "type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _fields(run: StreamRun, req: ResponsesRequest, response_id: str, created_at: int) -> dict[str, Any]:
    job = run.job
    return {
        "id": response_id, "object": "response", "created_at": created_at, "model": job.model,
        "background": False, "instructions": None, "max_output_tokens": job.params.max_tokens,
        "metadata": req.metadata or {}, "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": None, "store": req.stores, "temperature": job.params.temperature,
        "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [], "top_p": job.params.top_p,
        "truncation": "disabled", "user": req.user,
    }

