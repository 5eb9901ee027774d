"""Streamed text is tokenized piece by piece into exactly the ids of the whole text; the chat
prompt splits around a streamed message; input audio is validated, capped and resampled."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import tokenizers as backends
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers, trainers

from helpers_models import CHATML
from helpers_tokenizers import (
    CORPUS, QWEN_SPECIALS, SAMPLE_TEXTS, byte_fallback_bpe, byte_level_bpe, llama_config, qwen_config, save_dir,
)
from rill.tokenizer import Tokenizer
from rill.transports.realtime_audio import AudioInput, AudioLimits, decode_pcm16, resample
from rill.transports.realtime_events import RealtimeError
from rill.transports.realtime_input import IncrementalEncoder, split_prompt


def letter_digit_bpe():
    """rill-tiny's shape: every letter, digit and newline its own pre-token, byte-level BPE between."""
    tok = backends.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(backends.Regex(r"[\p{L}\p{N}\n]"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=QWEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {
        "byte_level": Tokenizer.from_dir(save_dir(root / "bl", byte_level_bpe(), qwen_config(chat_template=CHATML))),
        "byte_fallback": Tokenizer.from_dir(save_dir(root / "bf", byte_fallback_bpe(), llama_config())),
        "letter_digit": Tokenizer.from_dir(save_dir(root / "ld", letter_digit_bpe(), qwen_config())),
    }


def streamed_ids(tokenizer: Tokenizer, pieces: list[str]) -> list[int]:
    encoder = IncrementalEncoder(tokenizer)
    ids = []
    for piece in pieces:
        ids += encoder.feed(piece)
    ids += encoder.flush()
    assert encoder.num_tokens == len(ids)
    return ids


def cut(text: str, points: list[int]) -> list[str]:
    bounds = [0, *sorted(p % (len(text) + 1) for p in points), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


WORDS = st.lists(st.sampled_from(["the", "quick", "fox", " ", "  ", "\n", ",", "42", "7", "café", "你好", "😀",
                                  "<|im_end|>", "don't", "jumps", "\t", "!?"]), max_size=30).map("".join)


@pytest.mark.parametrize("name", ["byte_level", "byte_fallback", "letter_digit"])
@settings(max_examples=150, deadline=None)
@given(text=WORDS, points=st.lists(st.integers(0, 400), max_size=8))
def test_pieces_encode_to_the_ids_of_the_whole_text(tokenizers, name, text, points):
    tokenizer = tokenizers[name]
    assert streamed_ids(tokenizer, cut(text, points)) == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", ["byte_level", "letter_digit"])
def test_character_by_character_matches_on_sample_texts(tokenizers, name):
    tokenizer = tokenizers[name]
    for text in SAMPLE_TEXTS:
        assert streamed_ids(tokenizer, list(text)) == tokenizer.encode(text, add_special_tokens=False)


def test_tokens_are_released_while_text_still_arrives(tokenizers):
    encoder = IncrementalEncoder(tokenizers["byte_level"])
    released = [encoder.feed(word + " ") for word in "the quick brown fox jumps over the lazy dog".split()]
    assert sum(map(len, released[:-1])) > 0  # all but the last couple of words go out before the end
    assert encoder.flush()  # the held-back tail


def test_prompt_splits_around_the_streamed_message(tokenizers):
    tokenizer = tokenizers["byte_level"]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    split = split_prompt(tokenizer, history, None)
    whole = tokenizer.apply_chat_template([*history, {"role": "user", "content": "more"}])
    assert split.prefix + "more" + split.suffix == whole
    assert split.suffix == "<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rewrites_user_text_cannot_stream(tmp_path):
    upper = CHATML.replace("message['content']", "message['content'] | upper")
    tokenizer = Tokenizer.from_dir(save_dir(tmp_path, byte_level_bpe(), qwen_config(chat_template=upper)))
    with pytest.raises(RealtimeError) as caught:
        split_prompt(tokenizer, [], None)
    assert caught.value.code == "template_unsupported"


# -- audio ------------------------------------------------------------------------------------------------------


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode((samples * 32767).astype("<i2").tobytes()).decode()


def test_pcm16_decodes_to_floats():
    samples = np.array([0.0, 0.5, -0.5, 0.25], dtype=np.float32)
    assert np.allclose(decode_pcm16(pcm16_b64(samples), 100), samples, atol=1e-4)


@pytest.mark.parametrize("audio, code", [
    ("not base64!", "invalid_audio"),
    ("", "invalid_audio"),
    (base64.b64encode(b"\x00\x01\x02").decode(), "invalid_audio"),  # odd byte count: not PCM16
    (base64.b64encode(bytes(2 * 101)).decode(), "audio_too_large"),
])
def test_bad_audio_is_refused_with_a_code(audio, code):
    with pytest.raises(RealtimeError) as caught:
        decode_pcm16(audio, 100)
    assert caught.value.code == code and caught.value.param == "audio"


def test_24khz_is_resampled_to_16khz_keeping_speech_band_tones():
    t = np.arange(24_000) / 24_000
    tone = np.sin(2 * np.pi * 1000 * t).astype(np.float32)
    out = resample(tone, 24_000)
    assert len(out) == 16_000
    expected = np.sin(2 * np.pi * 1000 * np.arange(16_000) / 16_000)
    assert np.abs(out[100:-100] - expected[100:-100]).max() < 0.05


def test_resampling_suppresses_tones_above_the_new_nyquist():
    t = np.arange(24_000) / 24_000
    alias = np.sin(2 * np.pi * 11_000 * t).astype(np.float32)  # would fold to 5 kHz unfiltered
    assert np.abs(resample(alias, 24_000)[100:-100]).max() < 0.1


def test_a_model_without_an_audio_front_end_refuses_valid_audio_after_validating_it():
    audio = AudioInput(front_end=None, limits=AudioLimits(max_event_s=0.01))
    with pytest.raises(RealtimeError) as caught:
        audio.append(pcm16_b64(np.zeros(1000, np.float32)), 16_000)
    assert caught.value.code == "audio_too_large"  # 1000 samples > 10 ms: framing and caps first
    with pytest.raises(RealtimeError) as caught:
        audio.append(pcm16_b64(np.zeros(100, np.float32)), 16_000)
    assert caught.value.code == "audio_not_supported"
    with pytest.raises(RealtimeError) as caught:
        audio.commit()
    assert caught.value.code == "audio_not_supported"


def test_audio_past_the_connection_cap_is_refused():
    audio = AudioInput(front_end=None, limits=AudioLimits(max_connection_s=0.001))
    with pytest.raises(RealtimeError) as caught:
        audio.append(pcm16_b64(np.zeros(100, np.float32)), 24_000)
    assert caught.value.code == "audio_limit_reached"
