"""Agent frameworks and SDKs against a live rill server serving rill-tiny, each used as its own docs
show for an OpenAI-compatible server: the model calls get_weather for Paris, the framework runs the
tool, sends its result back, and the model answers from it.

The libraries come from the `frameworks` and `llamaindex` extras, each in a venv of its own
(.ci/run: .venv-fw and .venv-fw-llamaindex; llama-index caps openai below 3, which openai-agents
needs). A test whose library is not installed skips, so the main `pytest -q` passes without them.
The JS test needs node and `npm ci` in tests/js.
"""


import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import trio

from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.assets import RILL_TINY_DIR
from rill.transports.http import ServerConfig

MODEL = "rill-tiny"
QUESTION = "What's the weather in Paris?"
RESULT = {"temperature_c": 21, "condition": "sunny"}  # get_weather's result in rill-tiny's training
JS_DIR = Path(__file__).parent / "js"
NODE = shutil.which("node")


def states_result(answer: str | None) -> bool:
    """The answer gives the tool's temperature and condition (rill-tiny says "It is 21°C and sunny in Paris.")."""
    return answer is not None and "21°C" in answer and "sunny" in answer


def serve():
    return running_server(RILL_TINY_DIR, ServerConfig(served_model_names=[MODEL]))


def needs(module: str, extra: str):
    """Skip, naming the extra that installs it, when `module` is not installed."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        found = False
    return pytest.mark.skipif(not found, reason=f"{module} is not installed: the `{extra}` extra (see .ci/run)")


def in_thread(fn):
    """Run a blocking client (or one with its own asyncio loop) beside the server's trio loop."""
    return trio.to_thread.run_sync(fn)


# No `from __future__ import annotations` in this module: LlamaIndex writes the function's signature
# into the tool's description, and with string annotations it reads `get_weather(city: 'str') -> 'str'`,
# a form rill-tiny's training does not cover (it then answers in prose; see the README's "Works with").
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    get_weather.cities.append(city)
    return json.dumps(RESULT)


def get_time(timezone: str) -> str:
    """Get the current time in a timezone."""
    return json.dumps({"time": "09:30", "timezone": timezone})


@pytest.fixture(autouse=True)
def fresh_calls():
    get_weather.cities = []


# Each framework runs twice: as its docs show (the model decides to call), and with the call forced
# the framework's own way (tool_choice "required" or named: rill cuts the forced start on a token
# boundary, see rill.openai.forced_prefix). The answer that follows the tool result is never forced.
FORCED = pytest.mark.parametrize("forced", [False, True], ids=["auto", "forced"])


# -- LangChain ------------------------------------------------------------------------------------------


def langchain_model(server, forced: bool, use_responses_api: bool = False):
    """(the model that asks, bound to the tools, maybe forcing get_weather; the one that answers; tools).
    `use_responses_api`: ChatOpenAI speaks POST /v1/responses instead of chat completions."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=server.v1, api_key="unused", temperature=0, max_retries=0,
                     use_responses_api=use_responses_api)
    tools = {t.name: t for t in (tool(get_weather), tool(get_time))}
    asking = llm.bind_tools(list(tools.values()), tool_choice="get_weather" if forced else None)
    return asking, llm.bind_tools(list(tools.values())), tools


@needs("langchain_openai", "frameworks")
@FORCED
@pytest.mark.parametrize("use_responses_api", [False, True], ids=["chat", "responses"])
async def test_langchain_bind_tools_invoke_and_tool_message_round_trip(forced, use_responses_api):
    async with serve() as server:
        asking, answering, tools = langchain_model(server, forced, use_responses_api)

        def run():
            from langchain_core.messages import HumanMessage

            messages = [HumanMessage(QUESTION)]
            ai = asking.invoke(messages)
            messages.append(ai)
            messages += [tools[call["name"]].invoke(call) for call in ai.tool_calls]  # ToolMessages
            return ai, answering.invoke(messages)

        ai, answer = await in_thread(run)
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert get_weather.cities == ["Paris"]
    assert states_result(answer.text)


@needs("langchain_openai", "frameworks")
@FORCED
async def test_langchain_stream_gathers_the_tool_call(forced):
    async with serve() as server:
        asking, _, _ = langchain_model(server, forced)

        def run():
            chunks = list(asking.stream(QUESTION))
            gathered = chunks[0]
            for chunk in chunks[1:]:
                gathered = gathered + chunk
            return gathered

        gathered = await in_thread(run)
    assert [(c["name"], c["args"]) for c in gathered.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert not gathered.invalid_tool_calls


# -- the OpenAI Agents SDK ------------------------------------------------------------------------------------


@needs("agents", "frameworks")
@FORCED
@pytest.mark.parametrize("model_class", ["OpenAIChatCompletionsModel", "OpenAIResponsesModel"],
                         ids=["chat_completions", "responses"])
async def test_openai_agents_runs_the_function_tool(forced, model_class):
    """On the Chat Completions model, and on the SDK's default model, which speaks the Responses API
    (POST /v1/responses): the call, the tool's result sent back, and the answer read from it."""
    import agents
    from openai import AsyncOpenAI

    async with serve() as server:
        def run():
            agents.set_tracing_disabled(True)  # no trace export: nothing outside 127.0.0.1
            client = AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
            agent = agents.Agent(  # the SDK drops a forced tool_choice after the call (reset_tool_choice)
                name="Assistant",
                model=getattr(agents, model_class)(model=MODEL, openai_client=client),
                model_settings=agents.ModelSettings(temperature=0, tool_choice="get_weather" if forced else None),
                tools=[agents.function_tool(get_weather), agents.function_tool(get_time)],
            )
            return agents.Runner.run_sync(agent, QUESTION, max_turns=3)

        result = await in_thread(run)
    assert get_weather.cities == ["Paris"]
    assert states_result(result.final_output)


@needs("agents", "frameworks")
async def test_openai_agents_streamed_run_on_the_responses_model():
    """Runner.run_streamed reads the Responses event stream (function_call_arguments and output_text
    events) through the same default model."""
    import agents
    from openai import AsyncOpenAI

    async with serve() as server:
        def run():
            import asyncio

            async def streamed():
                agents.set_tracing_disabled(True)
                client = AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
                agent = agents.Agent(name="Assistant", model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
                                     model_settings=agents.ModelSettings(temperature=0),
                                     tools=[agents.function_tool(get_weather), agents.function_tool(get_time)])
                result = agents.Runner.run_streamed(agent, QUESTION, max_turns=3)
                kinds = [event.data.type async for event in result.stream_events() if event.type == "raw_response_event"]
                return result.final_output, kinds

            return asyncio.run(streamed())

        answer, kinds = await in_thread(run)
    assert get_weather.cities == ["Paris"] and states_result(answer)
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" in kinds
    assert kinds.count("response.completed") == 2  # the call's turn and the answer's


# -- LiteLLM --------------------------------------------------------------------------------------------------


def openai_tool(name: str, parameter: str, description: str) -> dict:
    """A tool as OpenAI's docs write one (LiteLLM's docs pass these dicts through)."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {parameter: {"type": "string"}}, "required": [parameter]}}}


@needs("litellm", "frameworks")
@FORCED
async def test_litellm_completion_with_tools_round_trip(monkeypatch, forced):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its bundled price list, not a download
    import litellm

    tools = [openai_tool("get_weather", "city", get_weather.__doc__),
             openai_tool("get_time", "timezone", get_time.__doc__)]
    async with serve() as server:
        def run():
            ask = dict(model=f"openai/{MODEL}", api_base=server.v1, api_key="unused", temperature=0, tools=tools)
            messages = [{"role": "user", "content": QUESTION}]
            first = litellm.completion(messages=messages, tool_choice="required" if forced else None, **ask)
            message = first.choices[0].message
            messages.append(message)
            for call in message.tool_calls or []:
                content = {"get_weather": get_weather, "get_time": get_time}[call.function.name](
                    **json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                 "content": content})
            return message, litellm.completion(messages=messages, **ask)

        message, answer = await in_thread(run)
    assert [c.function.name for c in message.tool_calls or []] == ["get_weather"]
    assert get_weather.cities == ["Paris"]
    assert states_result(answer.choices[0].message.content)


# -- LlamaIndex -----------------------------------------------------------------------------------------------


@needs("llama_index.llms.openai_like", "llamaindex")
@FORCED
async def test_llamaindex_openai_like_streamed_tool_call_round_trip(forced):
    """LlamaIndex reads only the first tool-call entry of each streamed chunk (issue 29 item 10)."""
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    tools = [FunctionTool.from_defaults(fn=get_weather), FunctionTool.from_defaults(fn=get_time)]
    async with serve() as server:
        def run():
            llm = OpenAILike(model=MODEL, api_base=server.v1, api_key="unused", temperature=0, max_retries=0,
                             is_chat_model=True, is_function_calling_model=True, context_window=4096)
            last = None
            for last in llm.stream_chat_with_tools(tools, user_msg=QUESTION, tool_required=forced):
                pass
            calls = llm.get_tool_calls_from_response(last, error_on_no_tool_call=False)
            history = [ChatMessage(role="user", content=QUESTION), last.message]
            by_name = {t.metadata.name: t for t in tools}
            for call in calls:
                output = by_name[call.tool_name](**call.tool_kwargs)
                history.append(ChatMessage(role="tool", content=str(output),
                                           additional_kwargs={"tool_call_id": call.tool_id, "name": call.tool_name}))
            return calls, llm.chat_with_tools(tools, chat_history=history)

        calls, answer = await in_thread(run)
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert get_weather.cities == ["Paris"]
    assert states_result(answer.message.content)


# -- instructor -----------------------------------------------------------------------------------------------


@needs("instructor", "frameworks")
async def test_instructor_tools_mode_extracts_the_call_and_answers_from_the_result():
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class GetWeather(BaseModel):
        city: str

    async with serve() as server:
        def run():
            client = instructor.from_openai(OpenAI(base_url=server.v1, api_key="unused", max_retries=0),
                                            mode=instructor.Mode.TOOLS)
            messages = [{"role": "user", "content": QUESTION}]
            call, completion = client.chat.completions.create_with_completion(
                model=MODEL, response_model=GetWeather, messages=messages, temperature=0, max_retries=1)
            message = completion.choices[0].message
            (tool_call,) = message.tool_calls
            messages += [{**message.model_dump(exclude_none=True), "content": message.content},
                         {"role": "tool", "tool_call_id": tool_call.id, "content": get_weather(call.city)}]
            answer = client.chat.completions.create(model=MODEL, response_model=None, messages=messages,
                                                    temperature=0)
            return call, answer

        call, answer = await in_thread(run)
    assert isinstance(call, GetWeather) and call.city == "Paris"
    assert states_result(answer.choices[0].message.content)


# -- the openai JS SDK ------------------------------------------------------------------------------------------


@pytest.mark.skipif(NODE is None or not (JS_DIR / "node_modules" / "openai").is_dir(),
                    reason="needs node and `npm ci` in tests/js")
async def test_openai_js_sdk_calls_and_answers_from_a_compact_json_result():
    async with serve() as server:
        with trio.fail_after(120):
            done = await trio.run_process([NODE, str(JS_DIR / "tool_call.mjs"), server.v1, MODEL],
                                          capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report["calls"] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert states_result(report["answer"])


def test_js_package_pins_the_sdk_it_was_tested_with():
    package = json.loads((JS_DIR / "package.json").read_text())
    lock = json.loads((JS_DIR / "package-lock.json").read_text())
    # `npm ci` in .ci/run installs what the lock file says: it must be the version package.json pins.
    assert lock["packages"]["node_modules/openai"]["version"] == package["dependencies"]["openai"]
