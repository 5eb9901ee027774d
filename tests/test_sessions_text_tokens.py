"""Streamed text tokenizes to exactly the ids of the whole text, however it is cut, for the
tokenizer shapes rill serves; and most of it commits before the end, so prefill can start."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_tokenizers import (
    CORPUS, byte_fallback_bpe, byte_level_bpe, llama_config, qwen_config, SAMPLE_TEXTS, save_dir,
)
from rill.sessions.text_tokens import IncrementalEncoder, splits_at_words
from rill.tokenizer import Tokenizer

CHATML_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
TEXTS = st.lists(st.sampled_from(SAMPLE_TEXTS + CORPUS), min_size=1, max_size=4).map(" ".join) | st.text(
    st.sampled_from("ab cd\n\t!?.,é你😀<|>_"), max_size=80)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "byte_level": Tokenizer.from_dir(save_dir(root / "bl", byte_level_bpe(), qwen_config())),
        "byte_fallback": Tokenizer.from_dir(save_dir(root / "bf", byte_fallback_bpe(), llama_config())),
        "rill_tiny": Tokenizer.from_dir(_rill_tiny_dir()),
    }


def _rill_tiny_dir():
    from rill.assets import __path__ as assets

    return f"{assets[0]}/rill-tiny"


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]


def streamed_ids(tokenizer, prefix: str, pieces: list[str], suffix: str, special: bool) -> list[int]:
    encoder = IncrementalEncoder(tokenizer, prefix, add_special_tokens=special)
    ids = encoder.take_initial()
    for piece in pieces:
        ids += encoder.feed(piece)
    return ids + encoder.flush(suffix)


@pytest.mark.parametrize("name", ["byte_level", "byte_fallback", "rill_tiny"])
@settings(max_examples=150, deadline=None)
@given(prefix=TEXTS, body=TEXTS, cuts=st.lists(st.integers(0, 400), max_size=12),
       suffix=st.sampled_from(["", CHATML_SUFFIX, "</s>"]), special=st.booleans())
def test_streamed_text_gives_the_ids_of_the_whole_text_for_any_chunking(tokenizers, name, prefix, body, cuts,
                                                                        suffix, special):
    tokenizer = tokenizers[name]
    ids = streamed_ids(tokenizer, prefix, split_at(body, cuts), suffix, special)
    assert ids == tokenizer.encode(prefix + body + suffix, add_special_tokens=special)


def test_word_text_commits_all_but_its_last_word_before_the_end(tokenizers):
    tokenizer = tokenizers["byte_level"]
    encoder = IncrementalEncoder(tokenizer, "<|im_start|>user\n")
    early = encoder.take_initial()
    for word in CORPUS[0].split(" "):  # "Hello world! ... the lazy dog."
        early += encoder.feed(word + " ")
    assert encoder.num_pending_chars == len(" dog. ")
    late = encoder.flush(CHATML_SUFFIX)
    assert early + late == tokenizer.encode("<|im_start|>user\n" + CORPUS[0] + " " + CHATML_SUFFIX)
    assert late == tokenizer.encode(" dog. " + CHATML_SUFFIX)


def test_a_vocabulary_with_tokens_across_words_commits_only_at_the_end(tokenizers):
    """The byte-fallback test tokenizer learned merges like 'o▁w': no early cut is safe there."""
    assert not splits_at_words(tokenizers["byte_fallback"])
    assert splits_at_words(tokenizers["byte_level"]) and splits_at_words(tokenizers["rill_tiny"])
    encoder = IncrementalEncoder(tokenizers["byte_fallback"], "")
    assert encoder.feed("hello world and more ") == [] and encoder.flush() != []


def test_the_bos_a_tokenizer_adds_comes_once_before_the_first_ids(tokenizers):
    tokenizer = tokenizers["byte_fallback"]
    encoder = IncrementalEncoder(tokenizer, "", add_special_tokens=True)
    ids = encoder.take_initial() + encoder.feed("hi there") + encoder.flush()
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
