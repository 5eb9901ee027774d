"""Anthropic's stream events, built sans-IO from the chat path's per-delta output (ChatDelta:
reasoning, content and tool-call pieces, as rill.openai.chat.ChoiceStream splits them).

Order, as Anthropic's streaming reference gives it: `message_start`; per content block
`content_block_start`, its deltas (`thinking_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`; a `ping` after the first block starts; then `message_delta` (stop_reason,
stop_sequence, usage) and `message_stop`. A block closes when the next kind of output begins.
The same builder keeps the blocks whole, so a non-streamed answer is the `message` it ends with.

Whitespace between blocks (the newline before a Hermes `<tool_call>`) is held, and written only
when more text follows it, so that no block holds whitespace alone.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from rill.openai.chat_bodies import ChatDelta

Event = dict[str, Any]


def new_message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def new_tool_use_id() -> str:
    return f"toolu_{secrets.token_hex(12)}"


def stop_reason(chat_reason: str | None, stop: str | int | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for the chat path's finish reason and the stop that ended it."""
    if chat_reason == "tool_calls":
        return "tool_use", None
    if chat_reason == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def usage(num_prompt_tokens: int, num_cached_tokens: int, num_output_tokens: int) -> dict[str, int]:
    """Anthropic's input_tokens excludes what was read from the cache: the three input counts add up
    to the prompt (rill writes no explicit cache entries, so cache_creation_input_tokens is 0)."""
    return {"input_tokens": num_prompt_tokens - num_cached_tokens, "output_tokens": num_output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": num_cached_tokens}


class MessageEvents:
    """One answer's events and its final message."""

    def __init__(self, message_id: str, model: str):
        self.message = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                        "stop_reason": None, "stop_sequence": None, "usage": usage(0, 0, 0)}
        self._open: dict[str, Any] | None = None  # the block being written
        self._arguments = ""  # the open tool_use block's input, as JSON text so far
        self._held = ""  # whitespace not yet written (see the module docstring)
        self._pinged = False

    def start(self, num_prompt_tokens: int, num_cached_tokens: int) -> list[Event]:
        self.message["usage"] = usage(num_prompt_tokens, num_cached_tokens, 0)
        return [{"type": "message_start", "message": {**self.message, "content": []}}]

    def feed(self, delta: ChatDelta) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning_content:
            events += self._write("thinking", delta.reasoning_content)
        if delta.content:
            events += self._write("text", delta.content)
        for call in delta.tool_calls or ():
            if call.id is not None:
                events += self._close() + self._begin({"type": "tool_use", "id": new_tool_use_id(),
                                                       "name": call.function.name, "input": {}})
                self._held = ""
            if call.function.arguments:
                self._arguments += call.function.arguments
                events.append(self._delta({"type": "input_json_delta", "partial_json": call.function.arguments}))
        return events

    def finish(self, reason: str, sequence: str | None, usage_now: dict[str, int]) -> list[Event]:
        self.message.update(stop_reason=reason, stop_sequence=sequence, usage=usage_now)
        events = self._close() + self._ping()
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": usage_now}
        return events + [delta, {"type": "message_stop"}]

    # -- blocks --------------------------------------------------------------------------------------------

    def _write(self, kind: str, text: str) -> list[Event]:
        field, delta_type = ("thinking", "thinking_delta") if kind == "thinking" else ("text", "text_delta")
        text, self._held = self._held + text, ""
        if self._open is None or self._open["type"] != kind:
            if not text.strip():
                self._held = text  # whitespace alone opens nothing
                return []
            start = {"type": kind, field: ""} if kind == "text" else {"type": kind, field: "", "signature": ""}
            events = self._close() + self._begin(start)
        else:
            events = []
        self._open[field] += text
        return events + [self._delta({"type": delta_type, field: text})]

    def _begin(self, block: dict[str, Any]) -> list[Event]:
        index = len(self.message["content"])
        self.message["content"].append(block)
        self._open = block
        return [{"type": "content_block_start", "index": index, "content_block": dict(block)}] + self._ping()

    def _delta(self, delta: dict[str, Any]) -> Event:
        return {"type": "content_block_delta", "index": len(self.message["content"]) - 1, "delta": delta}

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        if self._open["type"] == "tool_use":
            self._open["input"] = _parsed(self._arguments)
            self._arguments = ""
        self._open = None
        return [{"type": "content_block_stop", "index": len(self.message["content"]) - 1}]

    def _ping(self) -> list[Event]:
        if self._pinged:
            return []
        self._pinged = True
        return [{"type": "ping"}]


def _parsed(arguments: str) -> dict[str, Any]:
    """A call's input object (the chat path holds calls to valid JSON objects; anything else is kept
    whole under one key rather than lost)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def sse_frame(event: Event) -> bytes:
    """`event: <type>` then `data: <json>`, as Anthropic frames each event."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
