"""One response: the engine's deltas for it -> output items and their events.

Text becomes one assistant message item (`response.output_text.delta`, or `response.text.delta`
for beta clients), or in a spoken response (`speak` given) an `output_audio` part whose text goes to
the voice and comes back clause by clause as `response.output_audio_transcript.delta` and
`response.output_audio.delta` (`spoken`); with tools in the session, Hermes `<tool_call>` blocks become function_call
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
from rill.transports.realtime.speech_out_events import BETA_AUDIO_EVENTS, GA_AUDIO_EVENTS


class Dialect(enum.Enum):
    """OpenAI's Realtime GA names, or the beta's (`OpenAI-Beta: realtime=v1`) where they differ."""

    GA = "ga"
    BETA = "beta"

    @property
    def text_events(self) -> tuple[type[OutputTextDelta], type[OutputTextDone]]:
        return (OutputTextDelta, OutputTextDone) if self is Dialect.GA else (BetaTextDelta, BetaTextDone)

    @property
    def audio_events(self) -> tuple[type, type, type, type]:
        """(audio delta, audio done, transcript delta, transcript done)"""
        return GA_AUDIO_EVENTS if self is Dialect.GA else BETA_AUDIO_EVENTS

    @property
    def audio_part(self) -> str:
        """A spoken assistant message's content: `output_audio` in GA, `audio` in the beta."""
        return "output_audio" if self is Dialect.GA else "audio"

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
                 conversation_id: str | None, max_output_tokens: int | None, tool_prefix: str = "",
                 speak: Callable[[str], None] | None = None):
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
        self._speak = speak  # a spoken response: the message's text goes to the voice, not to the client
        if speak is not None:
            self.response.output_modalities = ["audio"]

    @property
    def message(self) -> Item | None:
        """The assistant message item, once the answer has text."""
        return self._message

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

    def flush(self) -> list[ServerEvent]:
        """The text the tool-call parser held back, out (after the engine's last delta: a spoken response
        hands it to its voice before the voice's end is awaited)."""
        if self._tools is not None:
            content, calls = self._tools.finish()
            self._content(content)
            for call in calls:
                self._call(call)
            self._tools = None  # finished: a second flush (finish after flush) has nothing more
        return self._take()

    def finish(self, status: str, details: StatusDetails | None = None) -> list[ServerEvent]:
        """Close the items and the response (after the last delta, a cancel, or an interruption)."""
        self._events += self.flush()
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
        if self._speak is not None:
            self._speak(text)  # its transcript comes with its audio (spoken)
            return
        self._message.content[0].text += text
        delta_event = self.dialect.text_events[0]
        self._events.append(delta_event(response_id=self.id, item_id=self._message.id, output_index=self._index(
            self._message), content_index=0, delta=text))

    def spoken(self, transcript: str, audio: list[str]) -> list[ServerEvent]:
        """A clause of the spoken message: its transcript piece, then its audio (base64 pieces)."""
        message = self._message
        message.content[0].transcript += transcript
        audio_delta, _, transcript_delta, _ = self.dialect.audio_events
        ids = {"response_id": self.id, "item_id": message.id, "output_index": self._index(message), "content_index": 0}
        if transcript:
            self._events.append(transcript_delta(**ids, delta=transcript))
        self._events += [audio_delta(**ids, delta=piece) for piece in audio]
        return self._take()

    def _open_message(self) -> None:
        item_id = new_id("item")
        part = ContentPart(self.dialect.text_part, text="") if self._speak is None else \
            ContentPart(self.dialect.audio_part, transcript="")
        self._message = Item(type="message", id=item_id, object="realtime.item", status="in_progress",
                             role="assistant", content=[part])
        snapshot = Item(type="message", id=item_id, object="realtime.item", status="in_progress",
                        role="assistant", content=[])
        index = self._open(self._message, snapshot)
        added = ContentPart("text", text="") if self._speak is None else ContentPart("audio", transcript="")
        self._events.append(ContentPartAdded(response_id=self.id, item_id=item_id, output_index=index,
                                             content_index=0, part=added))

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
        if item.type == "message" and self._speak is not None:
            _, audio_done, _, transcript_done = self.dialect.audio_events
            transcript = item.content[0].transcript
            self._events += [audio_done(**ids, content_index=0),
                             transcript_done(**ids, content_index=0, transcript=transcript),
                             ContentPartDone(**ids, content_index=0, part=ContentPart("audio", transcript=transcript))]
        elif item.type == "message":
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
