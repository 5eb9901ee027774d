"""The real chat templates of Phi-3, Mixtral and Qwen3(-MoE) render in rill exactly as transformers'
apply_chat_template renders them (text and ids), from the same tokenizer directory.

Templates in tests/data, byte for byte as their sources hold them:
- microsoft-Phi-3.5-mini-instruct.jinja: llama.cpp's models/templates/microsoft-Phi-3.5-mini-instruct.jinja
  (ggerganov/llama.cpp at 7b5e0803), written by its scripts/get_chat_template.py from the hub model.
- Qwen-Qwen3-0.6B.jinja: llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja (read from its mirror
  ye-NX/llama.cpp at b354d7c9, line endings as LF); the Qwen3 MoE models (Qwen3-30B-A3B) ship the same one.
- mistralai-Mixtral-8x7B-Instruct-v0.1.jinja: the [INST] template that llama.cpp's
  tests/test-chat-template.cpp carries for mistralai/Mistral-7B-Instruct-v0.2 (ggml-org/llama.cpp at
  03f94f19), the template Mixtral-8x7B-Instruct-v0.1 shipped with: user/assistant only, strictly alternating.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers_tokenizers import byte_fallback_bpe, byte_level_bpe, hf_tokenizer, llama_config, qwen_config, save_dir
from rill.errors import ChatTemplateError
from rill.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data"

SYSTEM_CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 17 + 25?"},
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "And 6 * 7? Answer in 中文."},
]
ALTERNATING = SYSTEM_CHAT[1:]
THINKING = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6"},
]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOL_ROUND = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "東京"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
    {"role": "tool", "tool_call_id": "c2", "content": "rain, 14 C"},
]

TEMPLATES = {  # name -> (file, tokenizer shape)
    "phi3": ("microsoft-Phi-3.5-mini-instruct.jinja", "sentencepiece"),
    "mixtral": ("mistralai-Mixtral-8x7B-Instruct-v0.1.jinja", "sentencepiece"),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "qwen"),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """rill's and transformers' tokenizers over one directory per real template."""
    out = {}
    for name, (file, shape) in TEMPLATES.items():
        qwen = shape == "qwen"
        backend, config = (byte_level_bpe(), qwen_config()) if qwen else (byte_fallback_bpe(), llama_config())
        template = (DATA / file).read_text(encoding="utf-8")
        path = save_dir(tmp_path_factory.mktemp(name), backend, config, chat_template=template)
        out[name] = Tokenizer.from_dir(path), hf_tokenizer(path)
    return out


def assert_renders_like_transformers(pair, messages, **kwargs) -> str:
    ours, hf = pair
    extra = kwargs.pop("chat_template_kwargs", None) or {}
    kwargs.setdefault("add_generation_prompt", True)  # rill's default; transformers' is False
    text = hf.apply_chat_template(messages, tokenize=False, **kwargs, **extra)
    assert ours.apply_chat_template(messages, chat_template_kwargs=extra, **kwargs) == text
    ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs, **extra)
    assert ours.encode_chat(messages, chat_template_kwargs=extra, **kwargs) == ids
    return text


CASES = [
    ("phi3", SYSTEM_CHAT, {}),
    ("phi3", SYSTEM_CHAT[:3], {"add_generation_prompt": False}),  # ends with the eos token
    ("phi3", [{"role": "system", "content": ""}, *ALTERNATING], {}),  # an empty system message is left out
    ("mixtral", ALTERNATING, {}),
    ("mixtral", ALTERNATING[:2], {"add_generation_prompt": False}),
    ("qwen3", SYSTEM_CHAT, {}),
    ("qwen3", SYSTEM_CHAT, {"chat_template_kwargs": {"enable_thinking": False}}),
    ("qwen3", THINKING, {"add_generation_prompt": False}),
    ("qwen3", TOOL_ROUND, {"tools": [WEATHER_TOOL]}),
]


@pytest.mark.parametrize(("name", "messages", "kwargs"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_real_template_renders_and_encodes_like_transformers(pairs, name, messages, kwargs):
    assert_renders_like_transformers(pairs[name], messages, **kwargs)


def test_phi3_turns_end_with_end_and_the_prompt_opens_the_assistant(pairs):
    text = assert_renders_like_transformers(pairs["phi3"], SYSTEM_CHAT)
    assert text.startswith("<|system|>\nYou are terse.<|end|>\n<|user|>\n")
    assert text.endswith("<|end|>\n<|assistant|>\n")


def test_mixtral_wraps_user_turns_in_inst_and_closes_answers_with_eos(pairs):
    text = assert_renders_like_transformers(pairs["mixtral"], ALTERNATING)
    assert text == "<s>[INST] What is 17 + 25? [/INST]42</s>[INST] And 6 * 7? Answer in 中文. [/INST]"


def test_mixtral_template_refuses_a_system_message_as_a_chat_template_error(pairs):
    ours, hf = pairs["mixtral"]
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        hf.apply_chat_template(SYSTEM_CHAT, tokenize=False)
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        ours.apply_chat_template(SYSTEM_CHAT)


def test_qwen3_keeps_only_the_last_turns_reasoning_and_writes_tool_calls_as_json(pairs):
    history = assert_renders_like_transformers(pairs["qwen3"], THINKING, add_generation_prompt=False)
    assert "Two plus two" not in history and "<think>\nadd\n</think>\n\n6" in history
    tools = assert_renders_like_transformers(pairs["qwen3"], TOOL_ROUND, tools=[WEATHER_TOOL])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in tools
    assert "<tool_response>\nrain, 14 C\n</tool_response><|im_end|>" in tools
