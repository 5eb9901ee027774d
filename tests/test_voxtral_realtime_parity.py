"""rill's Voxtral Realtime runtime against transformers' VoxtralRealtimeForConditionalGeneration, token for token.

Offline: a whole clip through rill equals transformers' greedy `generate` on it (mistral-common's padding
and prompt, transformers' feature extractor), and each step's logits agree within float32 noise, so a
slip that happened to keep the greedy path would still show. Streamed: the clip fed in pieces (80-480 ms,
irregular, single samples) gives the tokens and the logits of the whole clip. Clips run past both sliding
windows of every shape; the delay is a per-stream setting, checked against transformers at a delay other
than the file's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers_server import one_torch_thread  # noqa: F401
from helpers_voxtral import FRAME, SAMPLE_RATE, hf_transcribe, make_voxtral_dir, synthetic_audio

pytest.importorskip("mistral_common")  # the voxtral-ref extra
if not hasattr(pytest.importorskip("transformers"), "VoxtralRealtimeForConditionalGeneration"):
    pytest.skip("transformers has no Voxtral Realtime (5.x needed)", allow_module_level=True)

from rill.errors import ModelLoadError  # noqa: E402
from rill.speech.kyutai.resample import resample_whole  # noqa: E402
from rill.speech.voxtral_realtime import VoxtralStream, is_voxtral_realtime_dir, load_voxtral_realtime  # noqa: E402

# The whole module runs in CI's slow step: the default run is at its 15-minute budget.
pytestmark = pytest.mark.slow

LOGIT_TOL = 1e-3
CLIP_S = 2.0
SHAPES = ("small", "wide", "deep")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("voxtral")
    return {shape: make_voxtral_dir(root / shape, shape) for shape in SHAPES}


@pytest.fixture(scope="module")
def runtimes(dirs):
    return {shape: load_voxtral_realtime(path) for shape, path in dirs.items()}


@pytest.fixture(scope="module")
def references(dirs):
    audio = synthetic_audio(CLIP_S, seed=1)
    return audio, {shape: hf_transcribe(dirs[shape], audio) for shape in SHAPES}


def transcribe(runtime, audio, pieces=None, rate=None, delay_ms=None) -> VoxtralStream:
    stream = VoxtralStream(runtime, rate, delay_ms=delay_ms, keep_logits=True)
    stream.tokens, stream.text, stream.pieces = [], "", []
    for piece in np.split(audio, np.cumsum(pieces)[:-1]) if pieces is not None else [audio]:
        delta = stream.feed(piece)
        stream.tokens += delta.token_ids
        stream.text += delta.text
        stream.pieces += delta.pieces
    delta = stream.finish()
    stream.tokens += delta.token_ids
    stream.text += delta.text
    stream.pieces += delta.pieces
    return stream


def cut(total: int, sizes: list[int]) -> list[int]:
    """Piece sizes (cycled) covering `total` samples, the last one trimmed."""
    out, i = [], 0
    while sum(out) < total:
        out.append(sizes[i % len(sizes)])
        i += 1
    out[-1] -= sum(out) - total
    return out


def worst(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("shape", SHAPES)
def test_whole_clip_matches_transformers_generate(runtimes, references, shape):
    audio, refs = references
    ref_tokens, ref_logits, prompt = refs[shape]
    ours = transcribe(runtimes[shape], audio)
    assert ours.prompt == prompt
    assert ours.tokens == ref_tokens
    assert worst(ours.logits, ref_logits) < LOGIT_TOL
    # Teeth: the path wanders over the vocabulary, it is not one token repeated.
    assert len(set(ref_tokens)) >= 8
    # Past both windows: decoder positions and encoder positions (4 a frame) outnumber their windows.
    spec = runtimes[shape].spec
    assert ours.num_positions > spec.decoder.sliding_window
    assert 4 * ours.num_positions > spec.encoder.sliding_window
    assert ours.text == runtimes[shape].tokenizer.decode(ref_tokens)
    assert len(ours.pieces) == len(ref_tokens) and "".join(ours.pieces) == ours.text  # one per token


@pytest.mark.parametrize("shape", SHAPES)
def test_streamed_pieces_equal_the_whole_clip(runtimes, references, shape):
    audio, refs = references
    whole = transcribe(runtimes[shape], audio)
    rng = np.random.default_rng(7)
    chunkings = {ms: cut(audio.size, [ms * SAMPLE_RATE // 1000]) for ms in (80, 160, 240, 480)}
    chunkings["irregular"] = cut(audio.size, [int(n) for n in rng.integers(1, 6 * FRAME, size=64)])
    chunkings["odd"] = cut(audio.size, [1, 7, 333, FRAME - 1, FRAME + 1])
    for name, pieces in chunkings.items():
        streamed = transcribe(runtimes[shape], audio, pieces)
        assert streamed.tokens == whole.tokens, name
        assert worst(streamed.logits, whole.logits) < LOGIT_TOL, name
        assert streamed.text == whole.text, name


def test_text_comes_out_while_audio_arrives(runtimes, references):
    """After the delay, each 80 ms frame fed gives one token at once, not at the end."""
    audio, _ = references
    runtime = runtimes["small"]
    stream = VoxtralStream(runtime)
    counts = [len(stream.feed(piece).token_ids) for piece in np.split(audio, audio.size // FRAME)]
    first = runtime.audio.num_delay_tokens() + 1  # frames of real audio before the first token
    # A frame's mel needs 40 samples of the next one: its token comes with the next piece.
    assert counts[:first] == [0] * first
    assert counts[first + 1 :] == [1] * (len(counts) - first - 1)


def test_delay_is_a_stream_setting_matching_transformers(dirs, runtimes, references):
    audio, _ = references
    ref_tokens, ref_logits, prompt = hf_transcribe(dirs["small"], audio, delay_ms=160)
    ours = transcribe(runtimes["small"], audio, delay_ms=160)
    assert ours.num_delay_tokens == 2 and ours.prompt == prompt
    assert ours.tokens == ref_tokens and worst(ours.logits, ref_logits) < LOGIT_TOL
    streamed = transcribe(runtimes["small"], audio, cut(audio.size, [3 * FRAME]), delay_ms=160)
    assert streamed.tokens == ref_tokens
    with pytest.raises(ValueError, match="multiple of 80"):
        VoxtralStream(runtimes["small"], delay_ms=100)


def test_other_input_rates_are_resampled_as_the_whole_clip(runtimes):
    """48 kHz audio streamed through soxr gives the tokens of the whole clip resampled at once."""
    audio48 = synthetic_audio(CLIP_S, seed=3, rate=48_000)
    whole = transcribe(runtimes["wide"], resample_whole(audio48, 48_000, SAMPLE_RATE))
    streamed = transcribe(runtimes["wide"], audio48, cut(audio48.size, [3840, 1000, 11520]), rate=48_000)
    assert streamed.tokens == whole.tokens


def test_stream_state_stays_bounded(runtimes):
    runtime = runtimes["small"]
    stream = VoxtralStream(runtime)
    piece = synthetic_audio(2.0, seed=5)
    sizes = []
    for _ in range(4):
        stream.feed(piece)
        state = (stream._mel._buffer.size, stream._frames.shape[1],
                 [kv.num_cached for kv in stream._encoder.layers], [kv.num_cached for kv in stream._decoder.layers],
                 stream._encoder.conv1.shape[2], stream._encoder.conv2.shape[2], stream._encoder.waiting.shape[1])
        sizes.append((*state, stream.num_state_bytes))
    assert stream.audio_s == 8.0
    assert sizes[1] == sizes[2] == sizes[3]
    mel, frames, enc, dec, conv1, conv2, waiting, num_bytes = sizes[-1]
    assert mel < runtime.audio.n_fft and frames == 0 and waiting < runtime.spec.downsample_factor
    assert enc == [runtime.spec.encoder.sliding_window - 1] * len(enc)
    assert dec == [runtime.spec.decoder.sliding_window - 1] * len(dec)


def test_finished_stream_refuses_audio(runtimes):
    stream = VoxtralStream(runtimes["small"])
    stream.feed(synthetic_audio(0.5))
    stream.finish()
    assert stream.finish().token_ids == []
    with pytest.raises(RuntimeError, match="finished"):
        stream.feed(np.zeros(10, np.float32))


def test_tekken_decoding_matches_mistral_common(dirs, runtimes):
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    theirs = Tekkenizer.from_file(dirs["small"] / "tekken.json")
    ours = runtimes["small"].tokenizer
    assert (ours.bos_id, ours.eos_id, ours.streaming_pad_id) == (theirs.bos_id, theirs.eos_id,
                                                                  theirs.get_special_token("[STREAMING_PAD]"))
    # Specials, ASCII bytes, merges and whole two-byte characters (mistral-common decodes the runs between
    # specials apart, so a character split by a special would differ: a model does not write one).
    rng = np.random.default_rng(0)
    words = [[i] for i in range(40)] + [[40 + b] for b in range(32, 127)] + [[i] for i in range(296, 320)]
    words += [[40 + 0xC3, 40 + 0xA9], [40 + 0xC3, 40 + 0xBC]]
    for _ in range(50):
        ids = [i for k in rng.integers(0, len(words), size=12) for i in words[k]]
        assert ours.decode(ids) == theirs.decode(ids, special_token_policy=SpecialTokenPolicy.IGNORE)
    # An incremental decoder holds a character split across ids until its last byte.
    e_acute = [40 + 0xC3, 40 + 0xA9]  # the bytes of "é" as two byte tokens
    decoder = ours.incremental_decoder()
    assert [decoder.decode(ours.pieces[i]) for i in e_acute] == ["", "é"]


def test_loading_refuses_what_it_cannot_run(tmp_path, dirs):
    assert is_voxtral_realtime_dir(dirs["small"]) and not is_voxtral_realtime_dir(tmp_path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_voxtral_realtime(tmp_path / "missing")
    broken = tmp_path / "no_tekken"
    broken.mkdir()
    for name in ("config.json", "model.safetensors", "preprocessor_config.json"):
        (broken / name).write_bytes((dirs["small"] / name).read_bytes())
    with pytest.raises(ModelLoadError, match="tekken.json not found"):
        load_voxtral_realtime(broken)
    (broken / "tekken.json").write_bytes((dirs["small"] / "tekken.json").read_bytes())
    pre = json.loads((broken / "preprocessor_config.json").read_text())
    (broken / "preprocessor_config.json").write_text(json.dumps({**pre, "hop_length": 320}))
    with pytest.raises(ModelLoadError, match="hop_length"):
        load_voxtral_realtime(broken)
    (broken / "preprocessor_config.json").write_text(json.dumps({**pre, "global_log_mel_max": None}))
    with pytest.raises(ModelLoadError, match="global_log_mel_max"):
        load_voxtral_realtime(broken)


@pytest.mark.slow
def test_different_seeds_take_different_greedy_paths_and_still_match(tmp_path):
    audio = synthetic_audio(3.0, seed=2)
    paths = []
    for seed in (3, 4):
        model_dir = make_voxtral_dir(tmp_path / f"s{seed}", "small", seed=seed)
        ref_tokens, ref_logits, _ = hf_transcribe(model_dir, audio)
        runtime = load_voxtral_realtime(model_dir)
        ours = transcribe(runtime, audio, cut(audio.size, [FRAME, 3 * FRAME, 777]))
        assert ours.tokens == ref_tokens and worst(ours.logits, ref_logits) < LOGIT_TOL
        paths.append(ref_tokens)
    assert paths[0] != paths[1]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_long_clip_streamed_at_random_sizes_matches_transformers(dirs, runtimes, shape):
    audio = synthetic_audio(8.0, seed=9)
    ref_tokens, ref_logits, _ = hf_transcribe(dirs[shape], audio)
    rng = np.random.default_rng(11)
    ours = transcribe(runtimes[shape], audio, cut(audio.size, [int(n) for n in rng.integers(1, 8 * FRAME, 200)]))
    assert ours.tokens == ref_tokens and worst(ours.logits, ref_logits) < LOGIT_TOL
