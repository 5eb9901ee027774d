"""The Responses API's streamed events, built sans-IO from the chat path's per-delta output.

`ResponseEvents` takes what `rill.openai.chat.ChoiceStream` makes of each engine delta (a
`ChatDelta`: reasoning, content and tool-call fragments) and returns the event dicts OpenAI sends,
each with the next `sequence_number`. Output items stream one at a time, as OpenAI's do: a reasoning
item, a message, a function_call per call; a fragment of another kind closes the open item first
(its `.done` events, then `response.output_item.done`). The shapes are those the openai SDK parses
(openai-python's types/responses/response_*_event.py).
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from rill.openai.chat_bodies import ChatDelta, ToolCallDelta

REASONING, MESSAGE, FUNCTION_CALL = "reasoning", "message", "function_call"
TERMINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete",
                   "failed": "response.failed"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def sse_frame(event: dict[str, Any]) -> bytes:
    """One event on the wire: its type as the SSE `event:` line, the event itself as `data:`."""
    return b"event: " + event["type"].encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"


def usage_dict(num_input: int, num_cached: int, num_output: int, num_reasoning: int) -> dict[str, Any]:
    """OpenAI's usage object; rill's prefix cache writes as it reads, at no extra cost: no cache writes
    are billed, so `cache_write_tokens` (which the openai SDK requires) is 0."""
    details = {"cached_tokens": num_cached, "cache_write_tokens": 0}
    return {"input_tokens": num_input, "input_tokens_details": details,
            "output_tokens": num_output, "output_tokens_details": {"reasoning_tokens": num_reasoning},
            "total_tokens": num_input + num_output}


class ResponseEvents:
    """One response's output items and event sequence. `fields` are the response object's fields
    that do not change while it runs (id, model, the request's settings echoed)."""

    def __init__(self, fields: dict[str, Any]):
        self.fields = fields
        self.output: list[dict[str, Any]] = []
        self.num_events = 0
        self._open: dict[str, Any] | None = None  # the item being streamed (the last of output)
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its function_call item
        self._pending_text = ""  # whitespace not yet shown: it opens no message on its own

    # -- the response object ---------------------------------------------------------------------

    def response(self, status: str, usage: dict | None = None, *, error: dict | None = None,
                 incomplete_reason: str | None = None, completed_at: int | None = None) -> dict[str, Any]:
        return {**self.fields, "status": status, "output": [_copy(item) for item in self.output],
                "usage": usage, "error": error, "completed_at": completed_at,
                "incomplete_details": None if incomplete_reason is None else {"reason": incomplete_reason}}

    def event(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type_, "sequence_number": self.num_events, **fields}
        self.num_events += 1
        return event

    def error(self, code: str | None, message: str, param: str | None = None) -> dict[str, Any]:
        """OpenAI's `error` event: a failure after the stream started (the HTTP status is sent)."""
        return self.event("error", code=code, message=message, param=param)

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [self.event("response.created", response=snapshot),
                self.event("response.in_progress", response=snapshot)]

    def finish(self, status: str, usage: dict | None, *, failure: tuple[str | None, str, str | None] | None = None,
               **details: Any) -> tuple[list[dict], dict]:
        """Close the open item and end with the terminal event; returns (events, final response).
        A `failure` (code, message, param) is sent as an `error` event just before response.failed;
        the response's own `error` takes OpenAI's ResponseError shape, whose codes have no room for
        rill's."""
        events = self._close("completed" if status == "completed" else "incomplete")
        if not self.output and status != "failed":  # an empty answer is still a message, as OpenAI's
            events += self._open_message() + self._close("completed")
        if failure is not None:
            events.append(self.error(*failure))
            details["error"] = {"code": "server_error", "message": failure[1]}
        final = self.response(status, usage, **details)
        return events + [self.event(TERMINAL_EVENTS[status], response=final)], final

    # -- one delta -------------------------------------------------------------------------------

    def on_delta(self, delta: ChatDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.reasoning_content:
            events += self._reasoning(delta.reasoning_content)
        if delta.content:
            events += self._text(delta.content)
        for call in delta.tool_calls or ():
            events += self._call(call)
        return events

    def _reasoning(self, text: str) -> list[dict]:
        events = [] if self._is_open(REASONING) else self._close("completed") + self._open_reasoning()
        self._open["content"][0]["text"] += text
        return events + [self.event("response.reasoning_text.delta", **self._where(), delta=text)]

    def _text(self, text: str) -> list[dict]:
        if not self._is_open(MESSAGE):
            text, self._pending_text = self._pending_text + text, ""
            if not text.strip():
                self._pending_text = text
                return []
            events = self._close("completed") + self._open_message()
        else:
            events = []
        self._open["content"][0]["text"] += text
        return events + [self.event("response.output_text.delta", **self._where(), delta=text, logprobs=[])]

    def _call(self, call: ToolCallDelta) -> list[dict]:
        events = []
        if call.id is not None:  # a call's start: its own item
            events += self._close("completed") + self._open_call(call)
            self._calls[call.index] = self._open
        item = self._calls[call.index]
        arguments = (call.function.arguments or "") if call.function else ""
        if arguments:
            item["arguments"] += arguments
            events.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                     output_index=self.output.index(item), delta=arguments))
        return events

    # -- opening and closing items -----------------------------------------------------------------

    def _is_open(self, kind: str) -> bool:
        return self._open is not None and self._open["type"] == kind

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open["id"], "output_index": len(self.output) - 1, "content_index": 0}

    def _add(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[dict]:
        self._open, self._pending_text = item, ""  # whitespace between items belongs to neither
        self.output.append(item)
        events = [self.event("response.output_item.added", output_index=len(self.output) - 1,
                             item={**item, "content": []} if part else dict(item))]
        if part is not None:
            item["content"] = [dict(part)]
            events.append(self.event("response.content_part.added", **self._where(), part=part))
        return events

    def _open_reasoning(self) -> list[dict]:
        item = {"id": new_id("rs"), "type": REASONING, "summary": [], "content": [], "status": "in_progress"}
        return self._add(item, {"type": "reasoning_text", "text": ""})

    def _open_message(self) -> list[dict]:
        item = {"id": new_id("msg"), "type": MESSAGE, "role": "assistant", "status": "in_progress", "content": []}
        return self._add(item, {"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _open_call(self, call: ToolCallDelta) -> list[dict]:
        item = {"id": new_id("fc"), "type": FUNCTION_CALL, "call_id": call.id, "name": call.function.name,
                "arguments": "", "status": "in_progress"}
        return self._add(item, None)

    def _close(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        events = self._close_parts(item)
        return events + [self.event("response.output_item.done", output_index=self.output.index(item),
                                    item=_copy(item))]

    def _close_parts(self, item: dict[str, Any]) -> list[dict]:
        where = {"item_id": item["id"], "output_index": self.output.index(item)}
        if item["type"] == FUNCTION_CALL:
            return [self.event("response.function_call_arguments.done", **where, name=item["name"],
                               arguments=item["arguments"])]
        part = item["content"][0]
        done = ("response.reasoning_text.done", {"text": part["text"]}) if item["type"] == REASONING else \
            ("response.output_text.done", {"text": part["text"], "logprobs": []})
        return [self.event(done[0], **where, content_index=0, **done[1]),
                self.event("response.content_part.done", **where, content_index=0, part=dict(part))]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """An item as it is now (events keep their snapshot; the item goes on into the final response)."""
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(part) for part in out["content"]]
    return out
