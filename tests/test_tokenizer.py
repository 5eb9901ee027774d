"""Tokenizer.from_dir reads an HF tokenizer directory as transformers 5 does: same ids, text and special tokens."""

from __future__ import annotations

import json

import pytest
from helpers_tokenizers import (
    SAMPLE_TEXTS,
    byte_fallback_bpe,
    byte_level_bpe,
    hf_tokenizer,
    llama_config,
    qwen_config,
    save_dir,
)

from rill.errors import ChatTemplateError, ModelLoadError, TemplateRewritesTextError
from rill.tokenizer import Tokenizer
from rill.tokenizer.chat_template import STREAMED_TEXT_PLACEHOLDER, split_at_placeholder

SHAPES = {"byte_level": (byte_level_bpe, qwen_config), "byte_fallback": (byte_fallback_bpe, llama_config)}
EXTRA_TEXTS = ["<pad> and <think>x</think> <|image|> <extra1>", "ab" * 50 + " 😀" * 5]
CHAT = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


def _pair(path):
    return Tokenizer.from_dir(path), hf_tokenizer(path)


def _assert_same_tokenizer(ours, hf):
    assert ours.vocab_size == len(hf)
    assert ours.all_special_ids == frozenset(hf.all_special_ids)
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.get_vocab() == hf.get_vocab()
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(ours, name) == getattr(hf, name), name
        assert getattr(ours, name + "_id") == getattr(hf, name + "_id"), name
    for text in SAMPLE_TEXTS + EXTRA_TEXTS:
        for add_special in (True, False):
            ids = ours.encode(text, add_special_tokens=add_special)
            assert ids == hf.encode(text, add_special_tokens=add_special), (text, add_special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
            assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("shape", SHAPES)
def test_encode_decode_and_special_tokens_match_transformers(tmp_path, shape):
    build, config = SHAPES[shape]
    _assert_same_tokenizer(*_pair(save_dir(tmp_path, build(), config())))


def _added(content: str, special: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": special}


# Config variants seen in the wild, each checked against transformers on the same files.
CONFIG_CASES = {
    "no_config": ("byte_level", None, {}),
    "no_config_bos_from_post_processor": ("byte_fallback", None, {}),
    "pad_token_missing_from_vocab": ("byte_fallback", llama_config(pad_token="<pad>"), {}),
    "added_tokens_decoder_makes_think_special": (
        "byte_level", qwen_config(added_tokens_decoder={"422": _added("<think>", True)}), {}),
    "bos_as_added_token_dict": (
        "byte_fallback", llama_config(bos_token={"__type": "AddedToken", **_added("<s>", True)}), {}),
    "extra_special_tokens_list": ("byte_level", qwen_config(extra_special_tokens=["<think>", "<extra1>"]), {}),
    "additional_special_tokens_legacy_name": (
        "byte_level", qwen_config(additional_special_tokens=["<think>", "<extra1>"]), {}),
    "extra_special_tokens_dict": ("byte_level", qwen_config(extra_special_tokens={"image_token": "<|image|>"}), {}),
    "model_specific_token": ("byte_level", qwen_config(image_token="<|image|>"), {}),
    "eos_is_a_plain_added_token": ("byte_level", qwen_config(eos_token="</think>"), {}),
    "special_tokens_map_file": (
        "byte_fallback", {"add_bos_token": True},
        {"special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}}),
    "special_tokens_map_file_overrides_config": (
        "byte_fallback", llama_config(eos_token="<s>"), {"special_tokens_map.json": {"eos_token": "</s>"}}),
    "split_special_tokens": ("byte_level", qwen_config(split_special_tokens=True), {}),
    "add_bos_token_false_is_ignored_as_in_transformers": ("byte_fallback", llama_config(add_bos_token=False), {}),
    "add_eos_token_true_is_ignored_as_in_transformers": ("byte_fallback", llama_config(add_eos_token=True), {}),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_config_variants_match_transformers(tmp_path, case):
    shape, config, files = CONFIG_CASES[case]
    path = save_dir(tmp_path, SHAPES[shape][0](), config)
    for name, content in files.items():
        (path / name).write_text(json.dumps(content), encoding="utf-8")
    _assert_same_tokenizer(*_pair(path))


def test_post_processor_adds_bos_and_special_tokens_can_be_left_out(tmp_path):
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_fallback_bpe(), llama_config()))
    assert ours.encode("Hello")[0] == ours.bos_token_id == 1
    assert ours.bos_token_id not in ours.encode("Hello", add_special_tokens=False)


def test_decode_skips_special_tokens_but_keeps_plain_added_tokens(tmp_path):
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config()))
    ids = ours.encode("<|im_start|>assistant\n<think>ok</think><|im_end|>")
    assert ours.decode(ids) == "assistant\n<think>ok</think>"
    assert ours.decode(ids, skip_special_tokens=False) == "<|im_start|>assistant\n<think>ok</think><|im_end|>"


@pytest.mark.parametrize("shape", SHAPES)
def test_offsets_say_which_characters_each_id_came_from(tmp_path, shape):
    build, config = SHAPES[shape]
    ours = Tokenizer.from_dir(save_dir(tmp_path, build(), config()))
    ids, offsets = ours.encode_with_offsets("Hello world")
    assert ids == ours.encode("Hello world", add_special_tokens=False) and len(offsets) == len(ids)
    assert offsets[-1][1] == len("Hello world") and all(a <= b for a, b in offsets)
    assert [a for a, _ in offsets] == sorted(a for a, _ in offsets)


def test_unknown_ids_decode_to_nothing_and_convert_to_empty_strings(tmp_path):
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config()))
    hello = ours.encode("Hello")
    assert ours.decode([*hello, ours.vocab_size + 7]) == "Hello"
    assert ours.convert_ids_to_tokens([ours.vocab_size + 7]) == [""]


def test_missing_tokenizer_json_is_a_load_error_naming_the_file(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


@pytest.mark.parametrize(
    ("file", "content", "expected"),
    [
        ("tokenizer.json", "{not json", "tokenizer.json could not be read"),
        ("tokenizer_config.json", "{not json", "tokenizer_config.json could not be read"),
        ("tokenizer_config.json", "[1, 2]", "tokenizer_config.json must hold a JSON object"),
        ("tokenizer_config.json", json.dumps({"eos_token": 5}), "eos_token must be a string"),
        ("tokenizer_config.json", json.dumps({"added_tokens_decoder": {"x": _added("a", True)}}),
         "added_tokens_decoder"),
        ("tokenizer_config.json", json.dumps({"chat_template": {"a": 1}}), "chat_template"),
    ],
)
def test_malformed_files_are_load_errors_naming_the_file(tmp_path, file, content, expected):
    save_dir(tmp_path, byte_level_bpe(), {})
    (tmp_path / file).write_text(content, encoding="utf-8")
    with pytest.raises(ModelLoadError, match=expected):
        Tokenizer.from_dir(tmp_path)


# -- where chat templates come from ------------------------------------------------------------------


def _saved_by_transformers(tmp_path, template) -> Tokenizer:
    """A directory written by transformers 5's save_pretrained, as a user's fine-tune would be."""
    source = save_dir(tmp_path / "source", byte_level_bpe(), qwen_config())
    hf = hf_tokenizer(source)
    hf.chat_template = template
    hf.save_pretrained(str(tmp_path / "saved"))
    return tmp_path / "saved"


def test_reads_the_chat_template_jinja_that_save_pretrained_writes(tmp_path):
    saved = _saved_by_transformers(tmp_path, "{{ messages[0].content }}!")
    assert (saved / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((saved / "tokenizer_config.json").read_text())
    ours, hf = _pair(saved)
    assert ours.apply_chat_template(CHAT) == hf.apply_chat_template(CHAT, tokenize=False) == "hi!"


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path):
    saved = _saved_by_transformers(tmp_path, {"default": "plain {{ tools }}", "tool_use": "tools {{ tools | length }}"})
    assert (saved / "additional_chat_templates" / "tool_use.jinja").is_file()
    ours, hf = _pair(saved)
    for tools in (None, TOOLS):
        assert ours.apply_chat_template(CHAT, tools=tools) == hf.apply_chat_template(
            CHAT, tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(CHAT, tools=TOOLS) == "tools 1"


def test_config_template_list_is_the_legacy_form_of_named_templates(tmp_path):
    templates = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config(chat_template=templates)))
    assert ours.apply_chat_template(CHAT) == "D"
    assert ours.apply_chat_template(CHAT, tools=TOOLS) == "T"


def test_template_file_wins_over_the_config_entry(tmp_path):
    path = save_dir(tmp_path, byte_level_bpe(), qwen_config(chat_template="config"), chat_template="file")
    ours, hf = _pair(path)
    assert ours.apply_chat_template(CHAT) == hf.apply_chat_template(CHAT, tokenize=False) == "file"


def test_chat_template_argument_overrides_the_model_templates(tmp_path):
    path = save_dir(tmp_path, byte_level_bpe(), qwen_config(chat_template="config"), chat_template="file")
    assert Tokenizer.from_dir(path, chat_template="override").apply_chat_template(CHAT) == "override"


def test_named_templates_without_default_are_an_error_when_used(tmp_path):
    config = qwen_config(chat_template=[{"name": "tool_use", "template": "T"}])
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), config))
    assert ours.apply_chat_template(CHAT, tools=TOOLS) == "T"
    with pytest.raises(ChatTemplateError, match="no 'default'"):
        ours.apply_chat_template(CHAT)


def test_encode_chat_does_not_add_special_tokens_the_template_already_wrote(tmp_path):
    template = "{{ bos_token }}{{ messages[0].content }}"
    path = save_dir(tmp_path, byte_fallback_bpe(), llama_config(), chat_template=template)
    ours = Tokenizer.from_dir(path)
    ids = ours.encode_chat(CHAT)
    assert ids == ours.encode("<s>hi", add_special_tokens=False)
    assert ids.count(ours.bos_token_id) == 1


def test_a_placeholder_splits_the_rendered_prompt_around_a_messages_text(tmp_path):
    template = "<{{ messages[0].content }}>"
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config(), chat_template=template))
    rendered = ours.apply_chat_template([{"role": "user", "content": "hi " + STREAMED_TEXT_PLACEHOLDER}])
    assert split_at_placeholder(rendered, STREAMED_TEXT_PLACEHOLDER) == ("<hi ", ">")


@pytest.mark.parametrize("template", ["{{ messages[0].content | upper }}", "{{ messages[0].content * 2 }}", "x"])
def test_a_template_that_rewrites_drops_or_repeats_the_placeholder_is_an_error(tmp_path, template):
    ours = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config(), chat_template=template))
    rendered = ours.apply_chat_template([{"role": "user", "content": STREAMED_TEXT_PLACEHOLDER}])
    with pytest.raises(TemplateRewritesTextError, match="verbatim exactly once"):
        split_at_placeholder(rendered, STREAMED_TEXT_PLACEHOLDER)
