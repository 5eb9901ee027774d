"""Streamed text tokenizes to exactly the ids of the whole text, however it is cut, for the
tokenizer shapes rill serves; most of it commits before the end, so prefill can start; and each
feed re-encodes a few words, not the text so far."""

from __future__ import annotations

from pathlib import Path

import pytest
import tokenizers as backends
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers

from helpers_tokenizers import (
    CORPUS, SAMPLE_TEXTS, byte_fallback_bpe, byte_level_bpe, letter_digit_bpe, llama_config, qwen_config, save_dir,
    sentencepiece_bpe,
)
from rill.tokenizer import IncrementalEncoder, Tokenizer
from rill.tokenizer.incremental import splits_at_words

CHATML_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
SHAPES = ["byte_level", "byte_fallback", "letter_digit", "sentencepiece", "rill_tiny"]
WORDS = st.lists(st.sampled_from(["the", "quick", "fox", " ", "  ", "\n", ",", "42", "7", "café", "你好", "😀",
                                  "<|im_end|>", "don't", "jumps", "\t", "!?", ".\n", "_x"]), max_size=30).map("".join)
TEXTS = (st.lists(st.sampled_from(SAMPLE_TEXTS + CORPUS), min_size=1, max_size=4).map(" ".join)
         | st.text(st.sampled_from("ab cd\n\t!?.,é你😀<|>_"), max_size=80) | WORDS)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    shapes = {
        "byte_level": Tokenizer.from_dir(save_dir(root / "bl", byte_level_bpe(), qwen_config())),
        "byte_fallback": Tokenizer.from_dir(save_dir(root / "bf", byte_fallback_bpe(), llama_config())),
        "letter_digit": Tokenizer.from_dir(save_dir(root / "ld", letter_digit_bpe(), qwen_config())),
        "sentencepiece": Tokenizer.from_dir(save_dir(root / "sp", sentencepiece_bpe(), llama_config())),
    }
    from rill.assets import __path__ as assets

    tiny = Path(assets[0]) / "rill-tiny"
    if (tiny / "tokenizer.json").is_file():  # once rill-tiny is trained into the package
        shapes["rill_tiny"] = Tokenizer.from_dir(tiny)
    return shapes


def shape(tokenizers, name: str) -> Tokenizer:
    if name not in tokenizers:
        pytest.skip("rill-tiny has not been trained into the package yet")
    return tokenizers[name]


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def streamed_ids(tokenizer, prefix: str, parts: list[str], suffix: str = "", special: bool = False) -> list[int]:
    encoder = IncrementalEncoder(tokenizer, add_special_tokens=special)
    ids = encoder.feed(prefix)
    for part in parts:
        ids += encoder.feed(part)
    ids += encoder.flush(suffix)
    assert encoder.num_committed_tokens == len(ids) and encoder.num_pending_chars == 0
    return ids


def spy_on_encodings(monkeypatch, tokenizer) -> list[int]:
    """The length of every text the encoder encodes from now on."""
    lengths, encode = [], tokenizer.encode_with_offsets

    def spy(text):
        lengths.append(len(text))
        return encode(text)

    monkeypatch.setattr(tokenizer, "encode_with_offsets", spy)
    return lengths


@pytest.mark.parametrize("name", SHAPES)
@settings(max_examples=150, deadline=None)
@given(prefix=TEXTS, body=TEXTS, cuts=st.lists(st.integers(0, 400), max_size=12),
       suffix=st.sampled_from(["", CHATML_SUFFIX, "</s>"]), special=st.booleans())
def test_streamed_text_gives_the_ids_of_the_whole_text_for_any_chunking(tokenizers, name, prefix, body, cuts,
                                                                        suffix, special):
    tokenizer = shape(tokenizers, name)
    ids = streamed_ids(tokenizer, prefix, pieces(body, cuts), suffix, special)
    assert ids == tokenizer.encode(prefix + body + suffix, add_special_tokens=special)


@pytest.mark.parametrize("name", SHAPES)
def test_character_by_character_gives_the_ids_of_the_whole_text(tokenizers, name):
    tokenizer = shape(tokenizers, name)
    for text in SAMPLE_TEXTS + CORPUS:
        assert streamed_ids(tokenizer, "", list(text)) == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", ["byte_level", "letter_digit", "sentencepiece"])
def test_word_text_commits_all_but_its_last_word_before_the_end(tokenizers, name):
    tokenizer = tokenizers[name]
    encoder = IncrementalEncoder(tokenizer)
    early = encoder.feed("<|im_start|>user\n")
    for word in CORPUS[0].split(" "):  # "Hello world! ... the lazy dog."
        early += encoder.feed(word + " ")
    assert encoder.num_pending_chars == len(" dog. ")
    late = encoder.flush(CHATML_SUFFIX)
    assert early + late == tokenizer.encode("<|im_start|>user\n" + CORPUS[0] + " " + CHATML_SUFFIX,
                                            add_special_tokens=False)
    assert encoder.num_committed_tokens == len(early + late)


def test_a_vocabulary_with_tokens_across_words_commits_only_at_the_end(tokenizers):
    """The byte-fallback test tokenizer learned merges like 'o▁w': no early cut is safe there."""
    assert not splits_at_words(tokenizers["byte_fallback"])
    assert all(splits_at_words(tokenizers[name]) for name in ["byte_level", "letter_digit", "sentencepiece"])
    encoder = IncrementalEncoder(tokenizers["byte_fallback"])
    assert encoder.feed("hello world and more ") == [] and encoder.flush() != []


TOOL_TEXT = ('<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", '
             '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
             '</tools> <tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call> '
             '{"temperature_c": 21, "condition": "sunny"} then done')


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, len(TOOL_TEXT)), max_size=12))
def test_tool_json_tokens_stream_exactly_and_still_commit_early(tokenizers, cuts):
    """rill-tiny's recipe makes the fixed JSON of tool schemas and calls single tokens ('", "name": "'):
    they hold spaces, yet none between a non-space and a letter, so cuts at words stay safe."""
    tokenizer = tokenizers["letter_digit"]
    assert splits_at_words(tokenizer)
    assert streamed_ids(tokenizer, "", pieces(TOOL_TEXT, cuts)) == tokenizer.encode(TOOL_TEXT, add_special_tokens=False)
    encoder = IncrementalEncoder(tokenizer, add_special_tokens=False)
    early = [i for part in pieces(TOOL_TEXT, cuts) for i in encoder.feed(part)]
    assert early and encoder.num_pending_chars <= len(" done")


HAZARD_TEXT = ('We said, "strict": true to it, then Correctly extracted `GetWeather` with all the required '
               'parameters with correct types, and so on, until done')


@given(cuts=st.lists(st.integers(0, len(HAZARD_TEXT)), max_size=12))
@settings(max_examples=60, deadline=None)
def test_added_tokens_across_words_stream_exactly_and_the_text_still_commits_early(tokenizers, cuts):
    """rill-tiny's recipe adds tokens that span words (', "strict": true', 'Correctly extracted `'):
    a cut right after the start of one waits, every other cut commits as before."""
    tokenizer = tokenizers["letter_digit"]
    assert splits_at_words(tokenizer)
    whole = tokenizer.encode(HAZARD_TEXT, add_special_tokens=False)
    assert streamed_ids(tokenizer, "", pieces(HAZARD_TEXT, cuts)) == whole
    encoder = IncrementalEncoder(tokenizer, add_special_tokens=False)
    early = [i for word in HAZARD_TEXT.split(" ") for i in encoder.feed(word + " ")]
    assert early and encoder.num_pending_chars <= len(" until done ")


@pytest.mark.parametrize("name", ["byte_fallback", "sentencepiece"])
def test_the_bos_a_tokenizer_adds_comes_once_before_the_first_ids(tokenizers, name):
    tokenizer = tokenizers[name]
    encoder = IncrementalEncoder(tokenizer, add_special_tokens=True)
    first = encoder.feed("hi there you") + encoder.flush()
    assert first == tokenizer.encode("hi there you")
    assert first[0] == tokenizer.bos_token_id and first.count(tokenizer.bos_token_id) == 1
    assert encoder.flush("again") == tokenizer.encode("again", add_special_tokens=False)


def test_after_flush_the_next_text_tokenizes_on_its_own(tokenizers):
    tokenizer = tokenizers["sentencepiece"]  # a text's first word gets a `▁` of its own
    encoder = IncrementalEncoder(tokenizer)
    first = encoder.feed("hello wor") + encoder.flush("ld")
    second = encoder.feed("again and ") + encoder.feed("again") + encoder.flush()
    assert first == tokenizer.encode("hello world", add_special_tokens=False)
    assert second == tokenizer.encode("again and again", add_special_tokens=False)


def test_each_feed_re_encodes_a_few_words_not_the_text_so_far(tokenizers, monkeypatch):
    tokenizer = tokenizers["sentencepiece"]
    text = " ".join(CORPUS[:5] * 20)  # about 5,000 characters
    prompt, streamed = text[:2500], text[2500:]  # a long prompt, then text in 7-character pieces
    lengths = spy_on_encodings(monkeypatch, tokenizer)
    ids = streamed_ids(tokenizer, prompt, pieces(streamed, list(range(0, len(streamed), 7))))
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert lengths[0] == len(prompt) and max(lengths[1:]) < 100


def test_text_without_a_cut_is_encoded_once_at_the_end(tokenizers, monkeypatch):
    tokenizer = tokenizers["byte_level"]
    lengths = spy_on_encodings(monkeypatch, tokenizer)
    encoder = IncrementalEncoder(tokenizer)
    text = CORPUS[5] * 20  # Chinese: no spaces
    assert [encoder.feed(char) for char in text] == [[]] * len(text) and lengths == []
    assert encoder.flush() == tokenizer.encode(text, add_special_tokens=False) and lengths == [len(text)]


def punctuation_bpe():
    """rill-tiny's shape with merges that make one piece tokenize differently as it grows:
    '. _' is ['.', 'Ġ_'] but '. _?' is ['.Ġ', '_?'], across the space."""
    merges = [("_", "?"), ("Ġ", "_"), (".", "Ġ")]
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({a + b: len(vocab) + n for n, (a, b) in enumerate(merges)})
    tok = backends.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(backends.Regex(r"[\p{L}\p{N}\n]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def test_a_cut_waits_for_a_letter_or_digit_to_close_the_piece_around_it(tmp_path):
    tokenizer = Tokenizer.from_dir(save_dir(tmp_path, punctuation_bpe(), qwen_config()))
    encoder = IncrementalEncoder(tokenizer)
    assert encoder.feed("a. _") == []  # the piece '. _' may still grow
    ids = encoder.feed("? b")
    assert tokenizer.convert_ids_to_tokens(ids) == ["a", ".Ġ", "_?"]
    assert ids + encoder.flush() == tokenizer.encode("a. _? b", add_special_tokens=False)
