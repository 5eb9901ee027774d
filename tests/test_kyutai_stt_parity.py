"""rill's Kyutai STT runtime against transformers' KyutaiSpeechToTextForConditionalGeneration, token for token.

Offline: a whole clip through rill equals transformers' greedy `generate` on it (with the feature
extractor's padding), and each step's logits agree within float32 noise, so a slip that happened to keep
the greedy path would still show. Streamed: the clip fed in pieces (80-480 ms, irregular, single samples)
gives the tokens of the whole clip; 16 kHz audio streamed through soxr gives the samples (and so the
tokens) of the whole clip resampled at once. Clips run well past both sliding windows of every shape.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers_kyutai import FRAME, SAMPLE_RATE, hf_transcribe, make_kyutai_dir, synthetic_audio
from rill.errors import ModelLoadError
from rill.speech.kyutai import KyutaiStream, load_kyutai
from rill.speech.kyutai.resample import StreamResampler, resample_whole

LOGIT_TOL = 1e-3
CLIP_S = 3.0


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("kyutai")
    return {shape: make_kyutai_dir(root / shape, shape) for shape in ("small", "wide", "deep")}


@pytest.fixture(scope="module")
def runtimes(dirs):
    return {shape: load_kyutai(path) for shape, path in dirs.items()}


def transcribe(runtime, audio, pieces=None, rate=None) -> KyutaiStream:
    stream = KyutaiStream(runtime, rate, keep_logits=True)
    stream.tokens = []
    for piece in np.split(audio, np.cumsum(pieces)[:-1]) if pieces is not None else [audio]:
        stream.tokens += stream.feed(piece).token_ids
    stream.tokens += stream.finish().token_ids
    return stream


def cut(total: int, sizes: list[int]) -> list[int]:
    """Piece sizes (cycled) covering `total` samples, the last one trimmed."""
    out, i = [], 0
    while sum(out) < total:
        out.append(sizes[i % len(sizes)])
        i += 1
    out[-1] -= sum(out) - total
    return out


@pytest.mark.parametrize("shape", ["small", "wide", "deep"])
def test_whole_clip_matches_transformers_generate(dirs, runtimes, shape):
    audio = synthetic_audio(CLIP_S, seed=1)
    ref_tokens, ref_logits = hf_transcribe(dirs[shape], audio)
    ours = transcribe(runtimes[shape], audio)
    assert ours.tokens == ref_tokens
    assert len(ours.logits) == len(ref_logits)
    worst = max((a - b).abs().max().item() for a, b in zip(ours.logits, ref_logits))
    assert worst < LOGIT_TOL
    # Teeth: the path wanders over the vocabulary, it is not one token repeated.
    assert len(set(ref_tokens)) >= 8
    # Past both windows: decoder steps and Mimi's 25 Hz steps outnumber their windows.
    spec = runtimes[shape].spec
    assert ours.num_steps > spec.sliding_window and 2 * ours.num_frames > spec.codec.sliding_window


def test_different_seeds_take_different_greedy_paths_and_still_match(tmp_path):
    audio = synthetic_audio(2.0, seed=2)
    paths = []
    for seed in (3, 4):
        model_dir = make_kyutai_dir(tmp_path / f"s{seed}", "small", seed=seed)
        ref_tokens, _ = hf_transcribe(model_dir, audio)
        assert transcribe(load_kyutai(model_dir), audio).tokens == ref_tokens
        paths.append(ref_tokens)
    assert paths[0] != paths[1]


@pytest.mark.parametrize("piece_ms", [80, 160, 240, 480])
def test_streamed_in_pieces_equals_whole_clip(runtimes, piece_ms):
    runtime, audio = runtimes["wide"], synthetic_audio(CLIP_S, seed=5)
    whole = transcribe(runtime, audio)
    streamed = transcribe(runtime, audio, cut(audio.size, [piece_ms * SAMPLE_RATE // 1000]))
    assert streamed.tokens == whole.tokens
    assert max((a - b).abs().max().item() for a, b in zip(streamed.logits, whole.logits)) < LOGIT_TOL


def test_streamed_in_irregular_pieces_equals_whole_clip(runtimes):
    runtime, audio = runtimes["small"], synthetic_audio(CLIP_S, seed=6)
    sizes = [1, 7, FRAME - 1, 3 * FRAME + 5, 2400, 11520, 333, FRAME, 1]
    assert transcribe(runtime, audio, cut(audio.size, sizes)).tokens == transcribe(runtime, audio).tokens


def test_16k_streamed_through_soxr_gives_the_whole_clips_samples():
    audio16 = synthetic_audio(CLIP_S, seed=7, rate=16_000)
    whole = resample_whole(audio16, 16_000, SAMPLE_RATE)
    for sizes in ([1280], [2560, 17, 3840, 7680, 1]):
        resampler = StreamResampler(16_000, SAMPLE_RATE)
        parts = [resampler.push(p, last=False) for p in np.split(audio16, np.cumsum(cut(audio16.size, sizes))[:-1])]
        streamed = np.concatenate(parts + [resampler.push(np.zeros(0, np.float32), last=True)])
        np.testing.assert_array_equal(streamed, whole)
    assert abs(whole.size - audio16.size * 3 // 2) <= 1


def test_16k_stream_matches_transformers_on_the_resampled_clip(dirs, runtimes):
    audio16 = synthetic_audio(CLIP_S, seed=8, rate=16_000)
    ref_tokens, _ = hf_transcribe(dirs["small"], resample_whole(audio16, 16_000, SAMPLE_RATE))
    streamed = transcribe(runtimes["small"], audio16, cut(audio16.size, [1280, 2560, 7680]), rate=16_000)
    assert streamed.tokens == ref_tokens


def test_text_deltas_join_to_the_decoded_transcript(runtimes):
    runtime, audio = runtimes["small"], synthetic_audio(CLIP_S, seed=9)
    stream, tokens, text = KyutaiStream(runtime), [], ""
    for piece in np.array_split(audio, 9):
        delta = stream.feed(piece)
        tokens, text = tokens + delta.token_ids, text + delta.text
    delta = stream.finish()
    tokens, text = tokens + delta.token_ids, text + delta.text
    assert text == runtime.tokenizer.decode(tokens, skip_special_tokens=True)
    assert text.strip()


def test_deltas_stay_whole_across_detokenizer_restarts(runtimes, monkeypatch):
    monkeypatch.setattr("rill.speech.kyutai.stream.DETOK_RESET_TOKENS", 8)
    runtime, audio = runtimes["small"], synthetic_audio(CLIP_S, seed=10)
    stream = KyutaiStream(runtime)
    deltas = [stream.feed(piece) for piece in np.array_split(audio, 7)] + [stream.finish()]
    tokens = sum((d.token_ids for d in deltas), [])
    assert "".join(d.text for d in deltas) == runtime.tokenizer.decode(tokens, skip_special_tokens=True)
    assert len(stream._detok.pieces) < 8  # the last restart's text only


def test_long_stream_state_stays_within_the_windows(runtimes):
    runtime = runtimes["small"]
    stream = KyutaiStream(runtime)
    for i in range(40):  # 40 x 0.5 s: many times both windows
        stream.feed(synthetic_audio(0.5, seed=i))
    spec = runtime.spec
    assert stream.num_steps == stream.num_frames + 1 == 40 * SAMPLE_RATE // 2 // FRAME + 1
    assert all(c.num_cached == spec.sliding_window - 1 for c in stream._decoder.layers)
    assert all(c.num_cached == spec.codec.sliding_window - 1 for c in stream._mimi.layers)
    assert stream._audio.size < FRAME
    assert sum(s.numel() for s in stream._mimi.conv_states) < 64 * FRAME


def test_finish_is_idempotent_and_feed_after_finish_is_refused(runtimes):
    stream = KyutaiStream(runtimes["small"])
    stream.feed(synthetic_audio(0.3))
    assert stream.finish().token_ids
    assert stream.finish().token_ids == []
    with pytest.raises(RuntimeError):
        stream.feed(np.zeros(10, np.float32))


def test_a_stream_with_no_audio_matches_transformers_on_one_sample(dirs, runtimes):
    # The feature extractor pads even an (almost) empty clip with a second of silence.
    ref_tokens, _ = hf_transcribe(dirs["small"], np.zeros(1, np.float32))
    assert transcribe(runtimes["small"], np.zeros(1, np.float32)).tokens == ref_tokens


def test_bad_directories_are_refused_by_name(dirs, tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_kyutai(tmp_path / "nope")
    bad = tmp_path / "bad"
    bad.mkdir()
    config = json.loads((dirs["small"] / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "whisper"}))
    with pytest.raises(ModelLoadError, match="model_type"):
        load_kyutai(bad)
    (bad / "config.json").write_text(json.dumps({**config, "hidden_size": 40, "head_dim": 10}))
    (bad / "model.safetensors").symlink_to(dirs["small"] / "model.safetensors")
    with pytest.raises(ModelLoadError, match="shape mismatch"):
        load_kyutai(bad)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["small", "deep"])
def test_long_clip_streamed_at_random_sizes_matches_transformers(dirs, runtimes, shape):
    audio = synthetic_audio(12.0, seed=11)
    ref_tokens, ref_logits = hf_transcribe(dirs[shape], audio)
    sizes = np.random.default_rng(12).integers(1, 6 * FRAME, size=64).tolist()
    streamed = transcribe(runtimes[shape], audio, cut(audio.size, sizes))
    assert streamed.tokens == ref_tokens
    assert max((a - b).abs().max().item() for a, b in zip(streamed.logits, ref_logits)) < LOGIT_TOL
    assert torch.equal(torch.tensor(streamed.tokens), torch.tensor(ref_tokens))
