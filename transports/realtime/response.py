"""One response: the engine's deltas for it -> output items and their events.

Text becomes one assistant message item (`response.output_text.delta`, or `response.text.delta`
for beta clients); with tools in the session, Hermes `<tool_call>` blocks become function_call
items whose arguments stream as `response.function_call_arguments.delta`. Items are closed
(`*.done`) when the response ends, then `response.done` carries the items and the usage.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import msgspec

from rill.openai.tool_parser import ToolCallEvent, ToolCallStreamer, new_call_id
from rill.outputs import RequestDelta
from rill.transports.realtime.events import (
    BetaTextDelta, BetaTextDone, ContentPart, ContentPartAdded, ContentPartDone, ConversationItemAdded,
    ConversationItemCreated, ConversationItemDone,
    ErrorDetail, FunctionCallArgumentsDelta, FunctionCallArgumentsDone, InputTokenDetails, Item, OutputItemAdded,
    OutputItemDone, OutputTextDelta, OutputTextDone, OutputTokenDetails, Response, ResponseCreated, ResponseDone,
    ServerEvent, StatusDetails, Usage, new_id,
)


class Dialect(enum.Enum):
    """OpenAI's Realtime GA names, or the beta's (`OpenAI-Beta: realtime=v1`) where they differ."""

    GA = "ga"
    BETA = "beta"

    @property
    def text_events(self) -> tuple[type[OutputTextDelta], type[OutputTextDone]]:
        return (OutputTextDelta, OutputTextDone) if self is Dialect.GA else (BetaTextDelta, BetaTextDone)

    @property
    def text_part(self) -> str:
        """An assistant message item's text content: `output_text` in GA, `text` in the beta. (A
        response.content_part event's part is `text` in both: the GA schema allows text or audio.)"""
        return "output_text" if self is Dialect.GA else "text"

    def item_added(self, item: Item, previous_item_id: str | None, done: bool = True) -> list[ServerEvent]:
        """An item joined the conversation: beta's conversation.item.created; GA's conversation.item.added,
        and .done at once when the item is complete (a response's items are done when they close)."""
        if self is Dialect.BETA:
            return [ConversationItemCreated(item=item, previous_item_id=previous_item_id)]
        events: list[ServerEvent] = [ConversationItemAdded(item=item, previous_item_id=previous_item_id)]
        if done:
            events.append(ConversationItemDone(item=item, previous_item_id=previous_item_id))
        return events


def end_status(delta: RequestDelta) -> tuple[str, StatusDetails | None]:
    """The response status for the engine's finish reason."""
    reason = delta.finish_reason or delta.turn_finish_reason
    if reason == "length":
        return "incomplete", StatusDetails("incomplete", "max_output_tokens")
    if reason == "error":
        return "failed", StatusDetails("failed", error=ErrorDetail("server_error", "engine_error", delta.error or ""))
    if reason == "abort":
        return "cancelled", StatusDetails("cancelled", "client_cancelled")
    return "completed", None


class ResponseStream:
    """Builds one response's events. `add_item` puts an output item into the conversation (None: the
    response is out of band) and returns the id of the item before it."""

    def __init__(self, dialect: Dialect, *, parse_tools: bool, add_item: Callable[[Item], str | None] | None,
                 conversation_id: str | None, max_output_tokens: int | None, tool_prefix: str = ""):
        self.id = new_id("resp")
        self.dialect = dialect
        self.response = Response(id=self.id, status="in_progress", output=[], conversation_id=conversation_id,
                                 max_output_tokens="inf" if max_output_tokens is None else max_output_tokens)
        self._add_item = add_item
        self._tools = ToolCallStreamer() if parse_tools else None
        self._message: Item | None = None
        self._calls: dict[int, Item] = {}  # the streamer's call index -> its item
        self._held = ""  # whitespace that may only separate tool calls: sent once real text follows
        self._last: RequestDelta | None = None
        self._prefix = tool_prefix  # the forced start of a call, in the prompt: parsed with the first delta
        self._events: list[ServerEvent] = []
        self._previous: dict[str, str | None] = {}  # in-band items: the item before each (conversation.item.done)

    def created(self) -> ResponseCreated:
        return ResponseCreated(response=msgspec.structs.replace(self.response, output=[]))

    def on_delta(self, delta: RequestDelta) -> list[ServerEvent]:
        self._last = delta
        text, self._prefix = self._prefix + delta.text, ""
        content, calls = self._tools.feed(text) if self._tools else (text, [])
        self._content(content)
        for call in calls:
            self._call(call)
        return self._take()

    def finish(self, status: str, details: StatusDetails | None = None) -> list[ServerEvent]:
        """Close the items and the response (after the last delta, a cancel, or an interruption)."""
        if self._tools is not None:
            content, calls = self._tools.finish()
            self._content(content)
            for call in calls:
                self._call(call)
        item_status = "completed" if status == "completed" else "incomplete"
        for index, item in enumerate(self.response.output):
            self._close_item(index, item, item_status)
        self.response.status, self.response.status_details = status, details
        self.response.usage = self._usage()
        self._events.append(ResponseDone(response=self.response))
        return self._take()

    def _take(self) -> list[ServerEvent]:
        events, self._events = self._events, []
        return events

    # -- items ------------------------------------------------------------------------------------------------

    def _open(self, item: Item, snapshot: Item) -> int:
        index = len(self.response.output)
        self.response.output.append(item)
        self._events.append(OutputItemAdded(response_id=self.id, output_index=index, item=snapshot))
        if self._add_item is not None:
            self._previous[item.id] = previous = self._add_item(item)
            self._events += self.dialect.item_added(snapshot, previous, done=False)
        return index

    def _content(self, text: str) -> None:
        if self._message is None:
            if self._tools is not None and not (self._held + text).strip():
                self._held += text
                return
            text, self._held = self._held + text, ""
            if not text:
                return
            self._open_message()
        self._message.content[0].text += text
        delta_event = self.dialect.text_events[0]
        self._events.append(delta_event(response_id=self.id, item_id=self._message.id, output_index=self._index(
            self._message), content_index=0, delta=text))

    def _open_message(self) -> None:
        item_id = new_id("item")
        self._message = Item(type="message", id=item_id, object="realtime.item", status="in_progress",
                             role="assistant", content=[ContentPart(self.dialect.text_part, text="")])
        snapshot = Item(type="message", id=item_id, object="realtime.item", status="in_progress",
                        role="assistant", content=[])
        index = self._open(self._message, snapshot)
        self._events.append(ContentPartAdded(response_id=self.id, item_id=item_id, output_index=index,
                                             content_index=0, part=ContentPart("text", text="")))

    def _call(self, call: ToolCallEvent) -> None:
        if call.name is not None:
            item = Item(type="function_call", id=new_id("item"), object="realtime.item", status="in_progress",
                        call_id=new_call_id(), name=call.name, arguments="")
            self._calls[call.index] = item
            self._open(item, msgspec.structs.replace(item))
        item = self._calls[call.index]
        if call.arguments:
            item.arguments += call.arguments
            self._events.append(FunctionCallArgumentsDelta(
                response_id=self.id, item_id=item.id, output_index=self._index(item), call_id=item.call_id,
                delta=call.arguments))

    def _index(self, item: Item) -> int:
        return next(i for i, out in enumerate(self.response.output) if out is item)

    def _close_item(self, index: int, item: Item, status: str) -> None:
        item.status = status
        ids = {"response_id": self.id, "item_id": item.id, "output_index": index}
        if item.type == "message":
            part = item.content[0]
            self._events.append(self.dialect.text_events[1](**ids, content_index=0, text=part.text))
            self._events.append(ContentPartDone(**ids, content_index=0, part=ContentPart("text", text=part.text)))
        else:
            self._events.append(FunctionCallArgumentsDone(**ids, call_id=item.call_id, name=item.name,
                                                          arguments=item.arguments))
        self._events.append(OutputItemDone(response_id=self.id, output_index=index, item=item))
        if self.dialect is Dialect.GA and item.id in self._previous:
            self._events.append(ConversationItemDone(item=item, previous_item_id=self._previous[item.id]))

    def _usage(self) -> Usage:
        last = self._last
        num_in = last.num_prompt_tokens if last else 0
        num_out = last.num_output_tokens if last else 0
        num_cached = last.num_cached_tokens if last else 0
        return Usage(num_in + num_out, num_in, num_out, InputTokenDetails(num_cached, num_in),
                     OutputTokenDetails(num_out))
