"""Tool-call and reasoning parsers on text: whole texts, and the same texts streamed in every
split, must agree (the streamer's fragments join to exactly what the whole-text parse gives)."""

import json
import random

import pytest

from rill.openai.reasoning_parser import ReasoningStreamer, split_reasoning
from rill.openai.tool_parser import (
    ParsedCall, ToolCallEvent, ToolCallStreamer, coalesce, is_json_object, parse_tool_calls,
)

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "c"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def stream(text: str, pieces: list[int], max_calls=None):
    """Feed `text` cut at `pieces`; return (content, {index: [name, arguments]}, event order)."""
    streamer = ToolCallStreamer(max_calls)
    content, calls, order = "", {}, []
    cuts = [0, *pieces, len(text)]
    outs = [streamer.feed(text[a:b]) for a, b in zip(cuts, cuts[1:])] + [streamer.finish()]
    for piece, events in outs:
        content += piece
        for e in events:
            if e.name is not None:
                assert e.index not in calls, "a call's name is sent once"
                calls[e.index] = [e.name, ""]
            assert e.index in calls, "arguments come after their call's name"
            calls[e.index][1] += e.arguments
            order.append(e.index)
    return content, calls, order


def random_cuts(text: str, rng: random.Random) -> list[int]:
    return sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randrange(1, 12))))


def test_parse_one_call():
    content, calls = parse_tool_calls(WEATHER)
    assert content == ""
    assert calls == [ParsedCall("get_weather", '{"city": "Tokyo", "unit": "c"}')]
    assert json.loads(calls[0].arguments) == {"city": "Tokyo", "unit": "c"}


def test_parse_text_around_and_two_calls():
    content, calls = parse_tool_calls("Let me check.\n" + WEATHER + "\n" + TIME)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert calls[1].arguments == "{}"


def test_text_without_calls_is_content_untouched():
    text = "No tools here, just <b>markup</b> and a < sign "
    assert parse_tool_calls(text) == (text, [])
    assert stream(text, [5, 20])[0] == text


def test_invalid_call_block_stays_content():
    text = "before <tool_call>not json</tool_call> after"
    assert parse_tool_calls(text) == (text, [])
    content, calls, _ = stream(text, [10, 19, 30])
    assert content == text and calls == {}


NESTED = 'x <tool_call>{"name": "f", "arguments": {"a": {"b": [1, 2]}, "c": "}"}}</tool_call> y'


@pytest.mark.parametrize("text", [WEATHER, "Sure.\n" + WEATHER, WEATHER + "\n" + TIME, NESTED])
def test_streaming_in_any_split_matches_whole_text(text):
    whole_content, whole_calls = parse_tool_calls(text)
    rng = random.Random(0)
    for _ in range(200):
        content, calls, _ = stream(text, random_cuts(text, rng))
        assert content.strip() == whole_content
        assert [ParsedCall(n, a) for n, a in calls.values()] == whole_calls


def test_streaming_character_by_character_sends_name_before_arguments():
    content, calls, order = stream(WEATHER, list(range(1, len(WEATHER))))
    assert calls == {0: ["get_weather", '{"city": "Tokyo", "unit": "c"}']}
    assert order.count(0) > 3, "arguments arrive in several fragments"


def test_streamer_never_releases_a_possible_tag_start():
    streamer = ToolCallStreamer()
    assert streamer.feed("Hello <tool") == ("Hello ", [])
    assert streamer.feed("box>") == ("<toolbox>", [])


def test_unfinished_call_releases_its_arguments_at_the_end():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1'
    content, calls, _ = stream(text, [20, 33])
    assert content == "" and calls == {0: ["f", '{"a": 1']}


def test_unfinished_block_without_a_name_is_content():
    text = "<tool_call>\n{\"na"
    content, calls, _ = stream(text, [5])
    assert content == text and calls == {}


def test_max_calls_leaves_later_blocks_in_content():
    content, calls, _ = stream(WEATHER + TIME, [40], max_calls=1)
    assert list(calls) == [0] and content == TIME


def test_call_without_name_first_is_sent_whole_at_its_end():
    text = '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>'
    content, calls, _ = stream(text, [10, 30])
    assert content == "" and calls == {0: ["f", '{"x": 1}']}


def test_coalesce_sends_a_calls_start_with_the_arguments_that_came_with_it():
    """OpenAI and vLLM put at most one entry per call index in a chunk (LlamaIndex reads only the first)."""
    events = [ToolCallEvent(0, "f", ""), ToolCallEvent(0, arguments='{"a"'), ToolCallEvent(0, arguments=": 1}"),
              ToolCallEvent(1, "g"), ToolCallEvent(1, arguments="{}")]
    assert coalesce(events) == [ToolCallEvent(0, "f", '{"a": 1}'), ToolCallEvent(1, "g", "{}")]
    fragments = [ToolCallEvent(0, arguments="x"), ToolCallEvent(0, arguments="y")]
    assert coalesce(fragments) == [ToolCallEvent(0, arguments="xy")]


def test_a_whole_call_in_one_feed_streams_as_one_event_per_call():
    streamer = ToolCallStreamer()
    content, events = streamer.feed(WEATHER + TIME)
    assert content.strip() == ""
    assert coalesce(events) == [ToolCallEvent(0, "get_weather", '{"city": "Tokyo", "unit": "c"}'),
                                ToolCallEvent(1, "get_time", "{}")]


@pytest.mark.parametrize("text, ok", [('{"city": "Paris"}', True), ("{}", True), ('{"city": "Pa', False),
                                      ('"Paris"', False), ("[1]", False), ("0+1=1", False), ("", False)])
def test_only_a_json_object_counts_as_arguments(text, ok):
    assert is_json_object(text) is ok


# -- reasoning -------------------------------------------------------------------------------------------


def test_qwen3_reasoning_split():
    assert split_reasoning("qwen3", "<think>a plan</think>the answer") == ("a plan", "the answer")
    assert split_reasoning("qwen3", "no thinking") == (None, "no thinking")


def test_deepseek_r1_starts_inside_reasoning():
    assert split_reasoning("deepseek_r1", "a plan</think>answer") == ("a plan", "answer")
    assert split_reasoning("deepseek_r1", "<think>a plan</think>answer") == ("a plan", "answer")


def test_unclosed_reasoning_is_all_reasoning():
    assert split_reasoning("qwen3", "<think>still thinking") == ("still thinking", "")


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_reasoning_streaming_in_any_split_matches_whole_text(parser):
    text = "<think>Let me add 17 and 25 </thin k></think>It is 42 <think> literally"
    whole = split_reasoning(parser, text)
    rng = random.Random(1)
    for _ in range(200):
        streamer = ReasoningStreamer(parser)
        cuts = [0, *random_cuts(text, rng), len(text)]
        parts = [streamer.feed(text[a:b]) for a, b in zip(cuts, cuts[1:])] + [streamer.finish()]
        reasoning = "".join(r for r, _ in parts)
        assert (reasoning or None, "".join(a for _, a in parts)) == whole


def test_unknown_reasoning_parser_is_refused():
    with pytest.raises(ValueError):
        ReasoningStreamer("nope")


def test_keys_after_the_arguments_do_not_leak_into_them():
    content, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": 1}, "id": 7}</tool_call>')
    assert calls == [ParsedCall("f", '{"a": 1}')]
