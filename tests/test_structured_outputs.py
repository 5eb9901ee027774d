"""Structured outputs (issue 22): constrained decoding on llguidance. The grammar's matcher against rill-tiny's
tokenizer with no server, the sampler's batched bitmask, the engine's finish rules, then `rill serve` with
rill-tiny driven by the openai SDK: whatever a 2M-parameter model prefers, its output parses and validates."""

from __future__ import annotations

import json
import re

import jsonschema
import msgspec
import openai
import pydantic
import pytest
import torch
import trio

from helpers_server import one_torch_thread, realtime_function_call, running_server  # noqa: F401
from rill.assets import RILL_TINY_DIR
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.engine.sampler import Sampler, SamplingRow
from rill.errors import ValidationError
from rill.openai.constraints import auto_tools_constraint
from rill.openai.requests import Tool
from rill.sampling_params import SamplingParams
from rill.structured import GrammarCompiler, specs
from rill.structured.bitmask import BitmaskFiller
from rill.tokenizer import Tokenizer

# rill-tiny's logits: its tokenizer knows fewer ids, the rest is the embedding's padding
VOCAB_SIZE = json.loads((RILL_TINY_DIR / "config.json").read_text())["vocab_size"]
EOS = 2
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_dir(RILL_TINY_DIR)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, VOCAB_SIZE, [EOS])


def walk(compiler, tokenizer, spec, text: str):
    """A fresh matcher for spec after the tokens of text; None if it refused one."""
    matcher = compiler.compile(spec, "x").new_matcher()
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.consume_token(token_id):
            return None
    return matcher


def allowed_ids(compiler, matcher) -> list[int]:
    filler = BitmaskFiller(VOCAB_SIZE, [EOS])
    return filler.allowed(filler.fill([matcher]), torch.device("cpu"))[0].nonzero()[:, 0].tolist()


# -- grammars against rill-tiny's vocabulary -------------------------------------------------------------------


def test_schema_accepts_a_valid_instance_and_then_only_ends(compiler, tokenizer):
    matcher = walk(compiler, tokenizer, specs.json_schema(PERSON, "x"), '{"name": "Ada", "age": 36}')
    assert matcher is not None and matcher.is_accepting() and matcher.is_stopped()


def test_schema_refuses_a_missing_required_key_and_a_wrong_type(compiler, tokenizer):
    assert walk(compiler, tokenizer, specs.json_schema(PERSON, "x"), '{"age": 36}') is None
    assert walk(compiler, tokenizer, specs.json_schema(PERSON, "x"), '{"name": 7') is None


def test_added_tokens_that_are_not_special_stay_text_the_grammar_can_match(compiler, tokenizer):
    """rill-tiny writes `<tool_call>` and `{"name": "` as single added tokens; they must stay allowed."""
    spec = specs.tool_call('{"name": "', [('get_weather", "arguments": ', {"type": "object"})],
                           ["}\n", "</tool_call>"], ["p"], compiler.special_tags)
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    added = {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}
    assert {added['{"name": "'], added["</tool_call>"]} <= set(ids)  # the added tokens, as the model writes them
    matcher = walk(compiler, tokenizer, spec, text)
    assert matcher is not None and matcher.is_stopped()


def test_special_tokens_and_markup_tags_are_never_text(compiler, tokenizer):
    """A JSON string holding `</tool_call>` would end the call early for the tool-call parser."""
    matcher = walk(compiler, tokenizer, specs.regex(r"(?s:.*)", "x"), "")
    added = {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}
    never = {added[t] for t in ("<|endoftext|>", "<|im_start|>", "<tool_call>", "</tool_call>")}
    assert not never & set(allowed_ids(compiler, matcher)) and EOS in allowed_ids(compiler, matcher)
    assert compiler.special_tags >= {"<tool_call>", "</tool_call>"}


def test_choice_allows_the_first_letters_then_only_the_rest(compiler, tokenizer):
    spec = specs.choice(["yes", "no"], "x")
    assert tokenizer.decode(allowed_ids(compiler, walk(compiler, tokenizer, spec, ""))) == "ny"
    assert allowed_ids(compiler, walk(compiler, tokenizer, spec, "n")) == tokenizer.encode("o")


def test_padding_ids_past_the_tokenizer_are_never_allowed(compiler, tokenizer):
    matcher = walk(compiler, tokenizer, specs.json_object(), "{")
    assert max(allowed_ids(compiler, matcher)) < tokenizer.vocab_size


def test_gbnf_grammar_is_read_as_well_as_lark(compiler, tokenizer):
    gbnf = specs.grammar('root ::= "yes" | "no"', "x")
    lark = specs.grammar('start: "yes" | "no"', "x")
    for spec in (gbnf, lark):
        assert walk(compiler, tokenizer, spec, "no").is_stopped()
        assert walk(compiler, tokenizer, spec, "ma") is None


# -- compiling: the cache and the errors -----------------------------------------------------------------------


def test_the_same_schema_compiles_once_however_its_json_is_laid_out(tokenizer):
    compiler = GrammarCompiler(tokenizer, VOCAB_SIZE, [EOS])
    first = compiler.compile(specs.json_schema(PERSON, "x"), "x")
    again = compiler.compile(specs.json_schema(json.loads(json.dumps(PERSON, indent=4)), "x"), "x")
    assert first is again and compiler.num_compiled == 1


def test_cache_keeps_the_most_recent_grammars(tokenizer):
    compiler = GrammarCompiler(tokenizer, VOCAB_SIZE, [EOS], cache_size=2)
    grammars = [compiler.compile(specs.choice([word], "x"), "x") for word in ("a", "b", "c")]
    assert compiler.compile(specs.choice(["c"], "x"), "x") is grammars[2]
    compiler.compile(specs.choice(["a"], "x"), "x")
    assert compiler.num_compiled == 4  # "a" was dropped for "c", so it compiled again


def test_each_sequence_gets_its_own_matcher(compiler, tokenizer):
    grammar = compiler.compile(specs.choice(["yes", "no"], "x"), "x")
    one, two = grammar.new_matcher(), grammar.new_matcher()
    assert one.consume_token(tokenizer.encode("y")[0])
    assert tokenizer.decode(allowed_ids(compiler, two)) == "ny"


@pytest.mark.parametrize("build, message", [
    (lambda: specs.json_schema({"type": "strng"}, "p"), "Invalid type"),
    (lambda: specs.json_schema({"type": "string", "pattern": "[a-"}, "p"), "unclosed character class"),
    (lambda: specs.json_schema({"type": "array", "contains": {"type": "integer"}}, "p"), 'Unimplemented keys: ["contains"]'),
    (lambda: specs.json_schema({"$ref": "#/definitions/nope"}, "p"), "does not exist"),
    (lambda: specs.regex("[a-", "p"), "unclosed character class"),
    (lambda: specs.grammar("start: nowhere", "p"), "unknown name"),
], ids=["type", "pattern", "unsupported-keyword", "ref", "regex", "lark"])
def test_a_grammar_that_cannot_be_enforced_names_its_field(compiler, build, message):
    with pytest.raises(ValidationError) as caught:
        compiler.compile(build(), "p")
    assert caught.value.param == "p" and message in caught.value.message


@pytest.mark.parametrize("build", [
    lambda: specs.json_schema("{not json", "p"), lambda: specs.json_schema([1], "p"),
    lambda: specs.regex("", "p"), lambda: specs.choice([], "p"), lambda: specs.choice(["a", 1], "p"),
    lambda: specs.grammar("  ", "p"),
    lambda: specs.tool_call("", [("", {"type": "object", "if": {}})], [""], ["p"]),
], ids=["json-text", "not-an-object", "empty-regex", "no-choices", "non-string-choice", "empty-grammar", "tool"])
def test_a_malformed_constraint_fails_before_compiling_naming_its_field(build):
    with pytest.raises(ValidationError) as caught:
        build()
    assert caught.value.param == "p"


# -- the sampler's batched mask --------------------------------------------------------------------------------


def test_sampler_masks_constrained_rows_and_leaves_the_others_alone(compiler, tokenizer):
    grammar = compiler.compile(specs.choice(["yes"], "x"), "x")
    sampler = Sampler([EOS], VOCAB_SIZE)
    logits = torch.zeros(3, VOCAB_SIZE)
    logits[:, 5] = 10.0  # every row's favourite is token 5
    greedy = SamplingParams(temperature=0)
    rows = [SamplingRow(SamplingParams(temperature=0, grammar=grammar), [1], [], matcher=grammar.new_matcher()),
            SamplingRow(greedy, [1], []),
            SamplingRow(SamplingParams(temperature=1.0, grammar=grammar, seed=3), [1], [], matcher=grammar.new_matcher())]
    tokens = [t.token_id for t in sampler(logits, rows)]
    assert tokens == [tokenizer.encode("y")[0], 5, tokenizer.encode("y")[0]]


def test_a_matcher_in_error_lets_the_row_end(compiler, tokenizer):
    grammar = compiler.compile(specs.choice(["yes"], "x"), "x")
    matcher = grammar.new_matcher()
    assert not matcher.consume_token(tokenizer.encode("n")[0])  # refused: the matcher is now in error
    assert allowed_ids(compiler, matcher) == [EOS]


# -- the engine --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def core():
    return EngineCore(EngineConfig(model=str(RILL_TINY_DIR), num_kv_blocks=256))


def generate(core, params: SamplingParams, prompt="Describe a person as JSON.", request_id="r"):
    """Run one request alone; its choices' texts and finish reasons."""
    core.add_request(request_id, core.tokenizer.encode_chat([{"role": "user", "content": prompt}]), params)
    texts, reasons = {}, {}
    for _ in range(1000):
        if not core.has_work:
            break
        for delta in core.step():
            texts[delta.index] = texts.get(delta.index, "") + delta.text
            reasons[delta.index] = delta.finish_reason or reasons.get(delta.index)
    return [texts[i] for i in sorted(texts)], [reasons[i] for i in sorted(reasons)]


def test_engine_output_validates_and_stops_when_the_schema_is_complete(core, compiler):
    grammar = compiler.compile(specs.json_schema(PERSON, "x"), "x")
    texts, reasons = generate(core, SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=100, grammar=grammar))
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert reasons == ["stop"] * 3


def test_engine_regex_output_matches_at_any_temperature(core, compiler):
    grammar = compiler.compile(specs.regex(r"[0-9]{3}-[a-z]{2,4}", "x"), "x")
    for seed in range(4):
        (text,), (reason,) = generate(core, SamplingParams(temperature=1.5, seed=seed, max_tokens=20, grammar=grammar),
                                      request_id=f"re{seed}")
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text) and reason == "stop"


def test_engine_max_tokens_inside_the_grammar_is_length(core, compiler):
    grammar = compiler.compile(specs.json_schema(PERSON, "x"), "x")
    (text,), (reason,) = generate(core, SamplingParams(temperature=0, max_tokens=4, grammar=grammar))
    assert reason == "length" and text.startswith("{")


def test_engine_unconstrained_request_beside_a_constrained_one_is_unchanged(core, compiler):
    alone, _ = generate(core, SamplingParams(temperature=0, max_tokens=30), prompt="Reverse: abc", request_id="a")
    grammar = compiler.compile(specs.choice(["maybe"], "x"), "x")
    prompt_ids = core.tokenizer.encode_chat([{"role": "user", "content": "Reverse: abc"}])
    core.add_request("c", prompt_ids, SamplingParams(temperature=0, max_tokens=30, grammar=grammar))
    core.add_request("u", prompt_ids, SamplingParams(temperature=0, max_tokens=30))
    texts = {"c": "", "u": ""}
    for _ in range(200):
        if not core.has_work:
            break
        for delta in core.step():
            texts[delta.request_id] += delta.text
    assert texts == {"c": "maybe", "u": alone[0]}


# -- through `rill serve`, with the openai SDK ---------------------------------------------------------------------


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
PLAIN_WEATHER = {"type": "function", "function": {  # as rill-tiny's training writes it
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a timezone.", "strict": True,
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
                   "required": ["timezone"], "additionalProperties": False}}}


@pytest.fixture
async def client():
    async with running_server(RILL_TINY_DIR) as server:
        yield openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


async def test_sdk_parse_returns_the_pydantic_object(client):
    for seed in range(3):
        out = await client.chat.completions.parse(model=str(RILL_TINY_DIR), messages=ask("Who wrote the first program?"),
                                                  response_format=Person, temperature=1.0, seed=seed, max_tokens=100)
        assert isinstance(out.choices[0].message.parsed, Person) and out.choices[0].finish_reason == "stop"


async def test_json_object_is_one_json_object(client):
    """Every answer that ends is one JSON object; one cut by max_tokens is the start of one (its
    finish_reason "length", as OpenAI's would be). Which of the two a 2M-parameter model writes depends
    on its weights, so several seeds run and at least one must end."""
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    messages = [*ask("What's the weather in Paris?"), {"role": "assistant", "content": call},
                *ask("What's the weather in Rome?")]
    ended = 0
    for seed in range(6):
        out = await client.chat.completions.create(
            model=str(RILL_TINY_DIR), messages=messages, tools=[PLAIN_WEATHER], response_format={"type": "json_object"},
            temperature=1.0, seed=seed, max_tokens=100)
        choice = out.choices[0]
        assert choice.message.content.lstrip().startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
            ended += 1
        else:
            assert choice.finish_reason == "length"
    assert ended


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_json_schema_validates_streamed_and_not(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    kwargs = dict(model=str(RILL_TINY_DIR), messages=ask("Describe a person."), response_format=fmt,
                  temperature=0.8, seed=11, n=2, max_tokens=100)
    if stream:
        texts, finish = ["", ""], [None, None]
        async for chunk in await client.chat.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
                finish[choice.index] = choice.finish_reason or finish[choice.index]
    else:
        out = await client.chat.completions.create(**kwargs)
        texts, finish = [c.message.content for c in out.choices], [c.finish_reason for c in out.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert finish == ["stop", "stop"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
async def test_strict_tool_call_arguments_validate(client, choice):
    """rill-tiny was trained on one-argument tools; the schema's second, required argument still appears."""
    tools = [WEATHER, TIME]
    for seed in range(3):
        out = await client.chat.completions.create(
            model=str(RILL_TINY_DIR), messages=ask("What's the weather in Paris?"), tools=tools, tool_choice=choice,
            temperature=1.0, seed=seed, max_tokens=120)
        (call,) = out.choices[0].message.tool_calls
        schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)
        assert out.choices[0].finish_reason == "tool_calls"
        if isinstance(choice, dict):
            assert call.function.name == "get_time"


async def test_streamed_strict_tool_call_joins_to_valid_arguments(client):
    arguments, finish = "", None
    async for chunk in await client.chat.completions.create(
            model=str(RILL_TINY_DIR), messages=ask("What's the weather in Paris?"), tools=[WEATHER],
            tool_choice="required", temperature=0, max_tokens=120, stream=True):
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert finish == "tool_calls"


@pytest.mark.parametrize("structured, check", [
    ({"regex": r"[A-Z][a-z]{2,8} [0-9]{1,2}"}, lambda text: re.fullmatch(r"[A-Z][a-z]{2,8} [0-9]{1,2}", text)),
    ({"choice": ["sunny", "rainy", "cloudy"]}, lambda text: text in ("sunny", "rainy", "cloudy")),
    ({"grammar": 'start: "It is " NUMBER " degrees"\nNUMBER: /[0-9]{1,2}/'},
     lambda text: re.fullmatch(r"It is [0-9]{1,2} degrees", text)),
    ({"grammar": 'root ::= ("yes" | "no") "!"'}, lambda text: text in ("yes!", "no!")),
    ({"json": PERSON}, lambda text: jsonschema.validate(json.loads(text), PERSON) is None),
], ids=["regex", "choice", "lark", "gbnf", "json"])
async def test_structured_outputs_through_extra_body(client, structured, check):
    for seed in range(3):
        out = await client.chat.completions.create(
            model=str(RILL_TINY_DIR), messages=ask("What's the weather in Paris?"), temperature=1.0, seed=seed,
            max_tokens=60, extra_body={"structured_outputs": structured})
        assert check(out.choices[0].message.content) and out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("field", [
    {"extra_body": {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}},
    {"extra_body": {"structured_outputs": {"json": PERSON}}},
], ids=["response_format", "structured_outputs"])
async def test_completions_take_the_same_constraints(client, field):
    out = await client.completions.create(model=str(RILL_TINY_DIR), prompt="A person:", temperature=0.7, seed=2,
                                          max_tokens=100, **field)
    jsonschema.validate(json.loads(out.choices[0].text), PERSON)
    assert out.choices[0].finish_reason == "stop"


async def test_completions_stream_a_choice(client):
    text = ""
    async for chunk in await client.completions.create(
            model=str(RILL_TINY_DIR), prompt="Weather:", max_tokens=20, stream=True,
            extra_body={"structured_outputs": {"choice": ["sunny", "rainy"]}}):
        text += chunk.choices[0].text
    assert text in ("sunny", "rainy")


async def test_max_tokens_inside_the_schema_finishes_with_length(client):
    out = await client.chat.completions.create(
        model=str(RILL_TINY_DIR), messages=ask("Describe a person."), max_tokens=5, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    assert out.choices[0].finish_reason == "length" and out.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "strng"}}}},
     "response_format.json_schema.schema", "Invalid type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "array", "contains": {"type": "integer"}}}}}, "response_format.json_schema.schema", "contains"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "json_schema"),
    ({"extra_body": {"structured_outputs": {"regex": "[a-"}}}, "structured_outputs.regex", "unclosed"),
    ({"extra_body": {"structured_outputs": {"grammar": "start: nowhere"}}}, "structured_outputs.grammar", "unknown"),
    ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}}, "structured_outputs", "exactly one"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "if"),
], ids=["bad-type", "unsupported-keyword", "no-schema", "regex", "grammar", "two-kinds", "tool-schema"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_constraint_that_cannot_be_enforced_is_a_400_before_any_stream(client, body, param, words, stream):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=str(RILL_TINY_DIR), messages=ask("hi"), max_tokens=5,
                                             stream=stream, **body)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param and words in error["message"]


async def test_realtime_forced_call_arguments_validate():
    """/v1/realtime: a forced call's arguments fit the function's schema, a second required key included."""
    weather = {"type": "function", **WEATHER["function"]}
    async with running_server(RILL_TINY_DIR) as server:
        call = await realtime_function_call(server, [weather], "required", "What's the weather in Paris?")
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])


async def test_streaming_input_sessions_take_response_format_in_mode_a_and_mode_b():
    """A prompt that arrives in pieces is constrained the same way once it answers."""
    import httpx

    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    first = {"messages": ask("Describe"), "response_format": fmt, "temperature": 0, "max_tokens": 100}
    async with running_server(RILL_TINY_DIR) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        chunks = [{"sequence_id": i, "payload": word} for i, word in enumerate([" a", " person."])]
        body = "\n".join(json.dumps(line) for line in [first, *chunks]) + "\n"
        mode_a = await http.post("/v1/chat/completions", content=body,
                                 headers={"content-type": "application/x-ndjson"})
        assert mode_a.status_code == 200, mode_a.text
        jsonschema.validate(json.loads(mode_a.json()["choices"][0]["message"]["content"]), PERSON)

        created = await http.post("/v1/streaming_input/sessions", json=first)
        session_id = created.json()["session_id"]
        for chunk in chunks:
            assert (await http.post(f"/v1/streaming_input/sessions/{session_id}/chunks", json=chunk)).status_code == 202
        await http.post(f"/v1/streaming_input/sessions/{session_id}/finish")
        result = await http.get(f"/v1/streaming_input/sessions/{session_id}/result")
        while result.status_code == 202:
            await trio.sleep(0.05)
            result = await http.get(f"/v1/streaming_input/sessions/{session_id}/result")
        jsonschema.validate(json.loads(result.json()["choices"][0]["message"]["content"]), PERSON)


# -- strict tools under tool_choice "auto": text, or calls whose strict arguments fit ------------------------

CITY_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


def auto_spec(compiler, tools: list[dict], parallel: bool = True):
    spec, _ = auto_tools_constraint([msgspec.convert(t, Tool) for t in tools], parallel, compiler.special_tags)
    return spec


def hermes_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def test_auto_with_a_strict_tool_accepts_a_valid_call_then_only_another_or_the_end(compiler, tokenizer):
    matcher = walk(compiler, tokenizer, auto_spec(compiler, [CITY_WEATHER]),
                   hermes_call("get_weather", '{"city": "Paris"}'))
    assert matcher is not None and matcher.is_accepting()
    assert tokenizer.decode(allowed_ids(compiler, matcher)) == "\n"  # and eos: the next call's line, or the end


def test_auto_refuses_a_strict_call_with_an_extra_key_or_a_missing_one(compiler, tokenizer):
    spec = auto_spec(compiler, [CITY_WEATHER])
    assert walk(compiler, tokenizer, spec, hermes_call("get_weather", '{"city": "Paris", "unit": "c"}')) is None
    assert walk(compiler, tokenizer, spec, hermes_call("get_weather", '{"unit": "c"}')) is None
    assert walk(compiler, tokenizer, spec, hermes_call("get_time", '{"city": "Paris"}')) is None  # no such tool


def test_auto_accepts_plain_text_and_text_before_calls(compiler, tokenizer):
    spec = auto_spec(compiler, [CITY_WEATHER])
    for text in ("2 + 3 is 5.", "Let me look.\n" + hermes_call("get_weather", '{"city": "Rome"}'), ""):
        matcher = walk(compiler, tokenizer, spec, text)
        assert matcher is not None and matcher.is_accepting(), text


def test_auto_text_never_spells_out_a_call_opening(compiler, tokenizer):
    """The parser would read `<tool_call>` written letter by letter as a call the grammar never checked."""
    spec = auto_spec(compiler, [CITY_WEATHER])
    assert tokenizer.encode(">")[0] not in allowed_ids(compiler, walk(compiler, tokenizer, spec, "See <tool_call"))
    opening = tokenizer.encode("<tool_call>")
    assert len(opening) == 1 and opening[0] in allowed_ids(compiler, walk(compiler, tokenizer, spec, "See "))


def test_auto_leaves_other_tags_free_in_text(compiler, tokenizer):
    """A reasoning model's `<think>` is a tag like these; only the call's opening is held to the grammar."""
    text = "I know.<tool_response>\n5\n</tool_response> The answer is 5."
    matcher = walk(compiler, tokenizer, auto_spec(compiler, [CITY_WEATHER]), text)
    assert matcher is not None and matcher.is_accepting()


def test_auto_holds_a_non_strict_tool_to_its_schema_too_unless_it_cannot_be_enforced(compiler, tokenizer):
    """Issue 49: a call, once started, is to a declared tool with valid arguments, strict or not; a
    non-strict schema llguidance cannot enforce leaves that tool's arguments any object (no 400)."""
    cannot = {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "if": {}}}}
    spec = auto_spec(compiler, [CITY_WEATHER, PLAIN_WEATHER | {"function": {**PLAIN_WEATHER["function"], "name": "f"}},
                                cannot])
    assert walk(compiler, tokenizer, spec, hermes_call("f", '{"city": "Rome", "more": [1, 2]}')).is_accepting()
    assert walk(compiler, tokenizer, spec, hermes_call("f", '{"anything": [1, 2]}')) is None  # city is required
    assert walk(compiler, tokenizer, spec, hermes_call("g", '{"anything": [1, 2]}')).is_accepting()
    assert walk(compiler, tokenizer, spec, hermes_call("g", '[1, 2]')) is None  # arguments are an object
    assert walk(compiler, tokenizer, spec, hermes_call("get_weather", '{"anything": 1}')) is None


def test_auto_takes_many_calls_unless_parallel_tool_calls_is_false(compiler, tokenizer):
    two = hermes_call("get_weather", '{"city": "Paris"}') + "\n" + hermes_call("get_weather", '{"city": "Rome"}')
    assert walk(compiler, tokenizer, auto_spec(compiler, [CITY_WEATHER]), two).is_accepting()
    assert walk(compiler, tokenizer, auto_spec(compiler, [CITY_WEATHER], parallel=False), two) is None
    one = walk(compiler, tokenizer, auto_spec(compiler, [CITY_WEATHER], parallel=False),
               hermes_call("get_weather", '{"city": "Paris"}') + "\n")
    assert one.is_stopped()


def test_auto_refuses_a_misspelt_name_without_a_strict_tool(compiler, tokenizer):
    spec = auto_spec(compiler, [PLAIN_WEATHER])
    assert walk(compiler, tokenizer, spec, hermes_call("get_weather", '{"city": "Paris"}')).is_accepting()
    assert walk(compiler, tokenizer, spec, '<tool_call>\n{"name": "G') is None


def test_auto_leaves_out_of_text_the_special_tokens_lark_cannot_name():
    """llguidance's own tokenizer reader makes every added token special, `[INST]` included."""
    spec = specs.text_or_tool_calls(["<tool_call>", "\n"], [("", {"type": "object"})], ["</tool_call>"], ["p"],
                                    frozenset({"<tool_call>", "</tool_call>", "<think>", "[INST]"}))
    assert "tag: </tool_call> | <think>" in spec.text and "[INST]" not in spec.text


def assert_answer_fits(message, finish_reason: str, schema: dict) -> None:
    """Text, or calls whose arguments validate: what strict tools promise under tool_choice "auto" (an
    answer cut by max_tokens may end inside a call, as on OpenAI)."""
    assert "<tool_call>" not in (message.content or "")
    if finish_reason == "length":
        return
    assert finish_reason == ("tool_calls" if message.tool_calls else "stop")
    for call in message.tool_calls or ():
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), schema)


# rill-tiny (2026-11-25) calls a tool in the shape its training lists most and answers in text for the others;
# the tests hold for any model: a call, when made, validates.
STRICT_PLAIN_WEATHER = {"type": "function", "function": {**PLAIN_WEATHER["function"], "strict": True}}


@pytest.mark.parametrize("tool", [CITY_WEATHER, STRICT_PLAIN_WEATHER], ids=["max-length", "plain"])
@pytest.mark.parametrize("question", ["What's the weather in Paris?", "What is 2 + 3?"], ids=["fits", "does-not-fit"])
async def test_auto_with_a_strict_tool_answers_in_text_or_a_valid_call(client, question, tool):
    for seed in range(4):
        out = await client.chat.completions.create(
            model=str(RILL_TINY_DIR), messages=ask(question), tools=[tool], temperature=1.0, seed=seed,
            max_tokens=80)
        assert_answer_fits(out.choices[0].message, out.choices[0].finish_reason, tool["function"]["parameters"])


@pytest.mark.parametrize("tool", [CITY_WEATHER, STRICT_PLAIN_WEATHER], ids=["max-length", "plain"])
async def test_auto_with_a_strict_tool_streams_calls_that_join_to_valid_arguments(client, tool):
    for seed in range(4):
        content, calls, finish = "", {}, None
        async for chunk in await client.chat.completions.create(
                model=str(RILL_TINY_DIR), messages=ask("What's the weather in Paris?"), tools=[tool],
                temperature=1.0, seed=seed, max_tokens=80, stream=True):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    name, arguments = calls.get(call.index, ("", ""))
                    calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
                finish = choice.finish_reason or finish
        message = openai.types.chat.ChatCompletionMessage(role="assistant", content=content, tool_calls=[
            {"id": str(i), "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in calls.items()] or None)
        assert_answer_fits(message, finish, tool["function"]["parameters"])


async def test_auto_with_a_strict_tool_it_cannot_enforce_is_a_400_and_without_strict_is_not(client):
    parameters = {"type": "object", "if": {}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    out = await client.chat.completions.create(model=str(RILL_TINY_DIR), messages=ask("hi"), tools=tools, max_tokens=3)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    tools[0]["function"]["strict"] = True
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=str(RILL_TINY_DIR), messages=ask("hi"), tools=tools, max_tokens=3)
    assert caught.value.body["param"] == "tools[0].function.parameters" and "if" in caught.value.body["message"]



@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_auto_call_pushed_by_logit_bias_still_validates(client, tokenizer, stream):
    """A bias towards `<tool_call>` makes any model open a call; the grammar keeps its arguments valid."""
    (opening,) = tokenizer.encode("<tool_call>")
    for seed in range(3):
        kwargs = dict(model=str(RILL_TINY_DIR), messages=ask("What's the weather in Paris?"), tools=[CITY_WEATHER],
                      parallel_tool_calls=False, logit_bias={str(opening): 100}, temperature=1.0, seed=seed,
                      max_tokens=120)
        if stream:
            arguments, finish = "", None
            async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                for choice in chunk.choices:
                    arguments += "".join(c.function.arguments or "" for c in choice.delta.tool_calls or [])
                    finish = choice.finish_reason or finish
        else:
            out = await client.chat.completions.create(**kwargs)
            (call,) = out.choices[0].message.tool_calls
            arguments, finish = call.function.arguments, out.choices[0].finish_reason
        jsonschema.validate(json.loads(arguments), CITY_WEATHER["function"]["parameters"])
        assert finish == "tool_calls"
