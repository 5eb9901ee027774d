"""POST /v1/responses, OpenAI's Responses API: a real server on 127.0.0.1 serving rill-tiny, driven by
the openai SDK (responses.create, responses.stream, responses.parse) and by raw httpx with a strict
SSE reader whose events are checked against OpenAI's reference (the SDK's own event types and the
order its docs give). The event builder and the translation also run alone, with no server."""

from __future__ import annotations

import json
import re
import threading
import typing

import httpx
import jsonschema
import openai
import pydantic
import pytest
import trio
from openai.types.responses import ResponseStreamEvent

from helpers_server import assert_nothing_left, one_torch_thread, parse_sse, running_server  # noqa: F401
from rill.assets import RILL_TINY_DIR
from rill.openai.chat_bodies import ChatDelta, FunctionCallDelta, ToolCallDelta
from rill.openai.errors import ApiError
from rill.openai.responses_api.events import ResponseEvents, usage_dict
from rill.openai.responses_api.run import ResponseRun, ResponsesContext, prepare_response
from rill.openai.responses_api.schema import InputItem, ResponsesRequest
from rill.openai.responses_api.translate import chat_request, renamed
from rill.transports.http import ServerConfig

MODEL = "rill-tiny"
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
RESULT = '{"temperature_c": 21, "condition": "sunny"}'  # get_weather's result in rill-tiny's training
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def _event_types() -> dict[str, type]:
    """The SDK's event model for each event type (a failed check then names the one that applies)."""
    union = typing.get_args(ResponseStreamEvent)[0]
    return {typing.get_args(model.model_fields["type"].annotation)[0]: model for model in typing.get_args(union)}


EVENT_TYPES = _event_types()


def serve():
    return running_server(RILL_TINY_DIR, ServerConfig(served_model_names=[MODEL]))


def sdk(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


async def post_events(server, body: dict) -> list[dict]:
    """A streamed response's events; each frame's `event:` line names its data's type."""
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", server.v1 + "/responses", json={**body, "stream": True}) as response:
            raw = (await response.aread()).decode()
    assert response.status_code == 200, raw
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = parse_sse(raw)
    assert all(frame.event == frame.json["type"] for frame in frames), frames
    return [frame.json for frame in frames]


# -- OpenAI's reference order ---------------------------------------------------------------------------------

# Per output item, the events OpenAI's streaming reference lists, in that order; then exactly one
# terminal event. Written over one letter per event type so that a regular expression can hold it.
_LETTERS = {
    "response.created": "C", "response.in_progress": "P", "response.output_item.added": "A",
    "response.content_part.added": "[", "response.output_text.delta": "t", "response.output_text.done": "T",
    "response.reasoning_text.delta": "r", "response.reasoning_text.done": "R", "response.content_part.done": "]",
    "response.function_call_arguments.delta": "f", "response.function_call_arguments.done": "F",
    "response.output_item.done": "D", "response.completed": "Z", "response.incomplete": "Z",
    "response.failed": "X", "error": "E",
}
_ORDER = re.compile(r"CP(A(\[t*T\]|\[r*R\]|f*F)D)*(Z|E?X)")


def check_reference_order(events: list[dict]) -> dict:
    """The events parse as the SDK's types, number 0, 1, 2, ..., follow OpenAI's order, and every item
    event names the item opened last; returns the final response."""
    for event in events:
        EVENT_TYPES[event["type"]].model_validate(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    letters = "".join(_LETTERS[e["type"]] for e in events)
    assert _ORDER.fullmatch(letters), letters
    index, item_id = -1, None
    for event in events:
        if event["type"] == "response.output_item.added":
            index, item_id = index + 1, event["item"]["id"]
            assert event["output_index"] == index
        elif "output_index" in event:
            assert event["output_index"] == index
            assert event.get("item_id", event.get("item", {}).get("id")) == item_id
    final = events[-1]["response"]
    assert [item["id"] for item in final["output"]] == [e["item"]["id"] for e in events
                                                         if e["type"] == "response.output_item.done"]
    return final


# -- create --------------------------------------------------------------------------------------------------


async def test_create_with_a_string_answers_with_a_message_and_usage():
    async with serve() as server:
        out = await sdk(server).responses.create(model=MODEL, input="What is 12 + 30?", temperature=0)
    assert out.object == "response" and out.status == "completed" and out.id.startswith("resp_")
    (message,) = out.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert out.output_text.endswith("42")
    assert out.usage.input_tokens > 5 and out.usage.output_tokens > 0
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.usage.input_tokens_details.cached_tokens == 0
    assert out.usage.output_tokens_details.reasoning_tokens == 0


async def test_create_with_items_and_instructions_renders_both_into_the_prompt():
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 12 + 30?"}]}]
    async with serve() as server:
        client = sdk(server)
        plain = await client.responses.create(model=MODEL, input=items, temperature=0)
        told = await client.responses.create(model=MODEL, input=items, instructions="You add numbers.",
                                             temperature=0, metadata={"run": "7"}, user="u1")
    assert plain.output_text.endswith("42")
    assert told.status == "completed" and told.instructions == "You add numbers."
    assert told.usage.input_tokens > plain.usage.input_tokens  # the system message is in the prompt
    assert told.metadata == {"run": "7"} and told.user == "u1"


async def test_max_output_tokens_makes_the_response_incomplete():
    async with serve() as server:
        out = await sdk(server).responses.create(model=MODEL, input="What is 12 + 30?", max_output_tokens=3)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 3 and out.max_output_tokens == 3
    assert out.output[0].status == "incomplete"


# -- streaming -------------------------------------------------------------------------------------------------


async def test_stream_follows_openai_reference_order_and_joins_to_the_whole_answer():
    body = {"model": MODEL, "input": "What is 12 + 30?", "temperature": 0}
    async with serve() as server:
        events = await post_events(server, body)
        async with httpx.AsyncClient(timeout=60) as client:
            whole = (await client.post(server.v1 + "/responses", json=body)).json()
    final = check_reference_order(events)
    assert final["status"] == "completed" and events[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == final["output"][0]["content"][0]["text"] == whole["output"][0]["content"][0]["text"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


async def test_stream_cut_by_max_output_tokens_ends_with_response_incomplete():
    async with serve() as server:
        events = await post_events(server, {"model": MODEL, "input": "What is 12 + 30?", "max_output_tokens": 2})
    final = check_reference_order(events)
    assert events[-1]["type"] == "response.incomplete" and final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_sdk_stream_helpers_give_the_final_response_and_its_text():
    async with serve() as server:
        async with sdk(server).responses.stream(model=MODEL, input="What is 12 + 30?", temperature=0) as stream:
            deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    assert final.status == "completed" and final.output_text.endswith("42")
    assert "".join(deltas) == final.output_text


async def test_stream_of_a_function_call_sends_its_arguments_in_order():
    async with serve() as server:
        events = await post_events(server, {"model": MODEL, "input": "What's the weather in Paris?",
                                            "tools": [WEATHER], "temperature": 0})
    final = check_reference_order(events)
    (call,) = [item for item in final["output"] if item["type"] == "function_call"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert json.loads(deltas) == json.loads(call["arguments"]) == {"city": "Paris"}
    assert done[0]["arguments"] == call["arguments"] and call["name"] == "get_weather"


async def test_client_leaving_mid_stream_aborts_the_engine_request():
    body = {"model": MODEL, "input": "What is 12 + 30?", "max_output_tokens": 2000, "stream": True,
            "text": {"format": {"type": "json_object"}}}  # an object that never has to end
    async with serve() as server:
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", server.v1 + "/responses", json=body) as response:
                lines = response.aiter_lines()
                with trio.fail_after(30):
                    async for line in lines:
                        if "output_text.delta" in line:
                            break
        await assert_nothing_left(server)


async def test_reasoning_parser_output_is_a_reasoning_item_streamed_and_not():
    """deepseek_r1 reads output as reasoning until `</think>`; rill-tiny never writes one, so its whole
    answer is reasoning: one reasoning item whose tokens usage counts as reasoning tokens."""
    body = {"model": MODEL, "input": "What is 12 + 30?", "temperature": 0}
    config = ServerConfig(served_model_names=[MODEL], reasoning_parser="deepseek_r1")
    async with running_server(RILL_TINY_DIR, config) as server:
        events = await post_events(server, body)
        out = await sdk(server).responses.create(**body)
    final = check_reference_order(events)
    (item,) = out.output
    assert item.type == "reasoning" and item.content[0].text.endswith("42") and out.output_text == ""
    assert out.usage.output_tokens_details.reasoning_tokens == out.usage.output_tokens
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert streamed == final["output"][0]["content"][0]["text"] == item.content[0].text


class InjectedFault(RuntimeError):
    """Fault injection: raised by the model runner on purpose, to kill the engine mid-stream."""


async def test_engine_failure_mid_stream_is_an_error_event_then_response_failed():
    body = {"model": MODEL, "input": "What is 12 + 30?", "max_output_tokens": 400, "stream": True,
            "text": {"format": {"type": "json_object"}}}
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
            async with client.stream("POST", server.v1 + "/responses", json=body) as response:
                async for text in response.aiter_text():
                    raw += text
                    if "output_text.delta" in raw:
                        fail.set()
    events = [frame.json for frame in parse_sse(raw)]
    final = check_reference_order(events)
    error = events[-2]
    assert error["type"] == "error" and "InjectedFault" in error["message"]
    assert final["status"] == "failed" and final["error"]["code"] == "server_error"
    assert final["output"][0]["status"] == "incomplete"


async def test_cancelling_a_run_aborts_its_engine_request_and_its_snapshot_keeps_what_it_wrote():
    """The seam background runs use: run(emit) inside a cancel scope; once cancelled, the engine request
    is gone (KV free) and snapshot("cancelled") holds the partial message, marked incomplete."""
    body = json.dumps({"model": MODEL, "input": "What is 12 + 30?", "max_output_tokens": 2000,
                       "text": {"format": {"type": "json_object"}}}).encode()
    async with serve() as server:
        ctx = ResponsesContext(server.serving)
        job = prepare_response(ctx, body, server.serving.new_trace("/v1/responses", "resp"))
        run = ResponseRun(ctx, job, response_id="resp_1", created_at=0)
        seen: list[dict] = []

        async def emit(event: dict) -> None:
            seen.append(event)
            if event["type"] == "response.output_text.delta" and len(seen) > 8:
                scope.cancel()

        with trio.CancelScope() as scope:
            await run.run(emit)
        assert run.final is None and scope.cancelled_caught
        await assert_nothing_left(server)
    cancelled = run.snapshot("cancelled")
    (message,) = cancelled["output"]
    assert cancelled["status"] == "cancelled" and message["status"] == "incomplete"
    assert message["content"][0]["text"] == "".join(e["delta"] for e in seen if "delta" in e)
    assert cancelled["usage"]["output_tokens"] >= 4
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))


# -- tools and formats -----------------------------------------------------------------------------------------


async def test_function_tool_round_trip_answers_from_the_function_call_output():
    question = {"role": "user", "content": "What's the weather in Paris?"}
    async with serve() as server:
        client = sdk(server)
        first = await client.responses.create(model=MODEL, input=[question], tools=[WEATHER], temperature=0)
        (call,) = first.output
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
        assert json.loads(call.arguments) == {"city": "Paris"}
        follow_up = [question, call.model_dump(exclude_none=True),
                     {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
        answer = await client.responses.create(model=MODEL, input=follow_up, tools=[WEATHER], temperature=0)
    assert answer.status == "completed" and "21°C" in answer.output_text and "sunny" in answer.output_text


async def test_tool_choice_required_forces_a_call_and_none_forbids_one():
    ask = {"model": MODEL, "input": "What's the weather in Paris?", "tools": [WEATHER], "temperature": 0,
           "max_output_tokens": 40}
    async with serve() as server:
        client = sdk(server)
        forced = await client.responses.create(**ask, tool_choice="required")
        named = await client.responses.create(**ask, tool_choice={"type": "function", "name": "get_weather"})
        none = await client.responses.create(**ask, tool_choice="none")
    for out in (forced, named):
        assert [(item.type, item.name) for item in out.output] == [("function_call", "get_weather")]
        assert json.loads(out.output[0].arguments) == {"city": "Paris"}
    assert [item.type for item in none.output] == ["message"] and none.tool_choice == "none"


async def test_text_format_json_schema_is_enforced_and_the_sdk_parses_it():
    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        age: int = pydantic.Field(ge=0, le=120)

    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    async with serve() as server:
        client = sdk(server)
        out = await client.responses.create(model=MODEL, input="Describe a person.", text=fmt, temperature=0,
                                            max_output_tokens=100)
        parsed = await client.responses.parse(model=MODEL, input="Who wrote the first program?",
                                              text_format=Person, temperature=0, max_output_tokens=100)
    jsonschema.validate(json.loads(out.output_text), PERSON)
    assert out.text.format.type == "json_schema"
    assert isinstance(parsed.output_parsed, Person)


# -- bad input -------------------------------------------------------------------------------------------------

BAD_BODIES = [
    ({"model": MODEL}, 400, "input", "missing_required_parameter"),
    ({"model": MODEL, "input": []}, 400, "input", "missing_required_parameter"),
    ({"model": MODEL, "input": [{"type": "web_search_call", "id": "ws_1"}]}, 400, "input[0].type", "unsupported"),
    ({"model": MODEL, "input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role", "invalid_value"),
    ({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     400, "input[0].content[0].type", "unsupported"),
    ({"model": MODEL, "input": [{"type": "function_call_output", "output": "{}"}]}, 400, "input[0].call_id",
     "missing_required_parameter"),
    ({"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type", "unsupported"),
    ({"model": MODEL, "input": "hi", "tools": [{"type": "function"}]}, 400, "tools[0].name",
     "missing_required_parameter"),
    ({"model": MODEL, "input": "hi", "tools": [{**WEATHER, "parameters": {"type": "strng"}}]}, 400,
     "tools[0].parameters", None),
    ({"model": MODEL, "input": "hi", "tool_choice": "required"}, 400, "tool_choice", "invalid_value"),
    ({"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400,
     "text.format.schema", "missing_required_parameter"),
    ({"model": MODEL, "input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens", None),
    ({"model": MODEL, "input": "hi", "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ({"model": MODEL, "input": "hi", "background": True, "store": False}, 400, "store", "invalid_value"),
    ({"model": "gpt-4o", "input": "hi"}, 404, "model", "model_not_found"),
]


async def test_bad_input_gets_an_openai_shaped_error_naming_the_field():
    async with serve() as server:
        async with httpx.AsyncClient(timeout=60) as client:
            for body, status, param, code in BAD_BODIES:
                for stream in (False, True):  # a stream that cannot start is refused before its first byte
                    response = await client.post(server.v1 + "/responses", json={**body, "stream": stream})
                    assert response.status_code == status, (body, response.text)
                    error = response.json()["error"]
                    assert set(error) == {"message", "type", "param", "code"}
                    assert error["param"] == param, (body, error)
                    assert code is None or error["code"] == code, (body, error)
                    assert error["type"] == "invalid_request_error"
        await assert_nothing_left(server)


async def test_sdk_raises_bad_request_for_an_unknown_item_type():
    async with serve() as server:
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk(server).responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_1"}])
    assert caught.value.body["param"] == "input[0].type"


# -- the event builder alone -----------------------------------------------------------------------------------


def fields() -> dict:
    return {"id": "resp_1", "object": "response", "created_at": 0, "model": MODEL, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": []}


def call_start(index: int, name: str, arguments: str = "") -> ChatDelta:
    return ChatDelta(tool_calls=[ToolCallDelta(index, f"call_{index}", "function", FunctionCallDelta(name, arguments))])


def call_arguments(index: int, arguments: str) -> ChatDelta:
    return ChatDelta(tool_calls=[ToolCallDelta(index, function=FunctionCallDelta(arguments=arguments))])


def build(deltas: list[ChatDelta], status: str = "completed") -> list[dict]:
    builder = ResponseEvents(fields())
    events = builder.start()
    for delta in deltas:
        events += builder.on_delta(delta)
    usage = usage_dict(1, 0, 1, 0)
    details = {"incomplete_reason": "max_output_tokens"} if status == "incomplete" else {}
    more, _ = builder.finish(status, usage, **details)
    return events + more


def test_reasoning_then_text_make_a_reasoning_item_then_a_message():
    events = build([ChatDelta(reasoning_content="12 + 30"), ChatDelta(reasoning_content=" is 42."),
                    ChatDelta(content="42")])
    final = check_reference_order(events)
    reasoning, message = final["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text",
                                                                          "text": "12 + 30 is 42."}]
    assert reasoning["summary"] == [] and message["content"][0]["text"] == "42"
    done = [e for e in events if e["type"] == "response.reasoning_text.done"]
    assert done[0]["text"] == "12 + 30 is 42." and done[0]["item_id"] == reasoning["id"]


def test_whitespace_before_a_call_opens_no_message_and_text_after_it_opens_one():
    events = build([ChatDelta(content="\n"), call_start(0, "get_weather", '{"city"'), call_arguments(0, ': "Paris"}'),
                    ChatDelta(content="Done.")])
    final = check_reference_order(events)
    assert [item["type"] for item in final["output"]] == ["function_call", "message"]
    assert final["output"][0]["arguments"] == '{"city": "Paris"}'
    assert final["output"][1]["content"][0]["text"] == "Done."


def test_two_calls_are_two_items_each_with_its_own_arguments():
    events = build([call_start(0, "get_weather", '{"city": "Paris"}'), call_start(1, "get_time"),
                    call_arguments(1, '{"timezone": "CET"}')])
    final = check_reference_order(events)
    assert [(i["name"], i["arguments"]) for i in final["output"]] == [
        ("get_weather", '{"city": "Paris"}'), ("get_time", '{"timezone": "CET"}')]
    assert len({i["call_id"] for i in final["output"]}) == 2


def test_incomplete_closes_the_open_item_as_incomplete():
    events = build([ChatDelta(content="12 +")], status="incomplete")
    final = check_reference_order(events)
    assert final["status"] == "incomplete" and final["output"][0]["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_answer_is_still_one_message():
    final = check_reference_order(build([]))
    assert [item["type"] for item in final["output"]] == ["message"]
    assert final["output"][0]["content"][0]["text"] == ""


def test_events_keep_the_item_as_it_was_when_they_were_sent():
    events = build([ChatDelta(content="4"), ChatDelta(content="2")])
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["content"] == [] and added["item"]["status"] == "in_progress"


# -- the translation alone -------------------------------------------------------------------------------------


def translate(**body) -> list:
    req = ResponsesRequest(**{"model": MODEL, **body})
    items = [InputItem(type="message", role="user", content=req.input)] if isinstance(req.input, str) else req.input
    return chat_request(req, [], items)


def test_calls_join_one_assistant_message_and_outputs_become_tool_messages():
    items = [InputItem(role="user", content="Weather in Paris and Rome?"),
             InputItem(type="function_call", call_id="c1", name="get_weather", arguments='{"city": "Paris"}'),
             InputItem(type="function_call", call_id="c2", name="get_weather", arguments='{"city": "Rome"}'),
             InputItem(type="function_call_output", call_id="c1", output=RESULT),
             InputItem(type="function_call_output", call_id="c2", output=RESULT)]
    req = translate(input=items, instructions="Be brief.")
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert req.messages[0].content == "Be brief."
    assert [c.id for c in req.messages[2].tool_calls] == ["c1", "c2"]
    assert [m.tool_call_id for m in req.messages[3:]] == ["c1", "c2"]


def test_flat_tools_become_chat_tools_strict_by_default_as_openai():
    req = translate(input="hi", tools=[msgspec_tool(WEATHER), msgspec_tool({**WEATHER, "strict": False})],
                    tool_choice="auto")
    assert [t.function.strict for t in req.tools] == [True, False]
    assert req.tools[0].function.parameters == WEATHER["parameters"]


def msgspec_tool(tool: dict):
    import msgspec

    from rill.openai.responses_api.schema import ToolDef
    return msgspec.convert(tool, ToolDef)


def test_chat_field_names_in_errors_become_responses_field_names():
    cases = {"max_completion_tokens": "max_output_tokens", "messages": "input",
             "response_format.json_schema.schema": "text.format.schema", "tools[3].function.parameters":
             "tools[3].parameters", "temperature": "temperature"}
    for chat_param, param in cases.items():
        assert renamed(ApiError(400, "x", param=chat_param)).param == param
