"""rill-tiny, the model inside the package, through rill's own runtime: it loads with no network,
answers its task families (a deterministic sample of the held-out evaluation), and a 20,000-token
streaming session stays within its sliding window's worth of KV blocks."""

import random

import pytest

from rill import LLM, SamplingParams
from rill.assets import RILL_TINY_DIR
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.tiny import evaluate

GREEDY = SamplingParams(temperature=0, max_tokens=evaluate.MAX_TOKENS)


@pytest.fixture(scope="module")
def llm():
    return LLM("rill-tiny")


def test_rill_tiny_ships_inside_the_package():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (RILL_TINY_DIR / name).is_file(), name


def test_issue_examples_are_answered_exactly(llm):
    backend = evaluate.RillBackend.__new__(evaluate.RillBackend)
    backend.llm, backend.sampling_params = llm, SamplingParams
    cases = [case for examples in evaluate.issue_examples().values() for case in examples]
    texts = backend.generate(cases, evaluate.MAX_TOKENS)
    wrong = [(c.messages[-1].get("content"), c.expected, t) for c, t in zip(cases, texts) if not evaluate.is_correct(c, t)]
    assert wrong == []


def test_a_sample_of_the_held_out_evaluation_passes_the_bar(llm):
    backend = evaluate.RillBackend.__new__(evaluate.RillBackend)
    backend.llm, backend.sampling_params = llm, SamplingParams
    report = evaluate.evaluate(backend, evaluate.make_cases(per_family=8, seed=99))
    total = sum(e["n"] for e in report["families"].values())
    correct = sum(e["correct"] for e in report["families"].values())
    assert total == 8 * len(evaluate.FAMILIES)
    assert correct / total >= evaluate.BAR, evaluate.format_table(report)


def test_chat_with_tools_returns_one_call_and_then_uses_the_result(llm):
    weather = evaluate.tasks.WEATHER_TOOL
    question = [{"role": "user", "content": "What's the weather in Tokyo?"}]
    call = llm.chat(question, GREEDY, tools=[weather])[0].outputs[0].text
    assert evaluate.parse_tool_calls(call) == [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]
    followed = question + [
        evaluate.tasks.tool_call_message("get_weather", {"city": "Tokyo"}),
        {"role": "tool", "content": '{"temperature_c": 21, "condition": "sunny"}'},
    ]
    answer = llm.chat(followed, GREEDY, tools=[weather])[0].outputs[0].text
    assert "21" in answer and "sunny" in answer
    plain = llm.chat(question, GREEDY)[0].outputs[0].text
    assert "<tool_call>" not in plain and plain.strip()


@pytest.mark.parametrize("shape", list(evaluate.schemas.PRESETS))
def test_tools_in_each_framework_shape_get_one_call_and_then_an_answer_from_a_compact_result(llm, shape):
    """The schemas LangChain, llm, the OpenAI Agents SDK, LlamaIndex and instructor send (and no
    `required`, an enum parameter, rill's own): the call names the listed tool and its parameter, and
    JSON.stringify's compact result is read back right."""
    tools = [evaluate.framework_tool(shape, "weather"), evaluate.framework_tool(shape, "time")]
    name, param, _ = evaluate.schemas.preset_tool(shape, "weather")
    question = [{"role": "user", "content": "What's the weather in Tokyo?"}]
    call = llm.chat(question, GREEDY, tools=tools)[0].outputs[0].text
    assert evaluate.parse_tool_calls(call) == [{"name": name, "arguments": {param: "Tokyo"}}], call
    followed = question + [
        evaluate.tasks.tool_call_message(name, {param: "Tokyo"}),
        {"role": "tool", "content": '{"temperature_c":2,"condition":"snowy"}'},
    ]
    assert llm.chat(followed, GREEDY, tools=tools)[0].outputs[0].text == "It is 2°C and snowy in Tokyo."


def test_tools_that_do_not_fit_the_question_get_no_call(llm):
    style = evaluate.schemas.PRESETS["langchain"]
    tools = [evaluate.schemas.function_tool("search_web", ("query",), "Search the web for a query.", style)]
    weather = llm.chat([{"role": "user", "content": "What's the weather in Tokyo?"}], GREEDY, tools=tools)[0].outputs[0].text
    assert weather == evaluate.tasks.NO_WEATHER_TOOL
    tools.append(evaluate.framework_tool("langchain", "weather"))
    sum_ = llm.chat([{"role": "user", "content": "What is 347 + 58?"}], GREEDY, tools=tools)[0].outputs[0].text
    assert sum_ == evaluate.tasks.arithmetic_answer(347, 58, "+")


def test_a_20000_token_session_holds_at_most_window_blocks_plus_two():
    core = EngineCore(EngineConfig(model="rill-tiny", num_kv_blocks=64))
    window, bs = core.window, core.config.block_size
    assert window is not None and window < 1024
    bound = -(-window // bs) + 2
    rng = random.Random(0)
    vocab = [i for i in range(core.model_config.vocab_size) if i < core.tokenizer.vocab_size and i > 2]
    core.open_session("s", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    peak, sent = 0, 0
    while sent < 20_000:
        core.append_input("s", [rng.choice(vocab) for _ in range(64)])
        sent += 64
        core.step()
        (seq,) = core.requests["s"]
        peak = max(peak, len(seq.block_table) - seq.num_freed_blocks[0])
    core.finish_input("s")
    tokens = []
    for _ in range(20):
        for delta in core.step():
            tokens += delta.token_ids
        if "s" not in core.requests:
            break
    assert seq.num_tokens >= 20_000 and len(tokens) == 8
    assert peak <= bound, (peak, bound)
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
