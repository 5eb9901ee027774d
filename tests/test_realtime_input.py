"""The chat prompt splits around a streamed message; input audio is validated, capped and
resampled. (How the streamed text tokenizes: tests/test_tokenizer_incremental.py.)"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from helpers_models import CHATML
from helpers_tokenizers import byte_level_bpe, qwen_config, save_dir
from rill.tokenizer import Tokenizer
from rill.transports.realtime.audio_input import AudioInput, AudioLimits, decode_pcm16, resample
from rill.transports.realtime.events import RealtimeError
from rill.transports.realtime.text_input import split_prompt


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = save_dir(tmp_path_factory.mktemp("tok"), byte_level_bpe(), qwen_config(chat_template=CHATML))
    return Tokenizer.from_dir(path)


def test_prompt_splits_around_the_streamed_message(tokenizer):
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
