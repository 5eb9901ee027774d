"""rill's Kokoro voice (rill.tts.kokoro) against the kokoro package's KModel, on random-weight directories
laid out as the authors ship theirs (make_random_kokoro_dir): the same phonemes, voice and speed give the
same audio. The noise KModel's harmonic source draws from torch's global generator after
torch.manual_seed(s), rill draws from the utterance's own generator seeded s: the same draws.

Also: the batched decoder equals one utterance at a time, the 510-phoneme limit (at and past), KPipeline's
split of long phoneme strings, espeak-ng IPA into Kokoro's alphabet, voices, and directories that are wrong.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from rill.tts.backend import UnknownVoice, Utterance
from rill.tts.kokoro import load_kokoro_backend, make_random_kokoro_dir
from rill.tts.kokoro.config import KokoroDirError
from rill.tts.kokoro.phonemes import MAX_PHONEMES, espeak_to_kokoro, split_phonemes
from rill.tts.kokoro.vocab import to_ids

# The whole module runs in the slow step (CI runs it, bounded): about 40 s on 2 cores, and the default run is at
# its 15-minute budget.
pytestmark = pytest.mark.slow

PHONEMES = "hˈɛloʊ, wˈɜːld."  # short: the decoder's cost grows with the audio
SEED = 7


def kmodel(path):
    kokoro_model = pytest.importorskip("kokoro.model", reason="the kokoro package (extra tts-ref) is the reference")
    model = kokoro_model.KModel(repo_id="hexgrad/Kokoro-82M", config=str(path / "config.json"),
                                model=str(path / "kokoro-v1_0.pth"))
    return model.eval()


def largest_difference(backend, reference_model, phonemes: str, speed: float, voice: str = "af_alloy") -> float:
    """KModel's audio against rill's for one utterance; shapes must match exactly."""
    style = backend.style(phonemes, voice)
    torch.manual_seed(SEED)
    reference = reference_model(phonemes, style, speed).numpy()
    with torch.inference_mode():
        ids = to_ids(phonemes, backend.model.config.vocab)
        ours = backend.model.synthesize([ids], style, [speed], [SEED])[0].numpy()
    assert ours.shape == reference.shape and ours.dtype == np.float32
    assert np.abs(reference).max() > 0.01  # audio, not silence
    return float(np.abs(ours - reference).max())


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return make_random_kokoro_dir(tmp_path_factory.mktemp("kokoro") / "small", shape="small", seed=1, safetensors=True)


@pytest.fixture(scope="module")
def backend(small_dir):
    return load_kokoro_backend(small_dir, device="cpu")


@pytest.fixture(scope="module")
def reference(small_dir):
    return kmodel(small_dir)


@pytest.mark.parametrize("speed", [1.0, pytest.param(1.3, marks=pytest.mark.slow)])
def test_small_shape_equals_kmodel(backend, reference, speed):
    assert largest_difference(backend, reference, PHONEMES, speed) <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["wide", "stft"])
@pytest.mark.parametrize("speed", [1.0, 0.8])
def test_other_shapes_equal_kmodel(tmp_path, shape, speed):
    """wide: other ALBERT sizes and layers, predictor depth, kernel and durations; stft: three upsampling
    levels, another n_fft and hop, two resblock kernels."""
    path = make_random_kokoro_dir(tmp_path / shape, shape=shape, seed=2)
    backend = load_kokoro_backend(path, device="cpu")
    assert largest_difference(backend, kmodel(path), PHONEMES, speed, voice="am_echo") <= 1e-6


def test_speed_changes_the_length(backend):
    slow, fast = backend.synthesize_phonemes(["ʃˈɔːɹt."] * 2, ["af_alloy"] * 2, [0.8, 1.6])
    assert len(slow) > 1.5 * len(fast)


def test_safetensors_loads_the_same_weights(small_dir, backend, tmp_path):
    only_st = tmp_path / "st"
    shutil.copytree(small_dir, only_st, ignore=shutil.ignore_patterns("*.pth"))
    from_st = load_kokoro_backend(only_st, device="cpu").model.state_dict()
    for key, value in backend.model.state_dict().items():
        assert torch.equal(from_st[key], value), key


def test_batched_decoder_equals_one_at_a_time(backend):
    phonemes, voices, speeds = [PHONEMES, "ʃˈɔːɹt."], ["af_alloy", "bf_nova"], [1.0, 0.8]
    backend.decode_together = True  # the CUDA path, on the CPU
    try:
        batched = backend.synthesize_phonemes(phonemes, voices, speeds)
    finally:
        backend.decode_together = False
    for k, samples in enumerate(batched):
        alone = backend.synthesize_phonemes(phonemes[k : k + 1], voices[k : k + 1], speeds[k : k + 1])[0]
        assert samples.shape == alone.shape
        assert np.abs(samples - alone).max() <= 1e-5


def test_same_utterance_gives_the_same_audio(backend):
    a, b = backend.synthesize_phonemes(["ʃˈɔːɹt."] * 2, ["af_alloy"] * 2, [1.0] * 2)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32 and np.abs(a).max() <= 1.0


def test_phoneme_limit_at_and_past(backend):
    model = backend.model
    assert model.max_tokens == MAX_PHONEMES == 510
    style = torch.zeros(1, 128)
    with torch.inference_mode():
        asr, f0, energy = model.prosody([43] * 510, style, 4.0)  # ALBERT's 512 positions, all used
        assert asr.shape[-1] * 2 == f0.shape[-1] == energy.shape[-1]
        with pytest.raises(ValueError, match="at most 510"):
            model.prosody([43] * 511, style, 1.0)


def test_split_phonemes_keeps_pieces_within_the_limit():
    assert split_phonemes("a" * 510) == ["a" * 510]
    assert split_phonemes("") == []
    # past the limit with no boundary and no space: a hard cut
    assert [len(p) for p in split_phonemes("a" * 511)] == [510, 1]
    # a space when there is no punctuation
    assert split_phonemes("a" * 300 + " " + "b" * 300) == ["a" * 300, "b" * 300]


def test_split_phonemes_follows_kpipelines_waterfall():
    clause, sentence = "ɐ " * 100 + "bˌʌt, ", "ɐ " * 40 + "ɛnd. "
    # a sentence end beats a later comma; a comma beats a later space
    text = sentence + clause + "ɐ " * 200
    assert split_phonemes(text)[0] == sentence.strip()
    text = clause + "ɐ " * 250
    assert split_phonemes(text)[0] == clause.strip()
    # a closing quote or bracket stays with its sentence
    assert split_phonemes("ɐ " * 50 + "“ɛnd.” " + "ɐ " * 250)[0].endswith(".”")
    assert all(len(p) <= 100 for p in split_phonemes("ɐ, " * 200, limit=100))


def test_espeak_ipa_in_kokoros_alphabet():
    assert espeak_to_kokoro("həlˈo^ʊ wˈɜːld", "en-us") == "həlˈO wˈɜɹld"
    assert espeak_to_kokoro("tʃˈeɪndʒ mˈaɪ bˈɔɪ", "en-us") == "ʧˈAnʤ mˈI bˈY"
    assert espeak_to_kokoro("bˈʌɾɚ", "en-us") == "bˈʌTəɹ"
    assert espeak_to_kokoro("ɡˈə^ʊ", "en-gb") == "ɡˈQ"
    assert espeak_to_kokoro("ˈo^ʊla", "es") == "ˈOla"
    vocab = load_vocab()
    assert all(ch in vocab for ch in espeak_to_kokoro("ðə kwˈɪk bɹˈaʊn fˈɑːks", "en-us"))


def load_vocab():
    from rill.tts.kokoro.vocab import KOKORO_V1_VOCAB

    return KOKORO_V1_VOCAB


def test_voices_and_openai_names(backend):
    assert [v.id for v in backend.voices()] == ["af_alloy", "am_echo", "bf_nova"]
    assert [v.language for v in backend.voices()] == ["en-us", "en-us", "en-gb"]
    assert backend.resolve_voice("af_alloy") == "af_alloy" and backend.resolve_voice("nova") == "bf_nova"
    with pytest.raises(UnknownVoice, match="shimmer"):
        backend.resolve_voice("shimmer")
    assert backend.sample_rate == 24000 and backend.name == "small"
    # decoded a clause at a time (the CPU): one clause a call, so each leaves as it is made; batched: 16
    assert backend.max_batch == (16 if backend.decode_together else 1)


def test_text_goes_through_libespeak(backend):
    ps = backend.phonemize("Hello there, it costs 3.5 dollars!", "af_alloy")
    assert ps == "həlˈO ðˈɛɹ, ɪt kˈɔsts θɹˈi pYnt fˈIv dˈɑləɹz!"  # punctuation kept, 3.5 read as a number
    assert all(ch in backend.model.config.vocab for ch in ps)
    assert "(" not in backend.phonemize("Hello.", "hf_alpha")  # no language-switch flags
    assert backend.phonemize("Bonjour, le monde.", "ff_siwis").startswith("bɔ̃ʒˈuʁ,")
    out = backend.synthesize([Utterance(text="Hello there.", voice="af_alloy"),
                              Utterance(text="Bye.", voice="am_echo", speed=2.0)])
    assert [a.dtype for a in out] == [np.float32] * 2 and all(len(a) > 0 for a in out)


def test_directories_that_are_not_kokoro(small_dir, tmp_path):
    with pytest.raises(KokoroDirError, match="config.json"):
        load_kokoro_backend(tmp_path, device="cpu")
    (tmp_path / "config.json").write_bytes((small_dir / "config.json").read_bytes())
    with pytest.raises(KokoroDirError, match="no \\*.pth or \\*.safetensors"):
        load_kokoro_backend(tmp_path, device="cpu")
    torch.save({"decoder": {"module.extra.weight": torch.zeros(1)}}, tmp_path / "kokoro-v1_0.pth")
    with pytest.raises(KokoroDirError, match="unexpected.*extra"):  # and every real weight missing
        load_kokoro_backend(tmp_path, device="cpu")
    (tmp_path / "kokoro-v1_0.pth").unlink()
    (tmp_path / "kokoro-v1_0.pth").symlink_to(small_dir / "kokoro-v1_0.pth")
    with pytest.raises(KokoroDirError, match="voices"):
        load_kokoro_backend(tmp_path, device="cpu")
