"""RealtimeConnection without a socket: client frames in, server events out, the real engine
behind a ChannelEngineLink. Pins the state table, validation, and the ids streamed input sends."""

from __future__ import annotations

import json
import math
from contextlib import asynccontextmanager

import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.openai.serving import Serving
from rill.outputs import RequestDelta
from rill.transports.realtime.connection import RealtimeConnection
from rill.transports.realtime.state import TRANSITIONS, Move, State
from rill.transports.realtime.driver import ChannelEngineLink
from rill.transports.realtime.events import encode


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


class Harness:
    """A connection, its engine link, and the inbox the link pumps deltas into."""

    def __init__(self, serving: Serving, nursery: trio.Nursery, **kwargs):
        send, self.inbox = trio.open_memory_channel(math.inf)
        self.conn = RealtimeConnection(serving, ChannelEngineLink(serving.engine, nursery, send), **kwargs)
        self.engine = serving.engine
        assert [e.type for e in self.events(self.conn.start())] == ["session.created"]

    @staticmethod
    def events(events) -> list:
        for event in events:
            json.loads(encode(event))  # every event encodes
        return events

    def send(self, type_: str, event_id: str = "ev", **fields) -> list:
        return self.events(self.conn.receive_message(json.dumps({"type": type_, "event_id": event_id, **fields})))

    def error(self, type_: str, **fields):
        (event,) = self.send(type_, **fields)
        assert event.type == "error", event
        return event.error

    async def until(self, type_: str) -> list:
        """Feed engine deltas until an event of `type_` comes out."""
        out = []
        with trio.fail_after(20):
            while not any(e.type == type_ for e in out):
                delta: RequestDelta = await self.inbox.receive()
                out += self.events(self.conn.receive_delta(delta))
        return out

    @property
    def all_kv_free(self) -> bool:
        bm = self.engine.core.block_manager
        return bm.num_free_blocks == bm.num_blocks


def session_ids(h: Harness) -> list[list[int]]:
    """The token ids of each live engine request (read from the trio side: tests only)."""
    return [list(seqs[0].token_ids) for seqs in list(h.engine.core.requests.values())]


@asynccontextmanager
async def harness(model_dir, **kwargs):
    async with open_engine(EngineConfig(model=str(model_dir), num_kv_blocks=128)) as engine:
        async with trio.open_nursery() as nursery:
            h = Harness(Serving(engine), nursery, **kwargs)
            try:
                yield h
            finally:
                h.conn.close()
                nursery.cancel_scope.cancel()


def test_every_state_is_reachable_and_can_get_back_to_idle():
    reachable, frontier = {State.IDLE}, [State.IDLE]
    while frontier:
        state = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is state and target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(State)
    assert {target for (_, move), target in TRANSITIONS.items() if move is Move.END_RESPONSE} == {State.IDLE}


async def test_streamed_input_sends_the_ids_of_the_rendered_conversation(model_dir):
    async with harness(model_dir) as h:
        h.send("session.update", session={"instructions": "Be kind.", "temperature": 0})
        h.send("conversation.item.create", item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "earlier"}]})
        for piece in ("one two", " three four", " five"):
            assert h.send("input_text_buffer.append", delta=piece) == []
        assert h.conn.state is State.STREAMING
        h.send("input_text_buffer.commit")
        assert h.conn.state is State.COMMITTED
        messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "earlier"},
                    {"role": "user", "content": "one two three four five"}]
        expected = h.engine.tokenizer.encode_chat(messages)
        await wait_for(lambda: session_ids(h) == [expected])


async def test_invalid_transitions_answer_errors_and_change_nothing(model_dir):
    async with harness(model_dir) as h:
        assert h.error("response.cancel").code == "response_cancel_not_active"
        assert h.error("input_text_buffer.commit").code == "input_text_buffer_commit_empty"
        assert h.error("response.create").code == "conversation_empty"
        h.send("session.update", session={"max_response_output_tokens": 50, "instructions": "Talk."})
        created = h.send("response.create")
        assert [e.type for e in created] == ["response.created"]
        error = h.error("response.create", event_id="second")
        assert (error.code, error.event_id) == ("conversation_already_has_active_response", "second")
        assert h.error("response.cancel", response_id="resp_other").param == "response_id"
        assert h.conn.state is State.RESPONDING
        done = h.send("response.cancel")
        assert done[-1].type == "response.done" and done[-1].response.status == "cancelled"
        assert h.conn.state is State.IDLE
        await wait_for(lambda: h.all_kv_free)


@pytest.mark.parametrize("session, param, code", [
    ({"temperature": -1}, "session.temperature", "invalid_value"),
    ({"model": "gpt-4o"}, "model", "model_not_found"),
    ({"output_modalities": ["video"]}, "session.output_modalities", "invalid_value"),
    ({"tool_choice": "required"}, "session.tool_choice", "invalid_value"),
    ({"max_response_output_tokens": 0}, "session.max_response_output_tokens", "invalid_value"),
    ({"input_audio_format": {"type": "audio/pcm", "rate": 8000}}, "session.input_audio_format.rate", "invalid_value"),
    ({"output_mode": "sometimes"}, "session.output_mode", "invalid_type"),  # as the HTTP API names it
])
async def test_session_update_is_validated_whole(model_dir, session, param, code):
    async with harness(model_dir) as h:
        before = h.conn.settings.__dict__.copy()
        error = h.error("session.update", session={"instructions": "changed", **session})
        assert (error.param, error.code) == (param, code)
        assert error.message.endswith("(this session.update was not applied: nothing in it changed)")
        assert h.conn.settings.__dict__ == before


@pytest.mark.parametrize("item, param, code", [
    ({"type": "message", "content": []}, "item.role", "missing_required_parameter"),
    ({"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "AAAA"}]},
     "item.content[0].type", "audio_not_supported"),
    ({"type": "message", "role": "assistant", "content": [{"type": "input_text", "text": "x"}]},
     "item.content[0]", "invalid_value"),
    ({"type": "function_call_output", "output": "x"}, "item.call_id", "missing_required_parameter"),
    ({"type": "picture"}, "item.type", "invalid_type"),
])
async def test_bad_items_are_refused(model_dir, item, param, code):
    async with harness(model_dir) as h:
        error = h.error("conversation.item.create", item=item)
        assert (error.param, error.code) == (param, code)
        assert h.conn.conversation.items == []


async def test_items_insert_after_previous_item_id(model_dir):
    async with harness(model_dir) as h:
        def create(text, **where):
            added, done = h.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": text}]}, **where)
            assert (added.type, done.type) == ("conversation.item.added", "conversation.item.done")
            assert done.item is added.item and done.previous_item_id == added.previous_item_id
            return added
        a = create("a")
        b = create("b")
        assert b.previous_item_id == a.item.id
        first = create("first", previous_item_id="root")
        assert first.previous_item_id is None
        create("middle", previous_item_id=a.item.id)
        assert h.error("conversation.item.create", item={"type": "message", "role": "user", "content": []},
                       previous_item_id="nope").code == "item_not_found"
        assert [m["content"] for m in h.conn.conversation.messages("")] == ["first", "a", "middle", "b"]


async def test_an_item_created_while_text_streams_goes_before_the_streamed_message(model_dir):
    async with harness(model_dir) as h:
        h.send("input_text_buffer.append", delta="streamed words here")
        h.send("conversation.item.create", item={"type": "message", "role": "system",
                                                 "content": [{"type": "input_text", "text": "context"}]})
        h.send("input_text_buffer.commit")
        expected = h.engine.tokenizer.encode_chat([{"role": "system", "content": "context"},
                                                   {"role": "user", "content": "streamed words here"}])
        await wait_for(lambda: session_ids(h) == [expected])  # the first session was aborted


async def test_beta_clients_get_beta_text_event_names(model_dir):
    from rill.transports.realtime.response import Dialect

    async with harness(model_dir, dialect=Dialect.BETA) as h:
        h.send("session.update", session={"instructions": "Hi", "max_response_output_tokens": 3})
        h.send("response.create")
        events = await h.until("response.done")
        types = {e.type for e in events}
        assert "response.text.delta" in types and "response.output_text.delta" not in types
        assert events[-1].response.output[0].content[0].type == "text"


async def test_session_update_while_text_streams_reopens_it_under_the_new_instructions(model_dir):
    async with harness(model_dir) as h:
        h.send("input_text_buffer.append", delta="some words to stream")
        h.send("session.update", session={"instructions": "New rules."})
        h.send("input_text_buffer.commit")
        expected = h.engine.tokenizer.encode_chat([{"role": "system", "content": "New rules."},
                                                   {"role": "user", "content": "some words to stream"}])
        await wait_for(lambda: session_ids(h) == [expected])


async def test_cancel_while_answering_a_chunk_keeps_the_text_and_frees_kv(model_dir):
    async with harness(model_dir) as h:
        h.send("session.update", session={"output_mode": "respond_per_chunk", "temperature": 0,
                                          "max_response_output_tokens": 300})
        h.send("input_text_buffer.append", delta="Hello")
        await h.until("response.output_text.delta")
        assert h.conn.state is State.ANSWERING
        events = h.send("response.cancel")
        assert events[0].type == "conversation.item.added"
        assert events[-1].type == "response.done" and events[-1].response.status == "cancelled"
        assert h.conn.state is State.IDLE
        assert h.conn.conversation.messages("") == [{"role": "user", "content": "Hello"}]
        await wait_for(lambda: h.all_kv_free)


def test_truncation_leaves_whole_turns_out_and_keeps_them_in_the_conversation():
    """A turn leaves the context with its answer, calls and their outputs; an item inserted among the
    left-out turns stays out; the items themselves stay."""
    from rill.transports.realtime.conversation import Conversation, user_text_item
    from rill.transports.realtime.events import ContentPart, Item

    conversation = Conversation()
    first = user_text_item("weather in Paris?")
    conversation.add(first)
    conversation.add(Item(type="function_call", call_id="c1", name="get_weather", arguments="{}"))
    conversation.add(Item(type="function_call_output", call_id="c1", output="sunny"))
    conversation.add(Item(type="message", role="assistant", content=[ContentPart("output_text", "Sunny.")]))
    conversation.add(user_text_item("and Rome?"))
    assert conversation.leave_out_oldest_turn()
    assert [m["role"] for m in conversation.messages("")] == ["user"]  # the call and its output left together
    assert conversation.messages("")[0]["content"] == "and Rome?" and len(conversation.items) == 5
    conversation.add(user_text_item("inserted first"), previous_item_id="root")
    assert conversation.messages("")[0]["content"] == "and Rome?" and conversation.start == 5
    assert conversation.leave_out_oldest_turn() and conversation.messages("") == []
    assert not conversation.leave_out_oldest_turn()
