"""The realtime WebSocket API on both listeners: /v1/realtime on the HTTP port (quart-trio on
hypercorn) and the raw trio-websocket listener. One suite, parametrized over the two; a real
trio-websocket client; the real engine on a random-weight model, so answers are checked against
the engine's own greedy output for the same prompt rather than for meaning."""

from __future__ import annotations

import base64
import itertools
import json
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401
from rill.config import EngineConfig
from rill.sampling_params import SamplingParams
from rill.server import serve as rill_serve
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig, RealtimeHub
from rill.transports.realtime.quart_route import realtime_hub

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
GREEDY = {"temperature": 0, "max_response_output_tokens": 6}
EVENT_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(params=["http", "raw"])
def listener(request) -> str:
    return request.param


class RealtimeClient:
    """A trio-websocket client that speaks JSON events and reads them with a deadline."""

    def __init__(self, ws):
        self.ws = ws
        self._ids = itertools.count()

    async def send(self, type_: str, **fields) -> str:
        event_id = f"client_{next(self._ids)}"
        await self.ws.send_message(json.dumps({"type": type_, "event_id": event_id, **fields}))
        return event_id

    async def recv(self) -> dict:
        with trio.fail_after(EVENT_TIMEOUT_S):
            return json.loads(await self.ws.get_message())

    async def until(self, type_: str) -> list[dict]:
        """Events up to and including the first of `type_`."""
        events = []
        while not events or events[-1]["type"] != type_:
            events.append(await self.recv())
        return events

    async def error(self) -> dict:
        event = await self.recv()
        assert event["type"] == "error", event
        return event["error"]

    async def update(self, **session) -> dict:
        await self.send("session.update", session=session)
        return (await self.until("session.updated"))[-1]["session"]

    async def say(self, text: str) -> None:
        await self.send("conversation.item.create",
                        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        assert (await self.recv())["type"] == "conversation.item.added"
        assert (await self.recv())["type"] == "conversation.item.done"

    async def respond(self, **options) -> list[dict]:
        await self.send("response.create", **({"response": options} if options else {}))
        return await self.until("response.done")


def of_type(events: list[dict], type_: str) -> list[dict]:
    return [e for e in events if e["type"] == type_]


def text_of(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def hub(server) -> RealtimeHub:
    return realtime_hub(server.app)


def url_of(server, listener: str) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime" if listener == "http" else server.ws_url


@asynccontextmanager
async def serve(model_dir, **realtime):
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0, **realtime))
    async with running_server(model_dir, config) as server:
        yield server


@asynccontextmanager
async def connect(server, listener: str, *, path: str = "", **kwargs):
    async with open_websocket_url(url_of(server, listener) + path, **kwargs) as ws:
        client = RealtimeClient(ws)
        created = await client.recv()
        assert created["type"] == "session.created"
        yield client


async def engine_answer(server, messages: list[dict], max_tokens: int = 6) -> str:
    """What the engine itself answers to this chat, greedily (the oracle for every answer here)."""
    prompt = server.engine.tokenizer.encode_chat(messages)
    text = ""
    async for delta in server.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens)):
        text += delta.text
    return text


# -- conversations ----------------------------------------------------------------------------------------------


async def test_text_conversation_answers_as_the_engine_does_and_keeps_state(model_dir, listener):
    async with serve(model_dir) as server:
        async with connect(server, listener) as client:
            await client.update(instructions="Be brief.", **GREEDY)
            await client.say("Hello there")
            first = await client.respond()
            types = [e["type"] for e in first]
            assert types[:4] == ["response.created", "response.output_item.added", "conversation.item.added",
                                 "response.content_part.added"]
            assert types[-5:] == ["response.output_text.done", "response.content_part.done",
                                  "response.output_item.done", "conversation.item.done", "response.done"]
            done = first[-1]["response"]
            assert done["status"] == "incomplete" and done["status_details"]["reason"] == "max_output_tokens"
            answer = text_of(first)
            assert done["output"][0]["content"][0]["text"] == answer == first[-5]["text"]
            history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
            assert answer == await engine_answer(server, history)
            usage = done["usage"]
            assert usage["output_tokens"] == 6 and usage["total_tokens"] == usage["input_tokens"] + 6

            await client.say("And then?")
            second = await client.respond()
            history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
            assert text_of(second) == await engine_answer(server, history)
            # The second turn's prompt starts with the first's: the prefix cache serves it.
            assert second[-1]["response"]["usage"]["input_token_details"]["cached_tokens"] > 0
        await wait_for(lambda: server.all_kv_free and hub(server).num_connections == 0)


async def session_seq(server):
    """The engine sequence of the one realtime request in flight, once the worker has taken it in
    (submissions cross to the worker thread asynchronously, so the committed event can come first)."""
    def live():
        return [seqs for request_id, seqs in list(server.engine.core.requests.items()) if request_id.startswith("rt-")]

    await wait_for(lambda: len(live()) == 1)
    return live()[0][0]


async def test_streamed_text_is_prefilled_as_it_arrives_and_answers_like_the_whole_message(model_dir, listener):
    text = "Tell me about the quick brown fox, and the lazy dog it jumps over."
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(**GREEDY)
        for piece in ("Tell me about the qu", "ick brown fox, and the", " lazy dog it jumps over."):
            await client.send("input_text_buffer.append", delta=piece)
        await client.send("input_text_buffer.commit")
        committed, created = await client.recv(), await client.recv()
        assert committed["type"] == "input_text_buffer.committed"
        assert created["item"]["content"] == [{"type": "input_text", "text": text}]
        assert created["item"]["id"] == committed["item_id"]
        # Everything but the last token is in the KV cache before the client asks for the answer.
        seq = await session_seq(server)
        expected = server.engine.tokenizer.encode_chat([{"role": "user", "content": text}])
        await wait_for(lambda: seq.num_computed_tokens == len(expected) - 1)
        assert seq.token_ids == expected
        events = await client.respond()
        assert text_of(events) == await engine_answer(server, [{"role": "user", "content": text}])
        assert events[-1]["response"]["usage"]["input_tokens"] == len(expected)


async def test_response_create_commits_streamed_text_itself(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(**GREEDY)
        await client.send("input_text_buffer.append", delta="Hi there, friend")
        events = await client.respond()
        assert [e["type"] for e in events[:4]] == ["input_text_buffer.committed", "conversation.item.added",
                                                   "conversation.item.done", "response.created"]
        assert text_of(events) == await engine_answer(server, [{"role": "user", "content": "Hi there, friend"}])


async def test_input_during_a_response_waits_for_it_then_forms_the_next_turn(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(temperature=0, max_response_output_tokens=40)
        await client.say("First question")
        await client.send("response.create")
        assert (await client.recv())["type"] == "response.created"
        await client.send("input_text_buffer.append", delta="Second question")
        await client.send("input_text_buffer.commit")
        first = await client.until("response.done")
        assert first[-1]["response"]["status"] == "incomplete"  # ran to its limit: not interrupted
        assert [(await client.recv())["type"] for _ in range(3)] == ["input_text_buffer.committed",
                                                                     "conversation.item.added", "conversation.item.done"]
        second = await client.respond(max_output_tokens=6)
        history = [{"role": "user", "content": "First question"}, {"role": "assistant", "content": text_of(first)},
                   {"role": "user", "content": "Second question"}]
        assert text_of(second) == await engine_answer(server, history)


async def test_respond_per_chunk_answers_each_chunk_and_new_input_interrupts_the_answer(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(temperature=0, max_response_output_tokens=300, output_mode="respond_per_chunk")
        await client.send("input_text_buffer.append", delta="Hello")
        created = await client.recv()
        assert created["type"] == "response.created" and created["response"]["conversation_id"] is None
        while (await client.recv())["type"] != "response.output_text.delta":
            pass
        await client.send("input_text_buffer.append", delta=" again")
        interrupted = (await client.until("response.done"))[-1]["response"]
        assert interrupted["id"] == created["response"]["id"]
        assert interrupted["status"] == "cancelled" and interrupted["status_details"]["reason"] == "turn_detected"
        second = await client.until("response.created")
        assert second[-1]["response"]["id"] != created["response"]["id"]
        await client.send("response.create", response={"max_output_tokens": 4})
        final = await client.until("response.done")
        assert final[-1]["response"]["status_details"]["reason"] == "turn_detected"  # the second interim answer
        assert [e["type"] for e in await client.until("conversation.item.added")] == [
            "input_text_buffer.committed", "conversation.item.added"]
        final = await client.until("response.done")
        types = [e["type"] for e in final]
        done = final[-1]["response"]
        assert done["conversation_id"] is not None and done["usage"]["output_tokens"] == 4
        # Interim answers are out of band: the conversation holds the message and the final answer.
        assert done["output"][0]["content"][0]["text"] == text_of(final[types.index("response.created"):])
    await wait_for(lambda: server.all_kv_free)


# -- cancel, disconnect ------------------------------------------------------------------------------------------


async def test_cancel_stops_generation_at_once_and_frees_kv(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(temperature=0, max_response_output_tokens=500)
        await client.say("Go on and on")
        await client.send("response.create")
        created = await client.until("response.output_text.delta")
        assert not server.all_kv_free
        await client.send("response.cancel", response_id=created[0]["response"]["id"])
        done = (await client.until("response.done"))[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        assert done["output"][0]["status"] == "incomplete"
        await wait_for(lambda: server.all_kv_free, seconds=5)
        assert server.engine.core.stats.num_generation_tokens < 500
        await client.say("Next")  # still usable
        assert (await client.respond(max_output_tokens=2))[-1]["response"]["status"] == "incomplete"


@pytest.mark.parametrize("during", ["response", "streamed_input"])
async def test_disconnect_aborts_and_frees_kv(model_dir, listener, during):
    async with serve(model_dir) as server:
        async with connect(server, listener) as client:
            await client.update(temperature=0, max_response_output_tokens=500)
            if during == "response":
                await client.say("Go on")
                await client.send("response.create")
                await client.until("response.output_text.delta")
            else:
                await client.send("input_text_buffer.append", delta="A long message that keeps on ")
                await wait_for(lambda: not server.all_kv_free)
        await wait_for(lambda: server.all_kv_free and not server.engine.core.requests, seconds=5)
        await wait_for(lambda: hub(server).num_connections == 0)
        assert server.engine.core.stats.num_aborted == 1


# -- tools ----------------------------------------------------------------------------------------------------------


async def test_tool_call_round_trip(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, **GREEDY)
        await client.say("Weather in Paris?")
        events = await client.respond()
        added = [e for e in events if e["type"] == "response.output_item.added"]
        assert [e["item"]["type"] for e in added] == ["function_call"]
        call = added[0]["item"]
        assert call["name"] == "get_weather" and call["call_id"].startswith("call_")
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
        (args_done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert args_done["arguments"] == deltas and args_done["call_id"] == call["call_id"]
        assert events[-1]["response"]["output"][0]["arguments"] == deltas

        await client.send("conversation.item.create", item={"type": "function_call_output",
                                                            "call_id": call["call_id"], "output": '{"temp_c": 21}'})
        assert (await client.recv())["item"]["type"] == "function_call_output"
        await client.update(tool_choice="auto")
        answer = await client.respond()
        tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
        history = [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": call["call_id"], "type": "function",
                    "function": {"name": "get_weather", "arguments": deltas}}]},
                   {"role": "tool", "tool_call_id": call["call_id"], "content": '{"temp_c": 21}'}]
        prompt = server.engine.tokenizer.encode_chat(history, tools=tools)
        assert answer[-1]["response"]["usage"]["input_tokens"] == len(prompt)


# -- errors: one error event each, the connection stays usable ---------------------------------------------------


# -- truncation: a conversation past the context ---------------------------------------------------------------


def long_turn(k: int) -> str:
    """A user message of about 300 tokens (the test model's context is 1,024)."""
    return " ".join(f"w{k}x{i}" for i in range(60))


async def fill(client, turns: int) -> list[dict]:
    """`turns` long user messages, each answered with 2 tokens; returns the chat as the engine reads it."""
    history = []
    for k in range(turns):
        await client.say(long_turn(k))
        answer = text_of(await client.respond(temperature=0, max_output_tokens=2))
        history += [{"role": "user", "content": long_turn(k)}, {"role": "assistant", "content": answer}]
    return history


async def test_a_conversation_past_the_context_leaves_its_oldest_turns_out(model_dir, listener):
    """truncation "auto" (the default): the oldest turns leave the model's context, one at a time, until
    the new message fits; they stay in the conversation. Streamed and created messages alike."""
    async with serve(model_dir) as server, connect(server, listener) as client:
        session = await client.update(temperature=0, max_output_tokens=4)
        assert session["truncation"] == "auto"
        history = await fill(client, 3)
        assert len(server.engine.tokenizer.encode_chat([*history, {"role": "user", "content": long_turn(3)}])) > 1024
        for piece in (long_turn(3)[:150], long_turn(3)[150:]):
            await client.send("input_text_buffer.append", delta=piece)
        events = await client.respond()
        done = events[-1]["response"]
        assert done["status"] == "incomplete" and not of_type(events, "error")
        kept = [*history[2:], {"role": "user", "content": long_turn(3)}]  # the first turn left out
        assert done["usage"]["input_tokens"] == len(server.engine.tokenizer.encode_chat(kept))
        assert text_of(events) == await engine_answer(server, kept, 4)
        history = [*kept, {"role": "assistant", "content": text_of(events)}]
        await client.say(long_turn(4))  # a created message, answered by response.create
        events = await client.respond()
        kept = [*history[2:], {"role": "user", "content": long_turn(4)}]
        assert text_of(events) == await engine_answer(server, kept, 4)
        assert events[-1]["response"]["usage"]["input_tokens"] == len(server.engine.tokenizer.encode_chat(kept))
    await wait_for(lambda: server.all_kv_free)


async def test_truncation_disabled_refuses_a_message_past_the_context(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        assert (await client.update(truncation="disabled", temperature=0))["truncation"] == "disabled"
        await fill(client, 3)
        await client.send("input_text_buffer.append", delta=long_turn(3))
        error = await client.error()
        assert error["code"] == "context_length_exceeded" and "dropped" in error["message"]
        await client.say(long_turn(3))  # the connection goes on; a created message is not cut either
        await client.send("response.create", response={"max_output_tokens": 2})
        error = await client.error()
        assert error["code"] == "context_length_exceeded"
    await wait_for(lambda: server.all_kv_free)


async def test_a_retention_ratio_leaves_out_more_at_once(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        for bad in (0, 1.5):
            await client.send("session.update", session={"truncation": {"type": "retention_ratio",
                                                                        "retention_ratio": bad}})
            error = await client.error()
            assert (error["code"], error["param"]) == ("invalid_value", "session.truncation.retention_ratio")
        session = await client.update(truncation={"type": "retention_ratio", "retention_ratio": 0.6},
                                      temperature=0, max_output_tokens=2)
        assert session["truncation"] == {"type": "retention_ratio", "retention_ratio": 0.6}
        history = await fill(client, 3)
        await client.say(long_turn(3))
        events = await client.respond()
        # 4 x ~305 tokens: "auto" leaves one turn out (it then fits); 0.6 leaves out two, down to 616 <= 0.6 x 1,235
        kept = [*history[4:], {"role": "user", "content": long_turn(3)}]
        assert events[-1]["response"]["usage"]["input_tokens"] == len(server.engine.tokenizer.encode_chat(kept))
    await wait_for(lambda: server.all_kv_free)


async def test_a_bad_response_create_leaves_the_streamed_message_as_it_was(model_dir, listener):
    text = "Hi there, friend of mine"
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.update(**GREEDY)
        await client.send("input_text_buffer.append", delta=text)
        await client.send("response.create", response={"max_output_tokens": 0})
        assert (await client.error())["code"] == "invalid_value"
        events = await client.respond()
        assert text_of(events) == await engine_answer(server, [{"role": "user", "content": text}])


async def test_every_bad_event_gets_an_error_event_and_the_connection_stays_usable(model_dir, listener):
    async with serve(model_dir, max_message_bytes=4096) as server, connect(server, listener) as client:
        bad = [
            ("{not json", "invalid_json", None),
            ('{"type": "session.dance", "event_id": "e1"}', "unknown_event", "e1"),
            ('{"event_id": "e2"}', "missing_required_parameter", "e2"),
            ('{"type": "input_text_buffer.append", "event_id": "e3"}', "missing_required_parameter", "e3"),
            ('{"type": "input_text_buffer.append", "event_id": "e4", "delta": 7}', "invalid_type", "e4"),
            ('{"type": "response.create", "event_id": "e5", "response": {"temperature": "hot"}}', "invalid_type", "e5"),
            ('{"type": "response.cancel", "event_id": "e6"}', "response_cancel_not_active", "e6"),
            ('{"type": "input_text_buffer.commit", "event_id": "e7"}', "input_text_buffer_commit_empty", "e7"),
            ('{"type": "input_audio_buffer.append", "event_id": "e8", "audio": "%%%"}', "invalid_audio", "e8"),
            (json.dumps({"type": "input_text_buffer.append", "delta": "x" * 5000}), "message_too_large", None),
        ]
        for frame, code, event_id in bad:
            await client.ws.send_message(frame)
            error = await client.error()
            assert (error["code"], error["event_id"]) == (code, event_id), frame[:80]
            assert error["type"] == "invalid_request_error" and error["message"]
        await client.ws.send_message(b'{"type": "response.create"}')
        assert (await client.error())["code"] == "binary_not_supported"
        await client.say("still here?")
        assert (await client.respond(max_output_tokens=2))[-1]["response"]["usage"]["output_tokens"] == 2


async def test_audio_to_a_model_without_an_audio_front_end_is_refused_clearly(model_dir, listener):
    pcm = base64.b64encode(bytes(3200)).decode()  # 100 ms of silence, 16 kHz PCM16
    async with serve(model_dir) as server, connect(server, listener) as client:
        await client.send("input_audio_buffer.append", audio=pcm)
        error = await client.error()
        assert error["code"] == "audio_not_supported" and "audio front end" in error["message"]
        await client.send("input_audio_buffer.commit", final=True)
        assert (await client.error())["code"] == "audio_not_supported"
        await client.send("input_audio_buffer.clear")
        assert (await client.recv())["type"] == "input_audio_buffer.cleared"
        await client.say("text works")
        assert (await client.respond(max_output_tokens=1))[-1]["type"] == "response.done"


async def test_a_frame_past_the_transport_limit_closes_with_1009(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        with pytest.raises(ConnectionClosed) as closed:
            await client.ws.send_message("x" * ((16 << 20) + 1))
            await client.recv()
        assert closed.value.reason.code == 1009
        await wait_for(lambda: hub(server).num_connections == 0)


# -- admission, keepalive, timeouts -----------------------------------------------------------------------------


async def test_api_key_by_header_or_browser_subprotocol(model_dir, listener):
    config = ServerConfig(api_key="sekret", realtime=RealtimeConfig(ws_port=0))
    async with running_server(model_dir, config) as server:
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(url_of(server, listener)):
                pass
        assert rejected.value.status_code == 401
        assert json.loads(rejected.value.body)["error"]["code"] == "invalid_api_key"
        with pytest.raises(ConnectionRejected):
            async with open_websocket_url(url_of(server, listener), extra_headers=[(b"authorization", b"Bearer no")]):
                pass
        async with connect(server, listener, extra_headers=[(b"authorization", b"Bearer sekret")]):
            pass
        protocols = ["realtime", "openai-insecure-api-key.sekret"]
        async with connect(server, listener, subprotocols=protocols) as client:
            assert client.ws.subprotocol == "realtime"  # never the key
        assert hub(server).num_refused == 2


async def test_connection_cap_covers_both_listeners(model_dir):
    async with serve(model_dir, max_connections=1) as server:
        async with connect(server, "http"):
            with pytest.raises(ConnectionRejected) as rejected:
                async with open_websocket_url(url_of(server, "raw")):
                    pass
            assert rejected.value.status_code == 503
            assert json.loads(rejected.value.body)["error"]["code"] == "too_many_connections"
        await wait_for(lambda: hub(server).num_connections == 0)
        async with connect(server, "raw"):
            assert hub(server).num_connections == 1


async def test_unknown_model_in_the_url_is_refused(model_dir, listener):
    async with serve(model_dir) as server:
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(url_of(server, listener) + "?model=no-such-model"):
                pass
        assert rejected.value.status_code == 404
        async with connect(server, listener, path=f"?model={server.serving.model_names[0]}"):
            pass


async def test_idle_connection_is_told_and_closed(model_dir, listener):
    async with serve(model_dir, idle_timeout_s=0.5) as server, connect(server, listener) as client:
        assert (await client.error())["code"] == "idle_timeout"
        with pytest.raises(ConnectionClosed) as closed:
            await client.recv()
        assert closed.value.reason.code == 1001
        await wait_for(lambda: hub(server).num_connections == 0)


async def test_client_pings_get_pongs(model_dir, listener):
    async with serve(model_dir) as server, connect(server, listener) as client:
        with trio.fail_after(5):
            await client.ws.ping(b"are you there")


async def test_both_listeners_drop_a_peer_that_never_answers_pings(model_dir, listener):
    """Fault injection: a hand-rolled client that completes the handshake and then never reads."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    async with serve(model_dir, ping_interval_s=0.2) as server:
        host, port = url_of(server, listener).removeprefix("ws://").split("/")[0].split(":")
        stream = await trio.open_tcp_stream(host, int(port))
        deaf = WSConnection(ConnectionType.CLIENT)
        target = "/v1/realtime" if listener == "http" else "/"
        await stream.send_all(deaf.send(Request(host=host, target=target)))
        with trio.fail_after(5):
            while not any(isinstance(e, AcceptConnection) for e in deaf.events()):
                deaf.receive_data(await stream.receive_some())
        assert hub(server).num_connections == 1
        await wait_for(lambda: hub(server).num_connections == 0, seconds=10)
        await stream.aclose()


async def test_neither_listener_accepts_permessage_deflate(model_dir, listener):
    """A compressed message could inflate far past the message cap before the cap is checked."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request
    from wsproto.extensions import PerMessageDeflate

    async with serve(model_dir) as server:
        host, port = url_of(server, listener).removeprefix("ws://").split("/")[0].split(":")
        stream = await trio.open_tcp_stream(host, int(port))
        client = WSConnection(ConnectionType.CLIENT)
        target = "/v1/realtime" if listener == "http" else "/"
        await stream.send_all(client.send(Request(host=host, target=target, extensions=[PerMessageDeflate()])))
        with trio.fail_after(5):
            while not (accepted := [e for e in client.events() if isinstance(e, AcceptConnection)]):
                client.receive_data(await stream.receive_some())
        assert accepted[0].extensions == []
        await stream.aclose()


async def test_beta_clients_get_beta_event_names(model_dir, listener):
    async with serve(model_dir) as server:
        async with connect(server, listener, extra_headers=[(b"openai-beta", b"realtime=v1")]) as client:
            await client.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "hi"}]})
            assert (await client.recv())["type"] == "conversation.item.created"  # the beta's name
            types = {e["type"] for e in await client.respond(max_output_tokens=2)}
            assert "response.text.delta" in types and "response.output_text.delta" not in types
            assert not types & {"conversation.item.added", "conversation.item.done"}  # GA's names


async def test_rill_serve_runs_both_listeners_in_its_root_nursery_and_stops_them(model_dir):
    stop = trio.Event()
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0))
    engine = EngineConfig(model=str(model_dir), num_kv_blocks=64)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            http_url, ws_url = await nursery.start(partial(rill_serve, engine, config, "127.0.0.1", 0, 0.5,
                                                           shutdown_trigger=stop.wait))
            async with open_websocket_url(http_url.replace("http://", "ws://") + "/v1/realtime") as quart_ws, \
                    open_websocket_url(ws_url) as raw_ws:
                for ws in (quart_ws, raw_ws):
                    assert json.loads(await ws.get_message())["type"] == "session.created"
                stop.set()
                for ws in (quart_ws, raw_ws):
                    with pytest.raises(ConnectionClosed):
                        await ws.get_message()
        # serve() returned: both listeners and the engine are down.
