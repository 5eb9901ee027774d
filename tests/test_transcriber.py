"""rill.Transcriber (the offline speech API) and `rill transcribe`: every kind of audio a user may hand
over gives the SpeechCore's own transcription of the same samples. Random weights give gibberish,
so these pin equality and shapes, never words."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from helpers_server import one_torch_thread  # noqa: F401
from helpers_whisper import make_whisper_dir
from rill.errors import ModelLoadError
from rill.speech.audio import AudioError, load_audio
from rill.speech.core import SpeechCore
from rill.speech.decoding import TranscribeParams
from rill.speech.transcriber import Transcriber

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng makes the test speech (apt-get install espeak-ng)")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=True, max_source_positions=100,
                            max_target_positions=48)


@pytest.fixture(scope="module")
def wav_path(tmp_path_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng makes the test speech (apt-get install espeak-ng)")
    path = tmp_path_factory.mktemp("wav") / "question.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Reverse the word: stream"], check=True, capture_output=True,
                   timeout=60)
    return path


@pytest.fixture(scope="module")
def transcriber(speech_dir):
    return Transcriber(speech_dir)


def core_transcription(speech_dir, audio: np.ndarray, **params):
    """The SpeechCore driven directly: what every entry point must equal."""
    core = SpeechCore(str(speech_dir))
    core.add_request("direct", audio, TranscribeParams(**params))
    for _ in range(10_000):
        for delta in core.step():
            if delta.finished is not None:
                return delta.finished
    raise AssertionError("the core never finished")


@needs_espeak
def test_a_path_bytes_and_16k_arrays_equal_the_core(transcriber, speech_dir, wav_path):
    audio = load_audio(wav_path)  # 16 kHz mono float32
    expected = core_transcription(speech_dir, audio)
    int16 = np.round(audio * 32767).astype(np.int16)
    assert transcriber.transcribe(wav_path) == expected
    assert transcriber.transcribe(str(wav_path)) == expected
    assert transcriber.transcribe(wav_path.read_bytes()) == expected
    assert transcriber.transcribe(audio) == expected
    assert transcriber.transcribe(int16).token_ids == core_transcription(speech_dir, load_audio(int16)).token_ids
    assert isinstance(expected.text, str) and expected.token_ids and expected.segments
    assert expected.language in ("en", "zh", "de", "es", "ru", "ko", "fr", "ja")  # detected: multilingual model


@needs_espeak
def test_an_array_at_its_own_rate_is_resampled_like_the_file(transcriber, wav_path):
    samples, rate = sf.read(wav_path, dtype="float32")
    assert rate != 16_000  # espeak-ng writes 22050 Hz
    assert transcriber.transcribe(samples, sample_rate=rate) == transcriber.transcribe(wav_path)


@needs_espeak
def test_language_prompt_and_temperature_reach_the_core(transcriber, speech_dir, wav_path):
    audio = load_audio(wav_path)
    got = transcriber.transcribe(audio, language="de", prompt="Tokyo weather")
    assert got == core_transcription(speech_dir, audio, language="de", prompt="Tokyo weather")
    assert got.language == "de"


@needs_espeak
def test_transcribe_all_batches_and_keeps_the_order(transcriber, wav_path):
    short = load_audio(wav_path)[: 16_000]
    one, two = transcriber.transcribe_all([wav_path, short])
    assert one == transcriber.transcribe(wav_path) and two == transcriber.transcribe(short)
    assert not transcriber.core.has_work()


def test_bad_audio_and_missing_models_raise_rill_errors(transcriber, tmp_path):
    with pytest.raises(AudioError, match="empty"):
        transcriber.transcribe(b"")
    with pytest.raises(AudioError):
        transcriber.transcribe(b"\x00not audio" * 50)
    with pytest.raises(ModelLoadError):
        Transcriber(tmp_path / "nowhere")
    assert not transcriber.core.has_work()


def test_rill_exports_transcriber():
    import rill

    assert rill.Transcriber is Transcriber and "Transcriber" in rill.__all__


@needs_espeak
def test_rill_transcribe_prints_each_file_in_the_format_asked(transcriber, speech_dir, wav_path):
    expected = transcriber.transcribe(wav_path)

    def rill(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "rill", "transcribe", *args, "--model", str(speech_dir)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert rill(str(wav_path)) == expected.text + "\n"
    lines = rill(str(wav_path), str(wav_path), "--response-format", "json").splitlines()
    assert [json.loads(line)["text"] for line in lines] == [expected.text, expected.text]
    assert rill(str(wav_path), "--response-format", "srt").startswith("1\n00:00:00,000 --> ")


def test_rill_transcribe_reports_bad_audio_as_an_error(speech_dir, tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    done = subprocess.run([sys.executable, "-m", "rill", "transcribe", str(bad), "--model", str(speech_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "could not decode" in done.stderr
    done = subprocess.run([sys.executable, "-m", "rill", "transcribe", str(tmp_path / "absent.wav"), "--model",
                           str(speech_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "No such file" in done.stderr
