"""rill-tiny-speech's recipe: transcripts in rill-tiny's phrasing, held-out splits, espeak-ng clips
deterministic from the seed, the eval's normalisation, a training smoke run, the shipped model."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from rill.tiny import splits, tasks
from rill.tiny_speech import augment, dataset, evaluate, synth, transcripts, voices
from rill.tiny_speech import model as shapes
from rill.tiny_speech import tokenizer as tok
from rill.tiny_speech import train as recipe

needs_espeak = pytest.mark.skipif(not synth.espeak_available(), reason="espeak-ng is not installed (apt-get install espeak-ng)")
MAX_SAMPLES = recipe.max_speech_samples(shapes.Shape())
ASSETS = evaluate.DEFAULT_MODEL_DIR


def _utterances(split: str, n: int, seed: int = 0) -> list[transcripts.Utterance]:
    rng = random.Random(seed)
    families = transcripts.FAMILIES
    return [transcripts.make_utterance(rng, families[i % len(families)], split) for i in range(n)]


def _template_pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{[abwcz]\}", template)
    return re.compile(".+".join(map(re.escape, parts)) + r"\Z")


# -- transcripts and held-out split ----------------------------------------------------------------


def test_transcripts_are_rill_tiny_questions_word_for_word():
    about = {q for questions, _ in tasks.ABOUT for q in questions}
    for u in _utterances(splits.TRAIN, 400) + _utterances(splits.EVAL, 400):
        if u.family == "about":
            assert u.text in about
        else:
            assert any(_template_pattern(t).match(u.text) for t in tasks.PHRASINGS[u.family]), u.text


def test_transcripts_write_numbers_as_digits_and_symbols():
    arithmetic = [u for u in _utterances(splits.TRAIN, 200) if u.family in ("add", "sub")]
    number_words = re.compile(r"\b(zero|one|two|three|four|five|six|seven|eight|nine|ten|twenty|hundred)\b", re.I)
    assert arithmetic and all(len(re.findall(r"\d+", u.text)) == 2 for u in arithmetic)
    assert not any(number_words.search(u.text) for u in arithmetic)
    assert any("+" in u.text for u in arithmetic) and any("-" in u.text for u in arithmetic)


@pytest.mark.parametrize("text,spoken", [
    ("What is 347 + 58?", "What is 347 plus 58?"),
    ("347+58", "347 plus 58"),
    ("512-77", "512 minus 77"),
    ("{a} - {b} = ?".format(a=9, b=4), "9 minus 4 equals ?"),
    ('Reverse the word "stream".', "Reverse the word stream."),
    ("What time is it in America/New_York?", "What time is it in America/New York?"),
])
def test_spoken_form_says_the_symbols_espeak_would_skip(text, spoken):
    assert transcripts.spoken_form(text) == spoken


def test_training_never_names_a_held_out_pair_word_city_or_zone():
    for seed in range(3):
        assert not any(transcripts.is_held_out(u) for u in _utterances(splits.TRAIN, 2000, seed))
    lower, names = transcripts.dictionary_words()
    held = transcripts.held_out_names()
    assert not held & {w.lower() for w in (*lower, *names)}


def test_evaluation_names_only_held_out_values():
    for u in _utterances(splits.EVAL, 800):
        if u.family != "about":
            assert transcripts.is_held_out(u), u
    assert {"stream", "banana", "hello", "world"} <= transcripts.held_out_names()


def test_the_heard_vocabulary_names_only_training_values_in_rill_tiny_words_and_real_places():
    heard = _utterances(transcripts.HEARD, 800)
    assert not any(transcripts.is_held_out(u) for u in heard)
    words = {u.key[1] for u in heard if u.key[0] == "word"} | {w for u in heard if u.key[0] == "words" for w in u.key[1:]}
    assert words and words <= set(splits.train_words())
    assert {u.key[1] for u in heard if u.family == "weather"} <= set(splits.cities(splits.TRAIN))
    assert {u.key[1] for u in heard if u.family == "time"} <= set(splits.zones(splits.TRAIN))


@needs_espeak
def test_heard_clips_cycle_the_families_in_held_out_voices():
    clips = dataset.make_shard(3, transcripts.HEARD, 0, MAX_SAMPLES, size=len(transcripts.FAMILIES))
    assert clips.families == list(transcripts.FAMILIES)
    for described in clips.voices:  # "en-gb+f3 s160 p40 a120 g0"
        name, rate = described.split()[:2]
        accent, _, variant = name.partition("+")
        assert voices.is_eval_combination((accent, variant, int(rate[1:]) // voices.RATE_BAND_WPM)), described


def test_training_and_evaluation_voices_are_disjoint_voice_rate_combinations():
    rng = random.Random(0)
    train = {voices.sample_voice(rng, splits.TRAIN).combination for _ in range(3000)}
    held = {voices.sample_voice(rng, splits.EVAL).combination for _ in range(1000)}
    assert train and held and not train & held


# -- espeak-ng clips ------------------------------------------------------------------------------


@needs_espeak
def test_same_seed_gives_the_same_clips_and_audio_bytes():
    first = dataset.make_shard(7, splits.TRAIN, 0, MAX_SAMPLES, size=4)
    again = dataset.make_shard(7, splits.TRAIN, 0, MAX_SAMPLES, size=4)
    other = dataset.make_shard(8, splits.TRAIN, 0, MAX_SAMPLES, size=4)
    assert first.texts == again.texts and first.voices == again.voices
    assert first.pcm.tobytes() == again.pcm.tobytes()
    assert first.texts != other.texts


@needs_espeak
def test_clips_are_16k_speech_that_fits_the_window(tmp_path):
    clips = dataset.build(3, splits.EVAL, 8, MAX_SAMPLES, workers=1, root=tmp_path)
    assert clips.families == list(transcripts.FAMILIES)  # evaluation shards cycle the families
    for i in range(len(clips)):
        audio = clips.audio(i)
        assert 0.3 * synth.SAMPLE_RATE < len(audio) <= MAX_SAMPLES
        assert np.abs(audio).max() > 0.05
    cached = dataset.build(3, splits.EVAL, 8, MAX_SAMPLES, workers=1, root=tmp_path)
    assert cached.pcm.tobytes() == clips.pcm.tobytes() and cached.texts == clips.texts


def test_augmentation_is_a_function_of_its_generator_and_stays_in_the_window():
    audio = np.sin(np.linspace(0, 2000, 20_000)).astype(np.float32) * 0.3
    one = augment.augment(audio, np.random.default_rng([0, 5]), 24_000)
    two = augment.augment(audio, np.random.default_rng([0, 5]), 24_000)
    three = augment.augment(audio, np.random.default_rng([0, 6]), 24_000)
    assert one.dtype == np.float32 and len(one) <= 24_000 and np.abs(one).max() <= 1.0
    assert np.array_equal(one, two) and not np.array_equal(one[: len(three)], three[: len(one)])


# -- tokenizer, model shape, normalisation ---------------------------------------------------------


def test_tokenizer_puts_whisper_special_tokens_after_the_text_tokens_in_openai_order():
    tokenizer = tok.train_tokenizer(recipe.tokenizer_texts(0, 500))
    ids = tok.special_ids(tokenizer)
    assert [ids[t] for t in tok.SPECIAL_TOKENS] == list(range(ids[tok.ENDOFTEXT], ids[tok.ENDOFTEXT] + len(tok.SPECIAL_TOKENS)))
    assert ids[tok.NOTIMESTAMPS] == tokenizer.get_vocab_size() - 1
    assert ids[tok.EN] == ids[tok.STARTOFTRANSCRIPT] + 1
    assert tokenizer.decode(tokenizer.encode(" What is 347 + 58?").ids) == " What is 347 + 58?"


def test_window_settings_agree_between_features_and_encoder():
    shape = shapes.Shape()
    extractor = shapes.feature_extractor(shape)
    assert extractor.n_samples == shape.n_samples and extractor.nb_max_frames == shape.num_frames
    assert shape.max_source_positions * 2 == extractor.nb_max_frames and shape.window_s < 30


@pytest.mark.parametrize("expected,got,same", [
    ("What is 347 + 58?", "what is 347+58", True),
    ("347+58", "347 + 58.", True),
    ('Reverse the word "stream".', "reverse the word: stream", True),
    ("What's the time in Europe/Paris?", "whats the time in europe/paris", True),
    ("What is 36 + 86?", "What is 36 plus 86?", True),  # two of rill-tiny's phrasings, said alike
    ("512-77", "512 minus 77", True),
    ("What is 347 + 58?", "What is 347 - 58?", False),
    ("Reverse the word: stream", "Reverse the word: steam", False),
    ("What time is it in America/New_York?", "What time is it in America/New York?", False),
])
def test_eval_compares_lower_cased_transcripts_without_punctuation(expected, got, same):
    assert evaluate.is_correct(expected, got) is same


# -- training smoke run ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    if not synth.espeak_available():
        pytest.skip("espeak-ng is not installed")
    out = tmp_path_factory.mktemp("tiny-speech")
    argv = ["--out", str(out), "--seed", "0", "--steps", "2", "--batch-size", "4", "--train-clips", "8", "--prefix-clips", "4", "--d-model", "64",
            "--encoder-layers", "1", "--decoder-layers", "1", "--workers", "1", "--threads", "1", "--precision", "fp32",
            "--cache-dir", str(out / "cache")]
    assert recipe.main(argv) == 0
    return out


def test_two_training_steps_write_a_directory_transformers_loads_and_runs(smoke_dir):
    transformers = pytest.importorskip("transformers")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "generation_config.json", "training_run.json"):
        assert (smoke_dir / name).exists(), name
    config = json.loads((smoke_dir / "config.json").read_text())
    features = json.loads((smoke_dir / "preprocessor_config.json").read_text())
    assert config["architectures"] == ["WhisperForConditionalGeneration"]
    assert config["max_source_positions"] * 2 == features["nb_max_frames"] == features["n_samples"] // features["hop_length"]
    asr = transformers.pipeline("automatic-speech-recognition", model=str(smoke_dir))
    assert isinstance(asr(np.zeros(16_000, dtype=np.float32))["text"], str)
    tokenizer = transformers.AutoTokenizer.from_pretrained(smoke_dir)
    assert tokenizer.convert_ids_to_tokens(tokenizer.prefix_tokens) == [tok.STARTOFTRANSCRIPT, tok.NOTIMESTAMPS]


def test_eval_reports_every_family_of_the_held_out_clips(smoke_dir):
    backend = evaluate.TransformersBackend(smoke_dir)
    clips = dataset.build(1234, splits.EVAL, len(transcripts.FAMILIES), MAX_SAMPLES, workers=1, root=smoke_dir / "cache")
    report = evaluate.evaluate(backend, clips, seed=1234)
    assert [f for f, e in report["families"].items() if e["n"] == 1] == list(transcripts.FAMILIES)
    assert "| add |" in evaluate.format_table(report)


# -- the shipped model ----------------------------------------------------------------------------


# rill-tiny-speech ships under issue 18's bar of 95% per family (README: its model card). These floors sit a few
# clips under the card's figures at seed 1234, 25 a family, so that a recipe or runtime change that loses them fails.
CARD_FLOORS = {
    splits.EVAL: {"add": 0.84, "sub": 0.88, "about": 0.92},  # the card: 92%, 96%, 100%
    transcripts.HEARD: {"add": 0.76, "sub": 0.88, "weather": 0.68, "time": 0.84, "about": 0.92},  # 84, 96, 76, 92, 100
}


@pytest.mark.slow
@needs_espeak
@pytest.mark.skipif(not (ASSETS / "model.safetensors").exists(), reason="rill-tiny-speech is not in this build")
@pytest.mark.parametrize("split", list(CARD_FLOORS))
def test_shipped_model_keeps_its_model_card_figures(split, tmp_path):
    backend = evaluate.TransformersBackend(ASSETS)
    clips = dataset.build(1234, split, 25 * len(transcripts.FAMILIES), MAX_SAMPLES, root=tmp_path)
    report = evaluate.evaluate(backend, clips, seed=1234)
    got = {f: report["families"][f]["accuracy"] for f in CARD_FLOORS[split]}
    assert all(got[f] >= floor for f, floor in CARD_FLOORS[split].items()), got
