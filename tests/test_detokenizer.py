"""The Detokenizer releases whole characters only, holds back possible stop strings, and adds up to decode()."""

from __future__ import annotations

import pytest
from helpers_tokenizers import byte_fallback_bpe, byte_level_bpe, llama_config, qwen_config, save_dir
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from rill.errors import ValidationError
from rill.tokenizer import Detokenizer, Tokenizer
from rill.tokenizer.detokenizer import REPLACEMENT_CHAR

TEXTS = [
    "Hello world! The answer is 42.",
    "你好，世界！今天天气很好。",
    "Emoji 😀🎉👍🏽🇫🇷 then text",
    "unseen ☃ ∑ 𝔘 ß ñ",
    "mixed 日本語 and English, café",
]


@pytest.fixture(scope="module", params=["byte_level", "byte_fallback"])
def tok(request, tmp_path_factory) -> Tokenizer:
    if request.param == "byte_level":
        path = save_dir(tmp_path_factory.mktemp("bl"), byte_level_bpe(), qwen_config())
    else:
        path = save_dir(tmp_path_factory.mktemp("bf"), byte_fallback_bpe(), llama_config())
    return Tokenizer.from_dir(path)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(save_dir(tmp_path_factory.mktemp("qwen"), byte_level_bpe(), qwen_config()))


def run(tok, ids, prompt=(), **kwargs) -> tuple[list[str], Detokenizer]:
    """Feed ids one at a time as the engine does; the last delta is flush()'s."""
    detok = Detokenizer(tok, list(prompt), **kwargs)
    deltas = [detok.add(i) for i in ids]
    return deltas + [detok.flush()], detok


def out_ids(tok, text) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# -- whole characters ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_decoded_text(tok, text):
    ids = out_ids(tok, text)
    deltas, detok = run(tok, ids)
    assert "".join(deltas) == detok.text == tok.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS[1:])
def test_no_delta_ever_holds_a_broken_character(tok, text):
    ids = out_ids(tok, text)
    cut_inside_a_character = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith(REPLACEMENT_CHAR)]
    assert cut_inside_a_character, "the text should include characters that span several tokens"
    deltas, _ = run(tok, ids)
    assert all(REPLACEMENT_CHAR not in d for d in deltas)


def test_byte_fallback_tokens_release_the_character_on_its_last_byte(tmp_path):
    tok = Tokenizer.from_dir(save_dir(tmp_path, byte_fallback_bpe(), llama_config()))
    ids = out_ids(tok, "☃")  # not in the vocabulary: ▁ then three byte tokens
    assert tok.convert_ids_to_tokens(ids)[-3:] == ["<0xE2>", "<0x98>", "<0x83>"]
    detok = Detokenizer(tok, tok.encode("Snow:"))
    assert [detok.add(i) for i in ids] == [" ", "", "", "☃"]


def test_context_from_a_prompt_cut_inside_a_character_starts_at_a_boundary(tmp_path):
    tok = Tokenizer.from_dir(save_dir(tmp_path, byte_fallback_bpe(), llama_config()))
    snowman = out_ids(tok, "☃")[1:]  # its three byte tokens, without the ▁
    prompt = out_ids(tok, "☃") + snowman  # the last five prompt ids begin inside the first snowman
    deltas, _ = run(tok, snowman, prompt)
    assert deltas == ["", "", "☃", ""]


def test_a_prompt_ending_in_ids_that_decode_to_nothing_keeps_the_next_words_space(tmp_path):
    # Hypothesis found it: the last five prompt ids began inside 😀's bytes and ended in two <unk>, so the
    # trimmed context decoded to "" and the first output word lost its leading space.
    tok = Tokenizer.from_dir(save_dir(tmp_path, byte_fallback_bpe(), llama_config()))
    unk = 0
    assert tok.convert_ids_to_tokens([unk]) == ["<unk>"]
    prompt = out_ids(tok, "😀") + [unk, unk]
    assert tok.convert_ids_to_tokens(prompt)[1:5] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    world = out_ids(tok, " world")
    assert "".join(run(tok, world, prompt)[0]) == tok.decode(prompt + world)[len(tok.decode(prompt)):] == " world"


def test_bytelevel_emoji_split_across_tokens_is_released_whole(qwen):
    ids = out_ids(qwen, "😀")
    assert len(ids) > 1
    deltas, _ = run(qwen, ids)
    assert [d for d in deltas if d] == ["😀"]


def test_first_token_keeps_the_space_it_has_after_the_prompt(tmp_path):
    tok = Tokenizer.from_dir(save_dir(tmp_path, byte_fallback_bpe(), llama_config()))
    prompt, world = tok.encode("Hello"), out_ids(tok, " world")
    assert tok.decode(world) == "world"  # decoded alone, a ▁-word loses its space
    assert "".join(run(tok, world, prompt)[0]) == " world"


def test_special_tokens_are_skipped_or_kept_as_asked(qwen):
    ids = out_ids(qwen, "Hi<|im_end|>")
    assert "".join(run(qwen, ids)[0]) == "Hi"
    assert "".join(run(qwen, ids, skip_special_tokens=False)[0]) == "Hi<|im_end|>"


def test_unknown_ids_add_no_text(qwen):
    ids = out_ids(qwen, "ok")
    assert "".join(run(qwen, [ids[0], qwen.vocab_size + 3, *ids[1:]])[0]) == "ok"


class CountingDecoder:
    """Wraps a tokenizer and records how many ids each decode call was given."""

    def __init__(self, tok):
        self.tok, self.num_ids = tok, []

    def decode(self, ids, skip_special_tokens=True):
        self.num_ids.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens)


def test_each_token_decodes_a_short_window_not_the_whole_output(qwen):
    counter = CountingDecoder(qwen)
    deltas, detok = run(counter, out_ids(qwen, "Hello world! 你好 " * 200), out_ids(qwen, "prompt"))
    assert detok.text == "Hello world! 你好 " * 200
    assert max(counter.num_ids) <= 8


# -- stop strings ---------------------------------------------------------------------------------------


def test_stop_string_split_across_tokens_is_cut_from_the_output(tok):
    ids = out_ids(tok, "The answer is 42. Done")
    deltas, detok = run(tok, ids, stop=["42."])
    assert detok.stop_reason == "42."
    assert "".join(deltas) == detok.text == "The answer is "


def test_stop_string_is_kept_when_asked(tok):
    deltas, detok = run(tok, out_ids(tok, "The answer is 42. Done"), stop=["42."], include_stop_str_in_output=True)
    assert "".join(deltas) == "The answer is 42."


def test_possible_stop_prefix_is_held_back_until_settled(qwen):
    detok = Detokenizer(qwen, [], stop=["<END>"])
    held = "".join(detok.add(i) for i in out_ids(qwen, "a<EN"))
    assert held == "a"  # "<EN" may still become "<END>"
    settled = "".join(detok.add(i) for i in out_ids(qwen, "Dless"))
    assert settled == "<ENDless"  # "<ENDl" cannot: all of it goes out
    assert detok.flush() == "" and detok.stop_reason is None


def test_held_back_prefix_is_released_by_flush(qwen):
    deltas, detok = run(qwen, out_ids(qwen, "value 4"), stop=["42."])
    assert deltas[-1] == "4"
    assert "".join(deltas) == "value 4"
    assert detok.stop_reason is None


def test_false_start_of_a_stop_string_is_released_with_what_follows(qwen):
    detok = Detokenizer(qwen, [], stop=["42."])
    text = "".join(detok.add(i) for i in out_ids(qwen, "4 then 43 and 42!"))
    assert detok.stop_reason is None
    assert text + detok.flush() == "4 then 43 and 42!"


def test_stop_string_inside_multibyte_text(tok):
    deltas, detok = run(tok, out_ids(tok, "你好，世界！今天"), stop=["世界"])
    assert detok.stop_reason == "世界"
    assert "".join(deltas) == "你好，"


def test_the_stop_string_completed_first_wins(qwen):
    _, detok = run(qwen, out_ids(qwen, "one two three"), stop=["three", "wo t", "two"])
    assert detok.stop_reason == "two"
    assert detok.text == "one "


def test_a_shorter_stop_string_wins_over_a_longer_one_starting_at_the_same_place(qwen):
    # "<" is complete before "<|>" could be, whether "<|>" arrives as one token or three.
    for ids in (out_ids(qwen, "ab<|>"), [i for c in "ab<|>" for i in out_ids(qwen, c)]):
        _, detok = run(qwen, ids, stop=["<|>", "<"])
        assert (detok.stop_reason, detok.text) == ("<", "ab")


def test_stop_string_in_the_prompt_does_not_stop(qwen):
    deltas, detok = run(qwen, out_ids(qwen, " and more"), prompt=out_ids(qwen, "STOP here"), stop=["STOP"])
    assert detok.stop_reason is None
    assert "".join(deltas) == " and more"


def test_ids_after_a_stop_add_nothing(qwen):
    detok = Detokenizer(qwen, [], stop=["!"])
    for i in out_ids(qwen, "hi! more"):
        detok.add(i)
    assert detok.stop_reason == "!"
    assert detok.add(out_ids(qwen, "x")[0]) == "" and detok.flush() == ""
    assert detok.text == "hi"


def test_a_single_stop_string_may_be_given_bare(qwen):
    _, detok = run(qwen, out_ids(qwen, "ab. cd"), stop=". ")
    assert detok.stop_reason == ". "


def test_empty_stop_string_is_rejected(qwen):
    with pytest.raises(ValidationError) as info:
        Detokenizer(qwen, [], stop=["ok", ""])
    assert info.value.param == "stop"


# -- random sequences ------------------------------------------------------------------------------------

MULTIBYTE = ["é", "你", "😀", "👍🏽", "☃", "𝔘", " 日本"]


def whole_ids(tok) -> st.SearchStrategy[list[int]]:
    """Random ids that make valid UTF-8 together: any id that decodes to whole characters (specials, unknown
    ids and plain pieces included), mixed with the several ids of multi-byte characters.

    Ids of stray bytes are left out: tokenizers' ByteFallback decoder renders a whole run of byte tokens as
    U+FFFD once any of them is invalid, rewriting bytes an incremental decoder has already released.
    """
    whole = [i for i in range(tok.vocab_size + 2) if REPLACEMENT_CHAR not in tok.decode([i], False)]
    chunk = st.one_of(
        st.sampled_from(whole).map(lambda i: [i]), st.sampled_from(MULTIBYTE).map(lambda t: out_ids(tok, t))
    )
    return st.lists(chunk, max_size=25).map(lambda chunks: [i for c in chunks for i in c])


hypothesis_settings = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@hypothesis_settings
@given(data=st.data(), skip=st.booleans())
def test_random_ids_add_up_to_decode(tok, data, skip):
    ids = data.draw(whole_ids(tok))
    deltas, detok = run(tok, ids, skip_special_tokens=skip)
    assert "".join(deltas) == detok.text == tok.decode(ids, skip_special_tokens=skip)


@hypothesis_settings
@given(data=st.data())
def test_random_ids_after_a_prompt_add_up_to_the_text_decode_adds(tok, data):
    prompt, ids = data.draw(whole_ids(tok)), data.draw(whole_ids(tok))
    before, full = tok.decode(prompt), tok.decode(prompt + ids)
    assume(full.startswith(before))
    assert "".join(run(tok, ids, prompt)[0]) == full[len(before) :]


@hypothesis_settings
@given(ids=st.lists(st.integers(min_value=0, max_value=440), max_size=40))
def test_random_bytelevel_ids_with_stray_bytes_add_up_to_decode(qwen, ids):
    deltas, _ = run(qwen, ids)  # ByteLevel decodes bad bytes lossily, one U+FFFD per bad run, so this holds
    assert "".join(deltas) == qwen.decode(ids)


@hypothesis_settings
@given(
    words=st.lists(st.sampled_from(["a", "b", "ab", " ", "你", "😀", "<", "<|", "|>", "\n"]), max_size=20),
    stop=st.lists(st.sampled_from(["ab", "b a", "你😀", "<|", "<|>", "a<", "b", "<", "\n<"]), min_size=1, max_size=3),
    include=st.booleans(),
)
def test_random_text_stops_at_the_first_stop_string(tok, words, stop, include):
    text = "".join(words)
    ids = out_ids(tok, text)
    text = tok.decode(ids)  # a ▁-tokenizer drops a leading space
    deltas, detok = run(tok, ids, stop=stop, include_stop_str_in_output=include)
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stop if s in text]
    if not hits:
        assert detok.stop_reason is None and "".join(deltas) == text
        return
    _, at, first = min(hits)  # the stop completed first
    assert detok.stop_reason == first
    assert "".join(deltas) == text[: at + len(first) if include else at]


# -- the ByteLevel fast path -----------------------------------------------------------------------------


class WindowDecoding:
    """The tokenizer with its byte table hidden, so the detokenizer decodes windows of ids."""

    def __init__(self, tok):
        self.decode = tok.decode


def test_only_plain_bytelevel_decoders_offer_byte_pieces(tok, qwen):
    assert qwen.byte_pieces() is not None and len(qwen.byte_pieces()) == qwen.vocab_size
    byte_fallback = "<0xE4>" in (t for i in range(tok.vocab_size) for t in tok.convert_ids_to_tokens([i]))
    assert (tok.byte_pieces() is None) == byte_fallback


@hypothesis_settings
@given(ids=st.lists(st.integers(min_value=0, max_value=440), max_size=40),
       prompt=st.lists(st.integers(min_value=3, max_value=300), max_size=8), skip=st.booleans())
@example(ids=[159, 0, 97, 97], prompt=[], skip=False)  # <|endoftext|> kept between a character's bytes
def test_byte_table_deltas_equal_window_decoding_deltas(qwen, ids, prompt, skip):
    fast, _ = run(qwen, ids, prompt, skip_special_tokens=skip)
    slow, _ = run(WindowDecoding(qwen), ids, prompt, skip_special_tokens=skip)
    assume(not qwen.decode(prompt).endswith(REPLACEMENT_CHAR))  # window decoding loses a character the prompt left open
    assert "".join(fast) == "".join(slow)
    # a special token kept in the text (skip False) cuts a character in two, as a whole decode does
    assert all(REPLACEMENT_CHAR not in d for d in fast) or REPLACEMENT_CHAR in qwen.decode(ids, skip)
