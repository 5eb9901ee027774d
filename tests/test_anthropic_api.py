"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens): a real server on
127.0.0.1 serving rill-tiny, driven by the anthropic SDK (messages.create, messages.stream and its
text_stream, a tool-use round trip, count_tokens, errors) and by raw httpx with a strict SSE reader
whose event order is checked against Anthropic's streaming reference. The event builder and the
translation also run alone, with no server."""

from __future__ import annotations

import json
import re
import threading

import anthropic
import httpx
import pytest

from helpers_server import assert_nothing_left, one_torch_thread, parse_sse, running_server  # noqa: F401
from rill.anthropic.events import MessageEvents
from rill.anthropic.schema import MessagesRequest
from rill.anthropic.translate import chat_request
from rill.assets import RILL_TINY_DIR
from rill.openai.chat_bodies import ChatDelta, FunctionCallDelta, ToolCallDelta
from rill.openai.errors import ApiError
from rill.transports.http import ServerConfig

MODEL = "rill-tiny"
QUESTION = [{"role": "user", "content": "What is 12 + 30?"}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
RESULT = '{"temperature_c": 21, "condition": "sunny"}'  # get_weather's result in rill-tiny's training
PARIS = [{"role": "user", "content": "What's the weather in Paris?"}]


def serve(**server):
    return running_server(RILL_TINY_DIR, ServerConfig(served_model_names=[MODEL], **server))


def sdk(server, api_key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=15)


async def post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(server.url + path, json=body, headers=headers)


async def post_events(server, body: dict) -> list[dict]:
    response = await post(server, "/v1/messages", {**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = parse_sse(response.text)
    assert all(frame.event == frame.json["type"] for frame in frames), frames
    return [frame.json for frame in frames]


# Anthropic's reference order, one letter per event type: message_start, then blocks (start, deltas,
# stop) with one ping after the first block starts, then message_delta and message_stop.
_LETTERS = {"message_start": "M", "content_block_start": "[", "content_block_delta": "d",
            "content_block_stop": "]", "ping": "p", "message_delta": "D", "message_stop": "Z", "error": "E"}
_ORDER = re.compile(r"^M(\[pd*\](\[d*\])*|p)DZ$")


def check_order(events: list[dict]) -> dict:
    """The events in Anthropic's order, each block's index in turn; returns the message_delta."""
    letters = "".join(_LETTERS[e["type"]] for e in events)
    assert _ORDER.match(letters), letters
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    assert starts == list(range(len(starts)))
    for event in events:
        if event["type"] == "content_block_delta":
            assert event["index"] == starts[-1] or event["index"] in starts
    return next(e for e in events if e["type"] == "message_delta")


# -- the SDK -------------------------------------------------------------------------------------------------


async def test_create_answers_a_message_with_usage():
    async with serve() as server:
        client = sdk(server)
        message = await client.messages.create(model=MODEL, max_tokens=64, messages=QUESTION,
                                               system=[{"type": "text", "text": "You are a calculator."}],
                                               metadata={"user_id": "u-1"})
        counted = await client.messages.count_tokens(model=MODEL, messages=QUESTION,
                                                     system=[{"type": "text", "text": "You are a calculator."}])
        await assert_nothing_left(server)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL and message.stop_reason == "end_turn" and message.stop_sequence is None
    (block,) = message.content
    assert block.type == "text" and "42" in block.text
    assert message.usage.output_tokens > 0
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == counted.input_tokens


async def test_stream_text_stream_and_raw_events_in_anthropic_order():
    async with serve() as server:
        async with sdk(server).messages.stream(model=MODEL, max_tokens=64, messages=QUESTION) as stream:
            pieces = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        events = await post_events(server, {"model": MODEL, "max_tokens": 64, "messages": QUESTION, "temperature": 0})
        await assert_nothing_left(server)
    assert "".join(pieces) == final.content[0].text and "42" in final.content[0].text and len(pieces) > 1
    delta = check_order(events)
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == final.usage.output_tokens
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    streamed = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert streamed == final.content[0].text


async def test_tool_use_round_trip_answers_from_the_tool_result():
    async with serve() as server:
        client = sdk(server)
        first = await client.messages.create(model=MODEL, max_tokens=64, messages=PARIS, tools=[WEATHER])
        assert first.stop_reason == "tool_use"
        call = next(b for b in first.content if b.type == "tool_use")
        assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id.startswith("toolu_")
        follow_up = PARIS + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": RESULT}]},
        ]
        answer = await client.messages.create(model=MODEL, max_tokens=64, messages=follow_up, tools=[WEATHER])
        events = await post_events(server, {"model": MODEL, "max_tokens": 64, "messages": PARIS, "tools": [WEATHER],
                                            "temperature": 0})
        await assert_nothing_left(server)
    assert answer.stop_reason == "end_turn"
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert "21°C" in text and "sunny" in text
    assert check_order(events)["delta"]["stop_reason"] == "tool_use"
    (start,) = [e["content_block"] for e in events if e["type"] == "content_block_start" and
                e["content_block"]["type"] == "tool_use"]
    assert start["name"] == "get_weather" and start["input"] == {}
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}


async def test_tool_choice_any_tool_and_none():
    ask = {"model": MODEL, "max_tokens": 40, "messages": QUESTION, "tools": [WEATHER]}  # rill-tiny: greedy
    async with serve() as server:
        client = sdk(server)
        any_ = await client.messages.create(**ask, tool_choice={"type": "any"})
        named = await client.messages.create(**ask, tool_choice={"type": "tool", "name": "get_weather"})
        none = await client.messages.create(**{**ask, "messages": PARIS}, tool_choice={"type": "none"})
        with pytest.raises(anthropic.BadRequestError) as unknown:
            await client.messages.create(**ask, tool_choice={"type": "tool", "name": "get_time"})
    for message in (any_, named):
        assert message.stop_reason == "tool_use"
        assert [b.name for b in message.content if b.type == "tool_use"] == ["get_weather"]
    assert none.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in none.content)
    assert unknown.value.body["error"]["type"] == "invalid_request_error"
    assert "tool_choice.name" in unknown.value.body["error"]["message"]


async def test_stop_sequences_max_tokens_and_cache_read_input_tokens():
    long_system = "You answer arithmetic questions. " * 30  # a few blocks of the prefix cache
    async with serve() as server:
        client = sdk(server)
        stopped = await client.messages.create(model=MODEL, max_tokens=64, messages=QUESTION,
                                               stop_sequences=["2"])
        cut = await client.messages.create(model=MODEL, max_tokens=2, messages=QUESTION)
        first = await client.messages.create(model=MODEL, max_tokens=8, messages=QUESTION, system=long_system)
        again = await client.messages.create(model=MODEL, max_tokens=8, messages=QUESTION, system=long_system)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "2"
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    assert first.usage.cache_read_input_tokens == 0
    assert again.usage.cache_read_input_tokens > 0
    total = again.usage.input_tokens + again.usage.cache_read_input_tokens
    assert total == first.usage.input_tokens


async def test_thinking_comes_through_the_reasoning_parser():
    """deepseek_r1 reads output as reasoning until `</think>`; rill-tiny never writes one, so its whole
    answer is one thinking block, streamed as thinking_delta events."""
    body = {"model": MODEL, "max_tokens": 2000, "messages": QUESTION,
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    async with serve(reasoning_parser="deepseek_r1") as server:
        message = await sdk(server).messages.create(**body)
        events = await post_events(server, body)
        with pytest.raises(anthropic.BadRequestError) as small:
            await sdk(server).messages.create(**{**body, "thinking": {"type": "enabled", "budget_tokens": 100}})
    (block,) = message.content
    assert block.type == "thinking" and block.thinking.endswith("42")
    check_order(events)
    streamed = "".join(e["delta"]["thinking"] for e in events
                       if e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta")
    assert streamed == block.thinking
    assert "thinking.budget_tokens" in small.value.body["error"]["message"]


async def test_output_config_format_holds_the_answer_to_the_schema():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    async with serve() as server:
        message = await sdk(server).messages.create(
            model=MODEL, max_tokens=40, messages=QUESTION, output_config={"format": {"type": "json_schema",
                                                                                     "schema": schema}})
        bad = await post(server, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": QUESTION,
                                                  "output_config": {"format": {"type": "json_schema",
                                                                               "schema": {"type": "nope"}}}})
    value = json.loads(message.content[0].text)
    assert set(value) == {"answer"} and isinstance(value["answer"], int)
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("output_config.format.schema")


async def test_client_leaving_mid_stream_frees_the_request():
    body = {"model": MODEL, "max_tokens": 400, "messages": QUESTION, "stream": True}
    async with serve() as server:
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", server.url + "/v1/messages", json=body) as response:
                async for line in response.aiter_lines():
                    if "content_block_delta" in line:
                        break  # leave after the first piece of text
        await assert_nothing_left(server)


async def test_image_block_on_a_vision_model_is_seen_and_counted():
    """rill-tiny-vision answers the colour of a circle sent as a base64 image block."""
    import base64
    import io

    from PIL import Image, ImageDraw

    from rill.tiny_vision.evaluate import DEFAULT_MODEL_DIR as VISION

    if not (VISION / "model.safetensors").is_file():
        pytest.skip("rill-tiny-vision not shipped")
    image = Image.new("RGB", (240, 180), "white")
    ImageDraw.Draw(image).ellipse((70, 40, 170, 140), fill=(220, 30, 30))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(buf.getvalue()).decode()}}
    ask = [{"role": "user", "content": [block, {"type": "text", "text": "What colour is the circle?"}]}]
    async with running_server(VISION) as server:
        client = sdk(server)
        message = await client.messages.create(model=str(VISION), max_tokens=5, messages=ask)
        counted = await client.messages.count_tokens(model=str(VISION), messages=ask)
        text_only = await client.messages.count_tokens(model=str(VISION), messages=[
            {"role": "user", "content": "What colour is the circle?"}])
        await assert_nothing_left(server)
    assert message.content[0].text.strip() == "red"
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert counted.input_tokens > text_only.input_tokens + 10  # the image's placeholder tokens


# -- errors and keys ------------------------------------------------------------------------------------------


async def test_errors_in_anthropic_shape():
    async with serve() as server:
        client = sdk(server)
        with pytest.raises(anthropic.BadRequestError) as no_max:
            await client.messages.create(model=MODEL, messages=QUESTION, max_tokens=None)  # type: ignore[arg-type]
        with pytest.raises(anthropic.NotFoundError) as wrong_model:
            await client.messages.create(model="claude-nope", max_tokens=8, messages=QUESTION)
        doc = [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x",
                                                                           "media_type": "text/plain"}}]}]
        unsupported = await post(server, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": doc})
        image = await post(server, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]})
        hot = await post(server, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": QUESTION,
                                                  "temperature": 1.5})
        too_long = await post(server, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [
            {"role": "user", "content": "word " * 40000}]})
        count_long = await post(server, "/v1/messages/count_tokens", {"model": MODEL, "messages": [
            {"role": "user", "content": "word " * 40000}]})
        server_tool = await post(server, "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": QUESTION,
                                                          "tools": [{"type": "web_search_20250305", "name": "web"}]})
        await assert_nothing_left(server)
    assert no_max.value.status_code == 400
    assert no_max.value.body["type"] == "error" and no_max.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in no_max.value.body["error"]["message"]
    assert wrong_model.value.body["error"]["type"] == "not_found_error"
    expected = [(unsupported, "messages.0.content.0.type"), (image, "messages.0.content.0.type"),
                (hot, "temperature"), (too_long, "messages"), (count_long, "messages"), (server_tool, "tools.0.type")]
    for response, field in expected:
        body = response.json()
        assert response.status_code == 400 and body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"].startswith(field), body
        assert body["request_id"].startswith("req_")
    assert "maximum context length is 32768" in too_long.json()["error"]["message"]


async def test_key_as_x_api_key_or_bearer_and_anthropic_version_accepted():
    async with serve(api_key="sekrit") as server:
        by_sdk = await sdk(server, "sekrit").messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
        by_header = await post(server, "/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": QUESTION},
                               {"x-api-key": "sekrit", "anthropic-version": "2023-06-01"})
        with pytest.raises(anthropic.AuthenticationError) as wrong:
            await sdk(server, "wrong").messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
        missing = await post(server, "/v1/messages/count_tokens", {"model": MODEL, "messages": QUESTION})
        openai_route = await post(server, "/v1/chat/completions", {"messages": QUESTION}, {"x-api-key": "sekrit"})
    assert by_sdk.stop_reason in ("end_turn", "max_tokens") and by_header.status_code == 200
    assert wrong.value.status_code == 401 and wrong.value.body["error"]["type"] == "authentication_error"
    assert missing.status_code == 401 and missing.json()["type"] == "error"
    assert openai_route.status_code == 401  # the OpenAI routes take Bearer only, as before


class InjectedFault(RuntimeError):
    """Fault injection: raised by the model runner on purpose, to kill the engine mid-stream."""


async def test_engine_failure_mid_stream_is_an_error_event_in_anthropic_shape():
    body = {"model": MODEL, "max_tokens": 400, "messages": QUESTION, "stream": True}
    async with serve() as server:
        runner = server.engine.core.runner
        real_execute, fail = runner.execute, threading.Event()

        def execute_with_injected_fault(*args, **kwargs):
            if fail.is_set():
                raise InjectedFault("injected fault in the model runner")
            return real_execute(*args, **kwargs)

        runner.execute = execute_with_injected_fault
        raw = ""
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", server.url + "/v1/messages", json=body) as response:
                async for text in response.aiter_text():
                    raw += text
                    if "text_delta" in raw:
                        fail.set()
    events = [frame.json for frame in parse_sse(raw)]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "error"
    assert events[-1]["error"]["type"] == "api_error" and "InjectedFault" in events[-1]["error"]["message"]
    assert "message_stop" not in {e["type"] for e in events}


# -- sans-IO -------------------------------------------------------------------------------------------------------


def test_events_hold_whitespace_and_close_blocks_in_turn():
    events = MessageEvents("msg_1", "m")
    out = events.start(10, 4)
    out += events.feed(ChatDelta(reasoning_content="hmm"))
    out += events.feed(ChatDelta(content="\n\n"))  # whitespace alone opens nothing
    out += events.feed(ChatDelta(tool_calls=[ToolCallDelta(0, "call_1", "function", FunctionCallDelta("f", '{"a"'))]))
    out += events.feed(ChatDelta(tool_calls=[ToolCallDelta(0, function=FunctionCallDelta(arguments=": 1}"))]))
    out += events.finish("tool_use", None, {"input_tokens": 6, "output_tokens": 5})
    check_order(out)
    thinking, call = events.message["content"]
    assert thinking == {"type": "thinking", "thinking": "hmm", "signature": ""}
    assert call["type"] == "tool_use" and call["input"] == {"a": 1} and call["id"].startswith("toolu_")
    started = out[0]["message"]["usage"]
    assert started["cache_read_input_tokens"] == 4 and started["input_tokens"] == 6


def test_translation_puts_tool_results_first_and_continues_a_prefill():
    req = MessagesRequest(model="m", max_tokens=5, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "let me"},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "1"}]}, {"type": "text", "text": "and?"}]},
        {"role": "assistant", "content": "The answer"}])
    import msgspec

    chat = chat_request(msgspec.convert(msgspec.to_builtins(req), MessagesRequest), accepts_images=False)
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "user", "assistant"]
    assert chat.messages[1].tool_calls[0].function.arguments == '{"a": 1}'
    assert chat.messages[2].tool_call_id == "t1" and chat.messages[2].content == "1"
    assert chat.continue_final_message and not chat.add_generation_prompt
    with pytest.raises(ApiError) as bad:
        chat_request(MessagesRequest(model="m", max_tokens=0, messages=[]), accepts_images=False)
    assert bad.value.param == "max_tokens"
