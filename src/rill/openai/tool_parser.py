"""Hermes / Qwen tool calls: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

`parse_tool_calls` reads a finished text; `ToolCallStreamer` reads it delta by delta. The
streamer never releases text that may be the start of `<tool_call>`; inside a call it sends the
function's name once it is complete, then the arguments' JSON text as it arrives, holding back
the last `}` (it may close the outer object) so the fragments always join to exactly the
arguments of the finished call. A block that is not a valid call is given back as content.
"""

from __future__ import annotations

import json
import re
import secrets

import msgspec

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
# A call's start up to its arguments' first character (which must have arrived: the lookahead).
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')


class ParsedCall(msgspec.Struct, frozen=True):
    name: str
    arguments: str  # JSON text


class ToolCallEvent(msgspec.Struct, frozen=True):
    """One step of a streamed call: its start (name set) or an arguments fragment."""

    index: int
    name: str | None = None
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def is_json_object(text: str) -> bool:
    """True when a call's arguments text parses as a JSON object (what OpenAI's `arguments` holds)."""
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def coalesce(events: list[ToolCallEvent]) -> list[ToolCallEvent]:
    """The same events with at most one per call: fragments join the event before them when it is
    of the same call, so a call's start carries the arguments that arrived with it."""
    out: list[ToolCallEvent] = []
    for event in events:
        if out and out[-1].index == event.index and event.name is None:
            last = out[-1]
            out[-1] = ToolCallEvent(last.index, last.name, last.arguments + event.arguments)
        else:
            out.append(event)
    return out


def _parse_call(body: str) -> ParsedCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", {})
    if (match := _NAME.match(body)) is not None and _decodes_to(raw := _arguments_text(body, match.end()), arguments):
        # The model's own arguments text, as the streamer sends it, so both paths agree exactly.
        return ParsedCall(obj["name"], raw)
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _decodes_to(text: str, value) -> bool:
    try:
        return json.loads(text) == value
    except json.JSONDecodeError:
        return False


def _arguments_text(body: str, start: int) -> str:
    """The arguments of a call body whose arguments begin at `start`, without the outer object's `}`."""
    args = body[start:].rstrip()
    return args[:-1].rstrip() if args.endswith("}") else args


def parse_tool_calls(text: str) -> tuple[str, list[ParsedCall]]:
    """Content (the text outside valid call blocks) and the calls, in order."""
    calls, content, at = [], [], 0
    for match in _BLOCK.finditer(text):
        call = _parse_call(match[1])
        if call is None:
            continue  # not a call: it stays in the content
        content.append(text[at:match.start()])
        calls.append(call)
        at = match.end()
    content.append(text[at:])
    return "".join(content).strip() if calls else text, calls


def held_back(text: str, marker: str) -> int:
    """Length of the longest end of `text` that `marker` starts with (it may still become `marker`)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ToolCallStreamer:
    """Splits streamed text into content and tool-call events. Feed deltas; `finish` at the end."""

    def __init__(self, max_calls: int | None = None):
        self.max_calls = max_calls  # parallel_tool_calls=false: 1
        self.num_calls = 0
        self._text = ""  # received, not yet released
        self._in_call = False
        self._name_sent = False
        self._args_start = 0  # where the arguments begin in _text, once the name is sent
        self._args_sent = 0  # characters of arguments released

    def feed(self, delta: str) -> tuple[str, list[ToolCallEvent]]:
        self._text += delta
        content, events = [], []
        while True:
            if not self._in_call:
                released, found = self._scan_content()
                content.append(released)
            else:
                released, found = self._scan_call(events)
                content.append(released)
            if not found:
                return "".join(content), events

    def finish(self) -> tuple[str, list[ToolCallEvent]]:
        """End of output: release what is held back (an unfinished call's arguments, or raw text)."""
        text, self._text = self._text, ""
        if not self._in_call:
            return text, []
        if not self._name_sent:
            return TOOL_CALL_START + text, []
        events: list[ToolCallEvent] = []
        self._send_arguments(text[self._args_start:].rstrip(), events)
        return "", events

    @property
    def _accepting_calls(self) -> bool:
        return self.max_calls is None or self.num_calls < self.max_calls

    def _scan_content(self) -> tuple[str, bool]:
        """Release content up to a call's start (True) or up to what may begin one (False)."""
        at = self._text.find(TOOL_CALL_START) if self._accepting_calls else -1
        if at >= 0:
            released, self._text = self._text[:at], self._text[at + len(TOOL_CALL_START):]
            self._in_call, self._name_sent, self._args_sent = True, False, 0
            return released, True
        keep = held_back(self._text, TOOL_CALL_START) if self._accepting_calls else 0
        cut = len(self._text) - keep
        released, self._text = self._text[:cut], self._text[cut:]
        return released, False

    def _scan_call(self, events: list[ToolCallEvent]) -> tuple[str, bool]:
        """Advance inside a call. Returns content given back (a block that was no call) and
        whether the call ended, so scanning goes on after it."""
        end = self._text.find(TOOL_CALL_END)
        body = self._text if end < 0 else self._text[:end]
        if not self._name_sent and (match := _NAME.match(body)):
            events.append(ToolCallEvent(self.num_calls, name=json.loads(f'"{match[1]}"')))
            self.num_calls += 1
            self._name_sent, self._args_start = True, match.end()
        if end < 0:
            if self._name_sent:
                safe = body[: len(body) - held_back(body, TOOL_CALL_END)]
                self._send_arguments(_arguments_text(safe, self._args_start), events)
            return "", False
        self._text, self._in_call = self._text[end + len(TOOL_CALL_END):], False
        return self._end_call(body, events), True

    def _send_arguments(self, args: str, events: list[ToolCallEvent]) -> None:
        fragment = args[self._args_sent:]
        if fragment:
            events.append(ToolCallEvent(self.num_calls - 1, arguments=fragment))
            self._args_sent = len(args)

    def _end_call(self, body: str, events: list[ToolCallEvent]) -> str:
        if self._name_sent:
            self._send_arguments(_arguments_text(body, self._args_start), events)
            return ""
        call = _parse_call(body)
        if call is None:  # not a call after all: the whole block is content
            return TOOL_CALL_START + body + TOOL_CALL_END
        events.append(ToolCallEvent(self.num_calls, name=call.name, arguments=call.arguments))
        self.num_calls += 1
        return ""
