"""rill's Whisper against transformers' `generate` on random-weight models of several shapes.

Greedy decoding is compared token for token over the whole decoder sequence (the special-token prompt,
the previous-text prompt, the detected language and every output id), on English-only and multilingual
token layouts, 80 and 128 mel bins and windows of 1, 2 and 3 s (max_source_positions 50, 100, 150, not
1500). Float32 logits agree within 1e-4 absolute (measured 0.0: the same operations in the same order).
"""

import pytest
import torch

from helpers_whisper import hf_features, hf_generate, hf_model, hf_prompt_ids, make_whisper_dir, synthetic_audio
from rill.errors import ModelLoadError, ValidationError
from rill.speech.decoding import TranscribeParams, decode_window, decoder_prompt, text_ids
from rill.speech.whisper import load_whisper

SHAPES = {
    # eos_like: EOS takes the place of a token these models pick now and then (see make_whisper_dir)
    "multilingual-80-2s": dict(multilingual=True, num_mel_bins=80, max_source_positions=100, eos_like=166),
    "english-128-3s": dict(multilingual=False, num_mel_bins=128, max_source_positions=150, eos_like=166),
    # wider heads, three decoder layers, never ends at EOS: every window runs to max_target_positions
    "multilingual-128-1s-deep": dict(multilingual=True, num_mel_bins=128, max_source_positions=50,
                                     max_target_positions=64, d_model=96, encoder_attention_heads=6,
                                     decoder_attention_heads=6, decoder_layers=3, seed=1),
}
AUDIO_SECONDS = [0.6, 1.4, 2.9]  # shorter than, about, and (for 1-2 s windows) longer than one window
PROMPT = "What's the weather in Tokyo today?"


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request):
    return request.param


@pytest.fixture(scope="module")
def whisper_dir(shape, tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp(shape), **SHAPES[shape])


@pytest.fixture(scope="module")
def runtime(whisper_dir):
    return load_whisper(whisper_dir)


def rill_sequence(runtime, features, params: TranscribeParams, previous=()) -> list[int]:
    out, language_id = decode_window(runtime, features, params, list(previous))
    return decoder_prompt(runtime, language_id, params.task, list(previous)) + out


def hf_sequence(runtime, features, language=None, prompt_ids=None, **kwargs) -> list[int]:
    task = "transcribe" if runtime.generation.is_multilingual else None  # rill always names the task
    return hf_generate(runtime.path, features, language=language, task=task, prompt_ids=prompt_ids, **kwargs)


def languages(runtime):
    return [None, "en", "de"] if runtime.generation.is_multilingual else [None, "en"]


@pytest.mark.parametrize("seconds", AUDIO_SECONDS)
def test_greedy_matches_transformers_token_for_token(runtime, seconds):
    features = hf_features(runtime.path, synthetic_audio(seconds, seed=int(seconds * 10)))
    for language in languages(runtime):
        hf_language = language if runtime.generation.is_multilingual else None
        ours = rill_sequence(runtime, features, TranscribeParams(language=language))
        assert ours == hf_sequence(runtime, features, hf_language), language


def test_greedy_with_a_prompt_matches_transformers(runtime):
    features = hf_features(runtime.path, synthetic_audio(1.0, seed=3))
    prompt_ids = hf_prompt_ids(runtime.path, PROMPT)
    assert prompt_ids == [runtime.generation.prev_sot_token_id, *text_ids(runtime, PROMPT)]
    for language in languages(runtime)[:2]:  # given and detected
        hf_language = language if runtime.generation.is_multilingual else None
        ours = rill_sequence(runtime, features, TranscribeParams(language=language), text_ids(runtime, PROMPT))
        assert ours == hf_sequence(runtime, features, hf_language, prompt_ids=prompt_ids), language


def test_long_prompt_keeps_its_last_half_window_of_tokens(runtime):
    """Whisper keeps the last max_target_positions // 2 - 1 tokens of the previous text."""
    long_prompt = " ".join([PROMPT] * 12)
    previous = text_ids(runtime, long_prompt)
    keep = runtime.config.max_target_positions // 2 - 1
    assert len(previous) > keep
    prompt = decoder_prompt(runtime, None, "transcribe", previous)
    assert prompt[: keep + 1] == [runtime.generation.prev_sot_token_id, *previous[-keep:]]
    features = hf_features(runtime.path, synthetic_audio(1.0, seed=4))
    ours = rill_sequence(runtime, features, TranscribeParams(language="en"), previous)
    theirs = hf_sequence(runtime, features, "en" if runtime.generation.is_multilingual else None,
                         prompt_ids=prompt[: keep + 1])
    assert ours == theirs


def test_max_new_tokens_matches_transformers(runtime):
    features = hf_features(runtime.path, synthetic_audio(1.0, seed=5))
    ours = rill_sequence(runtime, features, TranscribeParams(max_new_tokens=3))
    assert ours == hf_sequence(runtime, features, max_new_tokens=3)


def test_decoder_logits_close_to_transformers(runtime):
    features = hf_features(runtime.path, synthetic_audio(1.2, seed=6))
    ids = decoder_prompt(runtime, None, "transcribe", text_ids(runtime, PROMPT)) + list(range(40, 50))
    cache = runtime.new_cache(1)
    with torch.inference_mode():
        runtime.model.encode_into(features, cache)
        ours = runtime.model.decoder(torch.tensor([ids]), torch.zeros(1, dtype=torch.long), cache)
        theirs = hf_model(runtime.path)(input_features=features, decoder_input_ids=torch.tensor([ids])).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_some_windows_end_at_eos_before_the_limit(runtime, shape):
    """The shapes with `eos_like` pin the EOS path (the third runs every window to the limit)."""
    if "eos_like" not in SHAPES[shape]:
        pytest.skip("this shape never emits EOS")
    audios = [synthetic_audio(1.0 + 0.4 * seed, seed=seed) for seed in (0, 1)]
    lengths = [len(decode_window(runtime, hf_features(runtime.path, a), TranscribeParams())[0]) for a in audios]
    assert min(lengths) < runtime.config.max_target_positions - 6


def test_english_only_model_refuses_other_languages(tmp_path):
    d = make_whisper_dir(tmp_path, multilingual=False)
    runtime = load_whisper(d)
    features = hf_features(d, synthetic_audio(0.5))
    with pytest.raises(ValidationError) as e:
        decode_window(runtime, features, TranscribeParams(language="de"))
    assert e.value.param == "language"


def test_unknown_language_is_a_validation_error(tmp_path):
    runtime = load_whisper(make_whisper_dir(tmp_path))
    with pytest.raises(ValidationError, match="not supported by this model"):
        decode_window(runtime, hf_features(runtime.path, synthetic_audio(0.5)), TranscribeParams(language="xx"))


def test_loading_a_directory_without_generation_config_names_the_file(tmp_path):
    d = make_whisper_dir(tmp_path)
    (d / "generation_config.json").unlink()
    with pytest.raises(ModelLoadError, match="generation_config.json"):
        load_whisper(d)


def test_loading_a_decoder_only_model_is_refused(tmp_path):
    from helpers_models import make_model_dir

    with pytest.raises(ModelLoadError, match="not a Whisper model"):
        load_whisper(make_model_dir(tmp_path, "llama"))
