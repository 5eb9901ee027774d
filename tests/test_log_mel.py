"""Whisper's log-mel front end (rill.speech.features) against transformers' WhisperFeatureExtractor.

Tolerance. Both sides compute in float32 from the same float64-built Slaney filterbank. Against the
extractor's default path (torch.stft, which transformers uses whenever torch is installed) the
measured difference is 0.0 on every signal here, so TOLERANCE = 1e-5 leaves room only for thread-count
dependent summation order. Against its NumPy path (its own framing and numpy's FFT) the measured
maximum is 4.5e-5 (a 12 s chirp; espeak-ng speech up to 3.4e-5), so NUMPY_TOLERANCE = 1e-4. For
scale: features are log10(power) / 4, so 1e-4 is 0.004 dB, and bfloat16 rounds a feature near 1 by
up to 4e-3.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from rill.errors import ModelLoadError
from rill.speech.audio import SAMPLE_RATE, load_audio
from rill.speech.features import FeatureConfig, LogMel, mel_filters

TOLERANCE = 1e-5
NUMPY_TOLERANCE = 1e-4
WINDOWS = [480_000, 128_000, 80_000]  # Whisper's 30 s, and shorter windows as rill-tiny-speech uses


def config_for(n_mels: int, n_samples: int) -> FeatureConfig:
    return FeatureConfig(feature_size=n_mels, chunk_length=n_samples // SAMPLE_RATE, n_samples=n_samples,
                         nb_max_frames=n_samples // 160)


def extractor_for(n_mels: int, n_samples: int) -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(feature_size=n_mels, chunk_length=n_samples // SAMPLE_RATE)


def reference(extractor: WhisperFeatureExtractor, audios: list[np.ndarray]) -> np.ndarray:
    return extractor(audios, sampling_rate=SAMPLE_RATE, return_tensors="np")["input_features"]


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (.ci/run installs it)")
    path = tmp_path_factory.mktemp("speech") / "question.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "What is three hundred and forty seven plus fifty eight?"],
                   check=True, timeout=60)
    return load_audio(path)  # espeak-ng writes 22050 Hz: this also runs the resampler


def synthetic_signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(18)
    t = np.arange(12 * SAMPLE_RATE) / SAMPLE_RATE
    return {
        "white_noise": (0.1 * rng.standard_normal(3 * SAMPLE_RATE)).astype(np.float32),
        "silence": np.zeros(SAMPLE_RATE, np.float32),
        "sine": (0.5 * np.sin(2 * np.pi * 440 * t[: 2 * SAMPLE_RATE])).astype(np.float32),
        "ten_samples": (0.1 * rng.standard_normal(10)).astype(np.float32),
        "one_sample": np.array([0.25], np.float32),
        # 12 s: longer than the 8 s and 5 s windows (cut), shorter than 30 s (padded).
        "chirp_12s": (0.3 * np.sin(2 * np.pi * (100 + 300 * t) * t)).astype(np.float32),
        "clipped_loud": np.clip(3 * rng.standard_normal(SAMPLE_RATE), -1, 1).astype(np.float32),
    }


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("n_samples", WINDOWS)
def test_log_mel_matches_whisper_feature_extractor(speech, n_mels, n_samples):
    signals = {"espeak_speech": speech, **synthetic_signals()}
    log_mel = LogMel(config_for(n_mels, n_samples))
    expected = reference(extractor_for(n_mels, n_samples), list(signals.values()))
    for (name, audio), want in zip(signals.items(), expected):
        got = log_mel(audio)
        assert got.shape == (n_mels, n_samples // 160) and got.dtype == torch.float32, name
        diff = float(np.abs(got.numpy() - want).max())
        assert diff <= TOLERANCE, f"{name}: max abs difference {diff:.3g}"


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_matches_the_extractors_numpy_path(speech, n_mels):
    extractor = extractor_for(n_mels, 480_000)
    log_mel = LogMel(config_for(n_mels, 480_000))
    for name, audio in {"espeak_speech": speech, **synthetic_signals()}.items():
        padded = np.pad(audio, (0, 480_000 - len(audio)))[None]
        want = extractor._np_extract_fbank_features(padded, "cpu")[0]
        diff = float(np.abs(log_mel(audio).numpy() - want).max())
        assert diff <= NUMPY_TOLERANCE, f"{name}: max abs difference {diff:.3g}"


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filterbank_equals_transformers(n_mels):
    from transformers.audio_utils import mel_filter_bank

    want = mel_filter_bank(num_frequency_bins=201, num_mel_filters=n_mels, min_frequency=0.0,
                           max_frequency=8000.0, sampling_rate=SAMPLE_RATE, norm="slaney", mel_scale="slaney")
    np.testing.assert_array_equal(mel_filters(n_mels, 400, SAMPLE_RATE), want.T)


def test_batch_matches_the_extractors_batch_and_single_calls():
    signals = list(synthetic_signals().values())
    config = config_for(80, 128_000)
    log_mel = LogMel(config)
    batch = log_mel.batch(signals)
    assert batch.shape == (len(signals), 80, 800)
    assert float(np.abs(batch.numpy() - reference(extractor_for(80, 128_000), signals)).max()) <= TOLERANCE
    for row, audio in zip(batch, signals):
        # Each clip keeps its own 80 dB floor: a loud neighbour in the batch does not lift a quiet clip's floor.
        assert float((row - log_mel(audio)).abs().max()) <= TOLERANCE


def test_silence_sits_at_the_log_floor():
    features = LogMel(FeatureConfig())(np.zeros(SAMPLE_RATE, np.float32))
    assert torch.all(features == (np.log10(1e-10) + 4) / 4)


def test_quiet_parts_are_floored_80_db_below_the_loudest():
    features = LogMel(config_for(80, 80_000))(synthetic_signals()["sine"])
    assert float(features.max() - features.min()) == pytest.approx(8.0 / 4, abs=1e-6)


def test_audio_past_the_window_is_cut_and_float64_is_accepted():
    log_mel = LogMel(config_for(80, 80_000))
    chirp = synthetic_signals()["chirp_12s"]
    torch.testing.assert_close(log_mel(chirp), log_mel(chirp[:80_000]))
    torch.testing.assert_close(log_mel(chirp.astype(np.float64)), log_mel(chirp))


def test_stereo_input_is_refused():
    with pytest.raises(ValueError, match="1-D mono"):
        LogMel(FeatureConfig())(np.zeros((100, 2), np.float32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_log_mel_on_cuda_matches_cpu():
    signals = list(synthetic_signals().values())
    cpu = LogMel(FeatureConfig(feature_size=128)).batch(signals)
    cuda = LogMel(FeatureConfig(feature_size=128), device="cuda").batch(signals)
    assert cuda.device.type == "cuda"
    assert float((cuda.cpu() - cpu).abs().max()) <= NUMPY_TOLERANCE


# --- FeatureConfig -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("n_mels", "chunk_length"), [(80, 30), (128, 30), (80, 8), (80, 5)])
def test_config_reads_what_the_extractor_saves(tmp_path, n_mels, chunk_length):
    WhisperFeatureExtractor(feature_size=n_mels, chunk_length=chunk_length).save_pretrained(tmp_path)
    config = FeatureConfig.from_dir(tmp_path)
    assert (config.feature_size, config.chunk_length) == (n_mels, chunk_length)
    assert (config.n_samples, config.nb_max_frames) == (chunk_length * SAMPLE_RATE, chunk_length * 100)


def test_config_derives_the_window_from_chunk_length_when_absent(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"feature_size": 128, "chunk_length": 10}))
    config = FeatureConfig.from_dir(tmp_path)
    assert (config.feature_size, config.n_samples, config.nb_max_frames) == (128, 160_000, 1000)


@pytest.mark.parametrize(("fields", "message"), [
    ({"chunk_length": 30, "n_samples": 80_000}, "n_samples=80000 is not chunk_length"),
    ({"chunk_length": 5, "n_samples": 80_000, "nb_max_frames": 3000}, "nb_max_frames=3000"),
    ({"sampling_rate": 8000}, "sampling_rate=8000"),
    ({"feature_size": "eighty"}, "feature_size"),
])
def test_inconsistent_config_is_a_load_error_naming_the_field(tmp_path, fields, message):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(fields))
    with pytest.raises(ModelLoadError, match=message):
        FeatureConfig.from_dir(tmp_path)


def test_missing_config_is_a_load_error_naming_the_file(tmp_path):
    with pytest.raises(ModelLoadError, match="preprocessor_config.json"):
        FeatureConfig.from_dir(tmp_path)
