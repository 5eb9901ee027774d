"""Issue 49, item 5: under tool_choice "auto" a call, once started, is a call to a declared tool whose
arguments are valid against its parameters, on chat completions (JSON and SSE), the Responses API and
/v1/realtime. The tools are the OpenAI Agents SDK's (`@function_tool` on get_weather and get_time), not
marked strict. rill-tiny samples at temperature 1.0 with no top_p or top_k cut (the Agents SDK sends no
sampling fields): unconstrained, about one call in five it opens comes out misspelt (`Get_weather`,
`fetch_weather`), with a wrong key (`city_name`) or cut short (rill bench tool-calls). Then a
fault-injected bias on the logits pushes every answer to open a call, to spell its name `G...` and to
name its argument `l...` (`location`): the grammar leaves the model no such token."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
import torch
import trio
from trio_websocket import open_websocket_url

from helpers_server import assert_nothing_left, one_torch_thread, running_server  # noqa: F401
from rill.assets import RILL_TINY_DIR
from rill.tiny.evaluate import framework_tool

MODEL = str(RILL_TINY_DIR)
QUESTIONS = ["What's the weather in Paris?", "What time is it in Tokyo?"]


def agents_sdk_tool(kind: str) -> dict:
    """The chat tool the Agents SDK sends for a `@function_tool`, without `strict` (most frameworks leave
    it out; a strict tool was held to its schema before issue 49)."""
    tool = framework_tool("openai_agents", kind)
    tool["function"].pop("strict")
    return tool


CHAT_TOOLS = [agents_sdk_tool("weather"), agents_sdk_tool("time")]
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]  # Responses and realtime tools
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in CHAT_TOOLS}


def assert_calls_are_declared_and_valid(calls: list[tuple[str, str]]) -> None:
    """Each (name, arguments) is a declared tool's, its arguments valid against the tool's parameters."""
    for name, arguments in calls:
        assert name in SCHEMAS, f"a call to an undeclared tool {name!r}"
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


# -- fault injection: a bias on the logits towards a call with a misspelt name ----------------------------------


class FaultInjectedBias:
    """Wraps the engine's sampler (rill.engine.sampler.Sampler): before sampling, +BIAS on `<tool_call>` for
    an answer's first token, on `G` right after `{"name": "`, on `l` right after `"arguments": {"`. The
    model's own scores are small next to it, so without a grammar the answer is `<tool_call>` then
    `{"name": "G...`."""

    BIAS = 100.0

    def __init__(self, sampler, tokenizer):
        self._sampler, self._tokenizer = sampler, tokenizer
        (self.opening,) = tokenizer.encode("<tool_call>", add_special_tokens=False)
        self.after = {'{"name": "': tokenizer.encode("G", add_special_tokens=False)[0],
                      '"arguments": {"': tokenizer.encode("l", add_special_tokens=False)[0]}
        self.num_pushed = 0  # biases applied, so a test can tell that the fault fired

    def __getattr__(self, name):  # vocab_size, eos_token_ids, process: the real sampler's
        return getattr(self._sampler, name)

    def __call__(self, logits: torch.Tensor, rows):
        logits = logits.clone()
        for i, row in enumerate(rows):
            token_id = self._pushed_token(row.output_token_ids)
            if token_id is not None:
                logits[i, token_id] += self.BIAS
                self.num_pushed += 1
        return self._sampler(logits, rows)

    def _pushed_token(self, output_ids) -> int | None:
        if not output_ids:
            return self.opening
        tail = self._tokenizer.decode(list(output_ids[-4:]))
        return next((token_id for text, token_id in self.after.items() if tail.endswith(text)), None)


def inject_bias(server) -> FaultInjectedBias:
    runner = server.engine.core.runner
    runner.sampler = FaultInjectedBias(runner.sampler, server.engine.core.tokenizer)
    return runner.sampler


# -- chat completions ------------------------------------------------------------------------------------------


def sdk(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


async def chat_calls(client, question: str, seed: int, stream: bool) -> tuple[list[tuple[str, str]], str, str]:
    """(calls, content, finish_reason) of one chat completion at temperature 1.0, streamed or not."""
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": question}], tools=CHAT_TOOLS,
                  temperature=1.0, seed=seed, max_tokens=120)
    if not stream:
        out = await client.chat.completions.create(**kwargs)
        message = out.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
        return calls, message.content or "", out.choices[0].finish_reason
    calls, content, finish = {}, "", None
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                name, arguments = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
            finish = choice.finish_reason or finish
    return list(calls.values()), content, finish


def assert_chat_answer_fits(calls, content: str, finish: str) -> None:
    assert finish == ("tool_calls" if calls else "stop"), (finish, content)  # 120 tokens: no call is cut
    assert "<tool_call>" not in content  # a broken call would come back as text
    assert_calls_are_declared_and_valid(calls)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_chat_auto_calls_at_temperature_1_are_declared_tools_with_valid_arguments(stream):
    async with running_server(RILL_TINY_DIR) as server:
        client, num_calls = sdk(server), 0
        for question in QUESTIONS:
            for seed in range(5):
                calls, content, finish = await chat_calls(client, question, seed, stream)
                assert_chat_answer_fits(calls, content, finish)
                num_calls += len(calls)
        await assert_nothing_left(server)
    assert num_calls >= 5  # rill-tiny calls a tool for most of these questions: the test saw calls


async def test_chat_fault_injected_bias_towards_a_misspelt_name_still_calls_a_declared_tool():
    async with running_server(RILL_TINY_DIR) as server:
        client, fault = sdk(server), inject_bias(server)
        # The fault alone: the same prompt on /v1/completions (no grammar) opens a call named `G...`.
        prompt = server.serving.tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[0]}], tools=CHAT_TOOLS, add_generation_prompt=True)
        raw = await client.completions.create(model=MODEL, prompt=prompt, temperature=1.0, seed=0, max_tokens=20)
        assert raw.choices[0].text.startswith('<tool_call>\n{"name": "G'), raw.choices[0].text
        for stream in (False, True):
            for seed in range(3):
                calls, content, finish = await chat_calls(client, QUESTIONS[seed % 2], seed, stream)
                assert calls and content == "", (calls, content)  # the pushed opening: a call, no text
                assert_chat_answer_fits(calls, content, finish)
    assert fault.num_pushed >= 12


# -- the Responses API -----------------------------------------------------------------------------------------


async def response_calls(client, question: str) -> list[tuple[str, str]]:
    out = await client.responses.create(model=MODEL, input=question, tools=FLAT_TOOLS, temperature=1.0,
                                        max_output_tokens=120)
    assert out.status == "completed", out
    for item in out.output:
        assert item.type == "function_call" or "<tool_call>" not in item.content[0].text
    return [(item.name, item.arguments) for item in out.output if item.type == "function_call"]


async def test_responses_auto_calls_at_temperature_1_are_declared_tools_with_valid_arguments():
    """The Responses API takes no seed: ten unseeded answers."""
    async with running_server(RILL_TINY_DIR) as server:
        client, num_calls = sdk(server), 0
        for i in range(10):
            calls = await response_calls(client, QUESTIONS[i % 2])
            assert_calls_are_declared_and_valid(calls)
            num_calls += len(calls)
    assert num_calls >= 5


async def test_responses_fault_injected_bias_towards_a_misspelt_name_still_calls_a_declared_tool():
    async with running_server(RILL_TINY_DIR) as server:
        client, fault = sdk(server), inject_bias(server)
        for i in range(4):
            calls = await response_calls(client, QUESTIONS[i % 2])
            assert calls
            assert_calls_are_declared_and_valid(calls)
    assert fault.num_pushed >= 8


# -- /v1/realtime ----------------------------------------------------------------------------------------------


async def realtime_calls(server, questions: list[str]) -> list[list[tuple[str, str]]]:
    """One realtime connection with the tools set (tool_choice auto, temperature 1.0), each question asked
    in a conversation of its own (a new connection: an earlier call would be in the prompt), and the
    function calls of each response.done; no error event, no call left as text."""
    answers = []
    for question in questions:
        async with open_websocket_url(server.url.replace("http", "ws") + "/v1/realtime") as ws:
            async def send(event: dict) -> None:
                await ws.send_message(json.dumps(event))

            with trio.fail_after(60):
                assert json.loads(await ws.get_message())["type"] == "session.created"
                await send({"type": "session.update", "session": {"tools": FLAT_TOOLS, "tool_choice": "auto",
                                                                  "temperature": 1.0, "max_output_tokens": 120}})
                await send({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}})
                await send({"type": "response.create"})
                while (event := json.loads(await ws.get_message()))["type"] != "response.done":
                    assert event["type"] != "error", event
        output = event["response"]["output"]
        texts = [part.get("text", "") for item in output if item["type"] == "message" for part in item["content"]]
        assert not any("<tool_call>" in text for text in texts), texts
        answers.append([(item["name"], item["arguments"]) for item in output if item["type"] == "function_call"])
    return answers


async def test_realtime_auto_calls_at_temperature_1_are_declared_tools_with_valid_arguments():
    """Realtime takes no seed: eight unseeded answers."""
    async with running_server(RILL_TINY_DIR) as server:
        answers = await realtime_calls(server, QUESTIONS * 4)
        await assert_nothing_left(server)
    for calls in answers:
        assert_calls_are_declared_and_valid(calls)
    assert sum(map(len, answers)) >= 4


async def test_realtime_fault_injected_bias_towards_a_misspelt_name_still_calls_a_declared_tool():
    async with running_server(RILL_TINY_DIR) as server:
        fault = inject_bias(server)
        answers = await realtime_calls(server, QUESTIONS * 2)
    for calls in answers:
        assert calls
        assert_calls_are_declared_and_valid(calls)
    assert fault.num_pushed >= 8


# -- what stays as it was --------------------------------------------------------------------------------------


async def test_text_answers_stay_free_and_tool_choice_none_constrains_nothing():
    """A question no tool fits is answered in text under "auto"; with tool_choice "none" the request has no
    grammar at all: the fault's pushed call stays text, misspelt as the bias made it."""
    async with running_server(RILL_TINY_DIR) as server:
        client = sdk(server)
        out = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is 12 + 30?"}], tools=CHAT_TOOLS,
            temperature=0, max_tokens=40)
        assert out.choices[0].message.content.strip() and not out.choices[0].message.tool_calls
        inject_bias(server)
        async with httpx.AsyncClient(base_url=server.v1, timeout=60) as http:
            none = await http.post("/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[0]}], "tools": CHAT_TOOLS,
                "tool_choice": "none", "temperature": 1.0, "seed": 0, "max_tokens": 12})
        assert none.status_code == 200, none.text
        assert none.json()["choices"][0]["message"]["content"].startswith('<tool_call>\n{"name": "G')


def test_tool_calls_bench_runs_small_and_its_grammar_side_gets_no_call_wrong(tmp_path):
    """`rill bench tool-calls` end to end at a tiny size (no timing asserted: figures are reported, not tested)."""
    pytest.importorskip("matplotlib")
    from rill.bench import main

    out = tmp_path / "tool-calls.json"
    assert main(["tool-calls", "--batch-sizes", "1", "2", "--repeats", "1", "--steps", "4", "--requests", "8",
                 "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert [row["batch"] for row in result["rows"]] == [1, 2]
    assert all(row["tokens_per_s"]["plain"] > 0 and row["tokens_per_s"]["auto_grammar"] > 0 for row in result["rows"])
    held = result["calls"]["auto_grammar"]
    assert held["answers"] == 8 and held.get("opened", 0) > 0
    assert held.get("undeclared_name", 0) == held.get("bad_arguments", 0) == held.get("unparsed", 0) == 0
