"""SpeechCore: batched decoding gives each request the tokens it gets alone, whatever joins or leaves.

The reference is `decode_window`, one request and one window at a time with batch 1 (itself held to
transformers' `generate` by test_whisper_parity.py); long audio is also checked against transformers
directly, window by window with the previous text as its prompt. Driven with no thread: step() by hand.
"""

import numpy as np
import pytest

from helpers_whisper import hf_generate, make_whisper_dir, synthetic_audio
from rill.errors import ValidationError
from rill.speech.core import SpeechCore
from rill.speech.decoding import (TranscribeParams, carry_previous, decode_window, decoder_prompt, split_windows,
                                  text_ids)

MAX_STEPS = 2_000
# With eos_like=87 this model's windows end after 1 to 44 tokens (limit 46): rows of many lengths.
AUDIO = [synthetic_audio(0.5 + 0.3 * seed, seed=seed) for seed in range(8)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("multilingual"), multilingual=True, eos_like=87)


@pytest.fixture(scope="module")
def english_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("english"), multilingual=False, eos_like=87)


@pytest.fixture(scope="module")
def core(model_dir):
    return SpeechCore(model_dir, max_batch=4)


def reference(core, audio, params=TranscribeParams()) -> list[list[int]]:
    """Each window's tokens, decoded alone."""
    runtime, previous, language, out = core.runtime, text_ids(core.runtime, params.prompt), None, []
    for window in split_windows(audio, core.features.config.n_samples):
        tokens, language = decode_window(runtime, core.features(window)[None], params, previous, language)
        out.append(tokens)
        previous = carry_previous(runtime, previous, tokens)
    return out


def run(core, requests: dict, *, join_at: dict | None = None, abort_at: dict | None = None, check=None):
    """Step until every request finished; requests in join_at are added at that step, abort_at aborts."""
    join_at, abort_at, deltas, finished = join_at or {}, abort_at or {}, {}, {}
    for request_id, (audio, params) in requests.items():
        if request_id not in join_at:
            core.add_request(request_id, audio, params)
    for step in range(MAX_STEPS):
        for request_id, at in join_at.items():
            if at == step:
                core.add_request(request_id, *requests[request_id])
        for request_id, at in abort_at.items():
            if at == step:
                core.abort(request_id)
        if not core.has_work() and step > max([*join_at.values(), 0]):
            return deltas, finished
        for delta in core.step():
            deltas.setdefault(delta.request_id, []).append(delta)
            if delta.finished is not None:
                finished[delta.request_id] = delta.finished
        if check is not None:
            check(core)
    raise AssertionError("the core did not finish")


def windows_of(transcription) -> list[list[int]]:
    return [s.token_ids for s in transcription.segments]


def test_batched_decoding_matches_one_request_at_a_time(core):
    requests = {f"r{i}": (audio, TranscribeParams()) for i, audio in enumerate(AUDIO)}
    _, finished = run(core, requests)
    assert {len(t.token_ids) for t in finished.values()} != {1}  # rows of different lengths
    for request_id, (audio, _) in requests.items():
        assert windows_of(finished[request_id]) == reference(core, audio), request_id


def test_requests_joining_mid_way_match_their_lone_decoding(core):
    requests = {f"j{i}": (audio, TranscribeParams()) for i, audio in enumerate(AUDIO[:6])}
    join_at = {"j3": 2, "j4": 5, "j5": 9}
    _, finished = run(core, requests, join_at=join_at)
    for request_id, (audio, _) in requests.items():
        assert windows_of(finished[request_id]) == reference(core, audio), request_id


def test_abort_mid_way_frees_the_row_at_once_and_the_others_still_match(core):
    requests = {f"a{i}": (audio, TranscribeParams()) for i, audio in enumerate(AUDIO[:6])}
    core.add_request("victim", AUDIO[0], TranscribeParams())  # 44 tokens: still decoding at step 3
    for _ in range(3):
        core.step()
    assert core.num_decoding == 1
    core.abort("victim")
    assert core.num_decoding == 0 and not core.has_work()
    core.abort("victim")  # idempotent
    _, finished = run(core, requests, abort_at={"a2": 1})
    assert "a2" not in finished
    for request_id, (audio, _) in requests.items():
        if request_id != "a2":
            assert windows_of(finished[request_id]) == reference(core, audio), request_id


def test_max_batch_bounds_the_rows_and_the_rest_wait(model_dir):
    core = SpeechCore(model_dir, max_batch=2)
    requests = {f"b{i}": (audio, TranscribeParams()) for i, audio in enumerate(AUDIO[:5])}
    seen = []
    _, finished = run(core, requests, check=lambda c: seen.append((c.num_decoding, c.num_waiting)))
    assert max(rows for rows, _ in seen) == 2 and max(waiting for _, waiting in seen) >= 1
    for request_id, (audio, _) in requests.items():
        assert windows_of(finished[request_id]) == reference(core, audio), request_id


def test_grouped_admission_refills_rows_in_groups_and_still_matches_lone_decoding(model_dir):
    core = SpeechCore(model_dir, max_batch=4, admit_group=3)
    requests = {f"g{i}": (audio, TranscribeParams()) for i, audio in enumerate(AUDIO)}
    seen = []
    _, finished = run(core, requests, check=lambda c: seen.append((c.num_decoding, c.num_waiting)))
    for request_id, (audio, _) in requests.items():
        assert windows_of(finished[request_id]) == reference(core, audio), request_id
    # after each step: a free row waits while more wait than are free, until 3 are free ...
    assert any(rows == 3 and waiting > 1 for rows, waiting in seen)
    assert not any(4 - rows >= 3 and waiting > 0 for rows, waiting in seen)
    # ... and when all that wait fit in the free rows, they are taken at once
    assert not any(4 - rows >= waiting > 0 for rows, waiting in seen)


def test_grouped_admission_takes_all_that_wait_when_they_fit(model_dir):
    core = SpeechCore(model_dir, max_batch=4, admit_group=4)
    core.add_request("long", AUDIO[0], TranscribeParams())  # 44 tokens: decoding throughout
    core.step()
    assert core.num_decoding == 1
    core.add_request("late", AUDIO[1], TranscribeParams())  # fewer wait than the group: admitted at once
    core.step()
    assert (core.num_decoding, core.num_waiting) == (2, 0)
    core.abort("long")
    core.abort("late")
    assert not core.has_work()


@pytest.mark.parametrize("group", [0, 5])
def test_admit_group_outside_1_to_max_batch_is_refused(model_dir, group):
    with pytest.raises(ValueError, match="admit_group"):
        SpeechCore(model_dir, max_batch=4, admit_group=group)


def test_admit_group_defaults_to_a_quarter_of_the_rows(core, model_dir):
    assert core.admit_group == 1  # max_batch 4
    assert SpeechCore(model_dir).admit_group == 4  # max_batch 16


def test_long_audio_is_transcribed_window_after_window_with_the_previous_text_as_prompt(core, model_dir):
    window_s = core.features.config.n_samples / 16_000
    audio = np.concatenate([AUDIO[3], AUDIO[7], AUDIO[5], AUDIO[0]])  # 6.5 s: four 2 s windows
    params = TranscribeParams(language="en", prompt="What is 347 plus 58?")
    deltas, finished = run(core, {"long": (audio, params)})
    result = finished["long"]
    assert [(s.id, s.start, s.end) for s in result.segments] == [
        (0, 0.0, window_s), (1, window_s, 2 * window_s), (2, 2 * window_s, 3 * window_s),
        (3, 3 * window_s, len(audio) / 16_000)]
    # transformers, window by window, each with <|startofprev|> + everything said before
    previous = text_ids(core.runtime, params.prompt)
    for segment, window in zip(result.segments, split_windows(audio, core.features.config.n_samples)):
        prompt = decoder_prompt(core.runtime, core.runtime.generation.lang_to_id["<|en|>"], "transcribe", previous)
        theirs = hf_generate(model_dir, core.features(window)[None], language="en", task="transcribe",
                             prompt_ids=prompt[: prompt.index(core.runtime.generation.decoder_start_token_id)])
        assert prompt + segment.token_ids == theirs
        previous = carry_previous(core.runtime, previous, segment.token_ids)
    assert [d.segment.id for d in deltas["long"] if d.segment is not None] == [0, 1, 2, 3]


def test_text_deltas_add_up_to_the_transcript_and_the_segments(core):
    deltas, finished = run(core, {f"t{i}": (audio, TranscribeParams()) for i, audio in enumerate(AUDIO[:4])})
    tokenizer = core.runtime.tokenizer
    for request_id, result in finished.items():
        assert "".join(d.text for d in deltas[request_id]) == result.text
        assert result.text == "".join(s.text for s in result.segments).lstrip()
        assert [t for d in deltas[request_id] for t in d.token_ids] == result.token_ids
        assert all(s.text == tokenizer.decode(s.token_ids) for s in result.segments)
        assert result.language in ("en", "zh", "de", "es", "ru", "ko", "fr", "ja")


def test_english_only_model_batches_without_language_tokens(english_dir):
    core = SpeechCore(english_dir, max_batch=3)
    requests = {f"e{i}": (audio, TranscribeParams()) for i, audio in enumerate(AUDIO[:4])}
    _, finished = run(core, requests, join_at={"e3": 4})
    for request_id, (audio, _) in requests.items():
        assert windows_of(finished[request_id]) == reference(core, audio), request_id
        assert finished[request_id].language == "en"


def test_sampled_rows_beside_greedy_rows_leave_the_greedy_ones_unchanged(core):
    hot = TranscribeParams(temperature=1.0)
    requests = {"g0": (AUDIO[0], TranscribeParams()), "hot0": (AUDIO[1], hot), "g1": (AUDIO[2], TranscribeParams()),
                "hot1": (AUDIO[3], hot)}
    _, finished = run(core, requests)
    assert windows_of(finished["g0"]) == reference(core, AUDIO[0])
    assert windows_of(finished["g1"]) == reference(core, AUDIO[2])
    assert finished["hot0"].segments and finished["hot1"].segments


def test_bad_requests_are_refused_and_leave_nothing_behind(core):
    with pytest.raises(ValidationError) as e:
        core.add_request("bad", AUDIO[0], TranscribeParams(language="xx"))
    assert e.value.param == "language"
    with pytest.raises(ValidationError):
        core.add_request("bad", np.zeros((2, 100), np.float32), TranscribeParams())
    assert not core.has_work()
    core.add_request("dup", AUDIO[0], TranscribeParams())
    with pytest.raises(ValidationError, match="already in use"):
        core.add_request("dup", AUDIO[1], TranscribeParams())
    core.abort("dup")
    assert not core.has_work()


def test_a_feature_window_that_does_not_fit_the_encoder_is_a_load_error(tmp_path):
    import json

    from rill.errors import ModelLoadError

    d = make_whisper_dir(tmp_path, max_source_positions=100)  # 2 s windows
    config = json.loads((d / "preprocessor_config.json").read_text())
    config.update(chunk_length=3, n_samples=48_000, nb_max_frames=300)
    (d / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="max_source_positions"):
        SpeechCore(d)


def test_the_next_windows_prompt_carries_text_not_special_tokens(core):
    runtime = core.runtime
    en, notimestamps = runtime.generation.lang_to_id["<|en|>"], runtime.generation.no_timestamps_token_id
    text = text_ids(runtime, "What is 347 plus 58?")
    assert carry_previous(runtime, [7], [*text, en, notimestamps]) == [7, *text]
