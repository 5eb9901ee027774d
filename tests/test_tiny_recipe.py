"""rill-tiny's recipe: corpus, held-out split, tokenizer, chat template, a training smoke run, shipped assets."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest

from rill.tiny import corpus, evaluate, schemas, splits, tasks
from rill.tiny.template import CHAT_TEMPLATE, TOOLS_HEADER, render
from rill.tiny.tokenizer_train import JSON_TOKENS, TOOL_TOKENS, save_tokenizer, train_tokenizer

ASSETS = evaluate.DEFAULT_MODEL_DIR
ASSET_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _train_conversations(n: int, seed: int = 0) -> list[corpus.Conversation]:
    return list(itertools.islice(corpus.iter_conversations(seed, splits.TRAIN), n))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(c.text() for c in _train_conversations(400))


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tok")
    save_tokenizer(tokenizer, path)
    return transformers.AutoTokenizer.from_pretrained(path)


# -- corpus and held-out split ---------------------------------------------------------------------


def test_corpus_is_deterministic_for_a_seed():
    assert [c.text() for c in _train_conversations(50, seed=3)] == [c.text() for c in _train_conversations(50, seed=3)]
    assert [c.text() for c in _train_conversations(50, seed=3)] != [c.text() for c in _train_conversations(50, seed=4)]


@pytest.mark.parametrize("a,b", [(347, 58), (999, 1), (5, 3), (120, 7)])
def test_arithmetic_answers_show_column_steps_and_end_with_the_result(a, b):
    assert tasks.arithmetic_answer(a, b, "+").endswith(f"{a} + {b} = {a + b}")
    assert tasks.arithmetic_answer(a, b, "-").endswith(f"{a} - {b} = {a - b}")
    assert tasks.arithmetic_answer(347, 58, "+") == "7+8=15, 4+5+1=10, 3+0+1=4. 347 + 58 = 405"
    assert tasks.arithmetic_answer(512, 77, "-") == "12-7=5, 11-7-1=3, 5-0-1=4. 512 - 77 = 435"


@pytest.mark.parametrize(("a", "b", "hard"), [
    (221, 16, True),   # a borrow into 2-1: "2-1-1=0"
    (771, 399, True),  # two borrows
    (159, 158, True),  # the result is shorter than the operands
    (57, 23, False),
    (161, 17, False),  # one borrow, then plain columns
])
def test_hard_subtractions_are_borrow_chains_and_short_results(a, b, hard):
    assert tasks.is_hard_subtraction(a, b) is hard


def test_training_subtractions_lean_toward_borrow_chains_but_held_out_ones_do_not():
    def share(split, seed):
        rng = random.Random(seed)
        pairs = [tasks.make_exchange(rng, "sub", split, schemas.Toolbox()).key[1:] for _ in range(800)]
        return sum(tasks.is_hard_subtraction(a, b) for a, b in pairs) / len(pairs)

    assert share(splits.TRAIN, 0) > 0.35
    assert share(splits.EVAL, 0) < 0.25


def test_weather_and_time_tools_are_sometimes_named_alike_so_the_call_must_copy_the_name():
    rng = random.Random(0)
    toolboxes = [schemas.sample_toolbox(rng, ["weather", "time"], 0) for _ in range(200)]
    snake = [(tb.fits["weather"][0].split("_"), tb.fits["time"][0].split("_")) for tb in toolboxes
             if "_" in tb.fits["weather"][0] + tb.fits["time"][0]]
    alike = [(w, t) for w, t in snake if w[0] == t[0] and w[-1] == t[-1] and w[0] not in ("weather", "time")]
    assert 0.25 < len(alike) / len(snake) < 0.8


def test_word_answers_spell_then_answer():
    assert tasks.reverse_answer("stream").endswith(". maerts")
    assert tasks.count_answer("banana").endswith('There are 6 letters in "banana".')


def test_eval_cases_are_deterministic():
    assert evaluate.make_cases(5) == evaluate.make_cases(5)


def test_issue_examples_are_held_out():
    assert {(347, 58), (512, 77)} <= {p for p in splits.EXAMPLE_PAIRS if splits.is_eval_pair(*p)}
    assert {"stream", "banana", "hello", "world"} <= splits.eval_words()
    assert {"Tokyo", "Paris"} <= splits.eval_cities()
    assert {"Asia/Tokyo", "Europe/Paris"} <= splits.eval_zones()


def test_training_data_never_shows_held_out_pairs_words_or_places():
    held_words = splits.eval_words()
    held_places = splits.eval_cities() | splits.eval_zones()
    for conversation in _train_conversations(3000, seed=7):
        for key in conversation.keys:
            if key[0] in ("add", "sub"):
                assert not splits.is_eval_pair(key[1], key[2]), key
        text = conversation.text()
        assert not {w.lower() for w in re.findall(r"[A-Za-z]+", text)} & held_words
        assert not [p for p in held_places if p in text]


def test_fixed_sentences_do_not_contain_held_out_words():
    words = {w.lower() for text in tasks.fixed_texts() for w in re.findall(r"[A-Za-z]+", text)}
    assert not words & splits.eval_words()


def test_eval_cases_use_held_out_values():
    for case in evaluate.make_cases(20):
        if case.family in ("add", "sub"):
            a, b, _ = map(int, re.findall(r"\d+", case.expected.rsplit(". ", 1)[-1]))  # "... a + b = c"
            assert splits.is_eval_pair(a, b)
        if case.family == "weather_call":
            (city,) = case.expected["arguments"].values()
            assert city in splits.eval_cities()


def test_tool_families_call_the_listed_tool_that_fits_by_its_name_and_parameter():
    rng = random.Random(0)
    for _ in range(300):
        c = corpus.sample_conversation(rng, splits.TRAIN, "weather", num_history=0)
        listed = {t["function"]["name"]: t["function"]["parameters"] for t in c.tools or ()}
        fitting = [name for name in listed if "weather" in name.lower()]
        calls = [call["function"] for m in c.messages for call in m.get("tool_calls", ())]
        assert [call["name"] for call in calls] == fitting[:1]
        for call in calls:
            assert list(call["arguments"]) == list(listed[call["name"]]["properties"])[:1]


def test_training_lists_tools_in_every_framework_shape_beside_tools_that_do_not_fit():
    texts = "\n".join(c.text() for c in _train_conversations(3000, seed=2) if c.tools)
    for fragment in ('"parameters": {"properties": {"', '"title": "City"', '"additionalProperties": false}, "strict": true',
                     "Correctly extracted `", ': str) -> str\\n', '"enum": ["celsius", "fahrenheit"]', '"description": null',
                     '"parameters": {"type": "object", "properties": {"', '"name": "search_web"', '"name": "GetWeather"'):
        assert fragment in texts, fragment
    assert re.search(r'"parameters": \{"properties": \{[^\n]*?\}\}, "type": "object"\}', texts)  # no "required"


@pytest.mark.parametrize("shape", list(schemas.PRESETS))
def test_framework_presets_reproduce_what_the_frameworks_send(shape):
    """The exact JSON that langchain-core 1.8, openai-agents 0.24, llama-index-core 0.14, instructor 1.17
    and llm 0.36 send for get_weather(city) (dumped from the real packages into these literals)."""
    want = {
        "rill": tasks.WEATHER_TOOL,
        "langchain": FRAMEWORK_WEATHER["langchain"], "llm": FRAMEWORK_WEATHER["langchain"],
        "openai_agents": FRAMEWORK_WEATHER["openai_agents"], "llama_index": FRAMEWORK_WEATHER["llama_index"],
        "llama_index_future": FRAMEWORK_WEATHER["llama_index_future"],
        "instructor": FRAMEWORK_WEATHER["instructor"],
    }
    want["enum_unit"] = FRAMEWORK_WEATHER["enum_unit"]
    tool = evaluate.framework_tool(shape, "weather")
    if shape in want:
        assert json.dumps(tool) == json.dumps(want[shape])
    name, param, _ = schemas.preset_tool(shape, "weather")
    assert tool["function"]["name"] == name and param in tool["function"]["parameters"]["properties"]


def _framework_tool(parameters: dict, description="Get the current weather in a city.", name="get_weather", **extra) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters, **extra}}


_PYDANTIC = {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}
_TITLED = {"properties": {"city": {"title": "City", "type": "string"}}, "required": ["city"], "type": "object"}
FRAMEWORK_WEATHER = {
    "langchain": _framework_tool(_PYDANTIC),
    "openai_agents": _framework_tool({**{k: v for k, v in _TITLED.items() if k != "type"}, "title": "get_weather_args",
                                      "type": "object", "additionalProperties": False}, strict=True),
    "llama_index": _framework_tool(_TITLED, "get_weather(city: str) -> str\nGet the current weather in a city."),
    # the same function in a module under `from __future__ import annotations`
    "llama_index_future": _framework_tool(_TITLED, "get_weather(city: 'str') -> 'str'\nGet the current weather in a city."),
    "instructor": _framework_tool(_TITLED, "Correctly extracted `GetWeather` with all the required parameters with correct types",
                                  name="GetWeather"),
    # langchain's convert_to_openai_tool(get_current_weather(location: str, unit: Literal["celsius", "fahrenheit"] = "celsius"))
    "enum_unit": _framework_tool(
        {"properties": {"location": {"type": "string"}, "unit": {"default": "celsius", "enum": ["celsius", "fahrenheit"], "type": "string"}},
         "required": ["location"], "type": "object"},
        "Get the current weather in a given location.", name="get_current_weather"),
}


def test_a_prompt_listing_both_framework_tools_stays_short(tokenizer):
    """The window is 640 tokens: the tools list has to leave room for earlier turns."""
    for shape in schemas.PRESETS:
        tools = [evaluate.framework_tool(shape, "weather"), evaluate.framework_tool(shape, "time")]
        prompt = render([{"role": "user", "content": "What's the weather in Tokyo?"}], tools, add_generation_prompt=True)
        assert len(tokenizer.encode(prompt).ids) < 300, shape


@pytest.mark.parametrize("form,want", [
    ("json", '{"temperature_c": 2, "condition": "snowy"}'), ("compact", '{"temperature_c":2,"condition":"snowy"}'),
    ("repr", "{'temperature_c': 2, 'condition': 'snowy'}"),
])
def test_tool_results_come_in_the_forms_clients_send(form, want):
    assert schemas.serialize({"temperature_c": 2, "condition": "snowy"}, form) == want
    forms = {schemas.weather_result(random.Random(i), "Lima", 2, "snowy") for i in range(200)}
    assert want in forms and "2°C and snowy" in forms


# -- tokenizer ------------------------------------------------------------------------------------


def test_tokenizer_splits_letters_and_digits_one_per_token(tokenizer):
    for text in ("What is 347 + 58?", "Reverse the word: stream", "HELLO WORLD", "Europe/Paris"):
        tokens = tokenizer.encode(text).tokens
        letters_and_digits = [t for t in tokens if re.search(r"[A-Za-z0-9]", t)]
        assert "".join(letters_and_digits) == re.sub(r"[^A-Za-z0-9]", "", text)
        assert all(len(t) == 1 for t in letters_and_digits)


def test_tokenizer_round_trips_any_utf8(tokenizer):
    text = 'It is -3°C and snowy in Zürich. 日本 {"a": 1}\n\ttab'
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_tool_markers_are_single_tokens(tokenizer):
    for marker in (*TOOL_TOKENS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer.encode(marker).ids) == 1


def test_tool_json_fragments_and_the_tools_preamble_are_single_tokens_and_round_trip(tokenizer):
    for fragment in (*JSON_TOKENS, TOOLS_HEADER):
        assert len(tokenizer.encode(fragment).ids) == 1, fragment
    text = render(_weather_chain(), [tasks.WEATHER_TOOL, tasks.TIME_TOOL])
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text
    without_specials = re.sub(r"<\|(im_start|im_end|endoftext)\|>", "", text)
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=True) == without_specials


def test_a_tool_call_is_its_name_keys_and_value_letters(tokenizer):
    call = json.dumps({"name": "get_weather", "arguments": {"city": "Tokyo"}})
    ids = tokenizer.encode(call).ids
    tokens = [tokenizer.id_to_token(i) for i in ids]
    texts = [tokenizer.decode([i]) for i in ids]
    assert texts[0] == '{"name": "' and '", "arguments": {"' in texts
    value = texts[len(texts) - 1 - texts[::-1].index('": "') + 1:]
    assert value == [*"Tokyo", '"}}'], tokens


# -- chat template --------------------------------------------------------------------------------


def _weather_chain() -> list[dict]:
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What's the weather in Tokyo?"},
        tasks.tool_call_message("get_weather", {"city": "Tokyo"}),
        {"role": "tool", "content": '{"temperature_c": 21, "condition": "sunny"}'},
        {"role": "assistant", "content": "It is 21°C and sunny in Tokyo."},
    ]


def test_template_renders_tools_calls_and_results_in_qwen_shape():
    text = render(_weather_chain(), [tasks.WEATHER_TOOL, tasks.TIME_TOOL])
    assert text.startswith("<|im_start|>system\nAnswer briefly.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(tasks.WEATHER_TOOL) + "\n" + json.dumps(tasks.TIME_TOOL) + "\n</tools>" in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call><|im_end|>\n' in text
    assert '<|im_start|>user\n<tool_response>\n{"temperature_c": 21, "condition": "sunny"}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\nIt is 21°C and sunny in Tokyo.<|im_end|>\n")


def test_template_without_tools_has_plain_system_turn():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(messages[1:]) == "<|im_start|>user\nHi<|im_end|>\n"


def test_jinja_template_matches_python_renderer(hf_tokenizer):
    assert hf_tokenizer.chat_template == CHAT_TEMPLATE
    string_args = _weather_chain()
    string_args[2] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}}
    ]}
    samples = [(c.messages, c.tools) for c in _train_conversations(200, seed=5)] + [(string_args, [tasks.WEATHER_TOOL])]
    for messages, tools in samples:
        for gen in (False, True):
            expected = render(messages, tools, add_generation_prompt=gen)
            got = hf_tokenizer.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, add_generation_prompt=gen, tokenize=False
            )
            assert got == expected


# -- training and the shipped model ---------------------------------------------------------------


def test_training_smoke_run_writes_a_loadable_directory(tmp_path):
    transformers = pytest.importorskip("transformers")
    from rill.tiny import train

    out = tmp_path / "tiny"
    argv = ["--out", str(out), "--device", "cpu", "--steps", "2", "--batch-size", "2", "--seq-len", "256", "--workers", "1"]
    assert train.main(argv) == 0
    for name in ASSET_FILES:
        assert (out / name).is_file()
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert model.config.sliding_window == train.SLIDING_WINDOW
    assert "rill" not in (out / "config.json").read_text()  # the training attention kernel stays out
    assert json.loads((out / "training_run.json").read_text())["steps"] == 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        assert (out / "training_loss.png").read_bytes()[:4] == b"\x89PNG"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 1 + 2?"}], add_generation_prompt=True)
    assert len(model.generate(**_as_batch(prompt), max_new_tokens=2, do_sample=False)[0]) > 0


def test_training_window_attention_matches_sdpa_in_values_and_gradients():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rill.tiny import window_attention

    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=40, max_position_embeddings=512,
    )
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 300))  # several query chunks, each reaching back past the window
    results = []
    for attn in ("sdpa", window_attention.register()):
        torch.manual_seed(1)
        model = transformers.MistralForCausalLM(config)
        model.config._attn_implementation = attn
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        results.append((out.logits.detach(), [p.grad for p in model.parameters()]))
    (ref_logits, ref_grads), (logits, grads) = results
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


def test_training_window_attention_refuses_a_padding_mask():
    torch = pytest.importorskip("torch")
    from rill.tiny import window_attention

    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="attention mask"):
        window_attention.window_attention(None, q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool), sliding_window=2)


@pytest.mark.parametrize("device,capability,want", [
    ("cuda", "AVX2", "bf16"), ("cpu", "AVX512", "bf16"), ("cpu", "AVX2", "fp32"), ("cpu", "DEFAULT", "fp32"),
])
def test_auto_precision_trains_in_bf16_only_where_the_hardware_has_it(device, capability, want):
    pytest.importorskip("transformers")
    from rill.tiny import train

    assert train.resolve_precision("auto", device, capability) == want
    assert train.resolve_precision("fp32", "cuda", capability) == "fp32"
    assert train.resolve_precision("bf16", "cpu", capability) == "bf16"


def _as_batch(prompt):
    import torch

    ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    return {"input_ids": torch.tensor([ids])}


def test_shipped_assets_load_in_transformers_and_are_small():
    transformers = pytest.importorskip("transformers")
    if not (ASSETS / "model.safetensors").is_file():
        pytest.skip("rill-tiny has not been trained into the package yet")
    assert sum((ASSETS / name).stat().st_size for name in ASSET_FILES) < 20 * 2**20
    config = json.loads((ASSETS / "config.json").read_text())
    assert config["architectures"] == ["MistralForCausalLM"]
    assert config["sliding_window"] < 1024
    tokenizer_config = json.loads((ASSETS / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    model = transformers.AutoModelForCausalLM.from_pretrained(ASSETS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(ASSETS)
    assert sum(p.numel() for p in model.parameters()) < 3_700_000
    assert tokenizer.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_shipped_model_answers_the_issue_examples():
    pytest.importorskip("transformers")
    if not (ASSETS / "model.safetensors").is_file():
        pytest.skip("rill-tiny has not been trained into the package yet")
    backend = evaluate.TransformersBackend(ASSETS)
    cases = [case for examples in evaluate.issue_examples().values() for case in examples]
    texts = backend.generate(cases, evaluate.MAX_TOKENS)
    assert [evaluate.is_correct(c, t) for c, t in zip(cases, texts)] == [True] * len(cases), texts


def test_eval_command_writes_its_report_and_a_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    report_file = tmp_path / "eval.json"
    rc = evaluate.main(["--per-family", "2", "--backend", "rill", "--json", str(report_file)])
    report = json.loads(report_file.read_text())
    assert set(report["families"]) >= {"add", "sub", "weather_call", "tool_answer", "about"}
    assert all(entry["n"] == 2 for entry in report["families"].values())
    assert rc == (1 if any(e["accuracy"] < evaluate.BAR for e in report["families"].values()) else 0)
    assert (tmp_path / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| add |" in capsys.readouterr().out
