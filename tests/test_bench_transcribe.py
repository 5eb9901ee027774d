"""`rill bench transcribe` at a tiny size on random-weight Whisper directories: every side runs on the same
espeak-ng clips and the JSON + PNG come out. No timing assertions: speed is what the benchmark reports.

faster-whisper and CTranslate2 are an optional extra (`bench-speech`, its own venv .venv-bench-fw): without
them their sides must say n/a and why; with them, a 5 s window model is n/a for faster-whisper (it pads
every window to 30 s) while CTranslate2 itself runs it, and a 30 s window model runs on both.
"""

import json
import shutil

import pytest

from helpers_whisper import make_whisper_dir
from rill.bench import main
from rill.bench.fasterwhisper import missing

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N = 3
MODES = ("batch1", "concurrent")


def run_bench(tmp_path, model_dir, *argv) -> dict:
    out = tmp_path / "transcribe.json"
    assert main(["transcribe", "--model", str(model_dir), "--n", str(N), "--concurrency", "2", "--threads", "1",
                 "--json", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress", *argv]) == 0
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    return json.loads(out.read_text())


def assert_side_ran(side: dict) -> None:
    for mode in MODES:
        run = side[mode]
        assert run["seconds"] > 0 and run["rtf"] > 0 and run["words_per_s"] > 0
        assert run["audio_seconds"] > 0 and 0 <= run["exact"] <= 1
        assert len(run["texts"]) == N
        assert 0 <= run["agree_with_rill"] <= 1


@pytest.fixture(scope="module")
def five_second_model(tmp_path_factory):
    """rill-tiny-speech's window (max_source_positions 250), multilingual so the language path runs too."""
    return make_whisper_dir(tmp_path_factory.mktemp("whisper-5s"), multilingual=True, max_source_positions=250)


def test_transcribe_bench_runs_every_side_on_the_same_clips(tmp_path, five_second_model):
    result = run_bench(tmp_path, five_second_model)
    assert result["benchmark"] == "transcribe"
    audio = result["audio"]
    assert audio["num_clips"] == N and len(audio["references"]) == N and audio["window_s"] == 5.0
    assert 0 < audio["audio_seconds"] <= N * 5.0 and audio["reference_words"] > 0
    assert result["config"]["language"] == "en" and result["target_speedup"] == 2.0
    sides = result["sides"]
    assert set(sides) == {"rill", "rill_http", "transformers", "faster_whisper", "ctranslate2"}
    for name in ("rill", "rill_http", "transformers"):
        assert_side_ran(sides[name])
    assert sides["rill"]["batch1"]["agree_with_rill"] == 1.0
    # The HTTP endpoint runs the same core: the same text for every clip.
    assert sides["rill_http"]["concurrent"]["texts"] == sides["rill"]["concurrent"]["texts"]
    for key in ("rill_vs_transformers", "rill_http_vs_transformers"):
        assert set(result["speedups"][key]) == set(MODES) and all(v > 0 for v in result["speedups"][key].values())


def test_transcribe_bench_reports_ctranslate2_sides_as_they_are(tmp_path, five_second_model):
    result = run_bench(tmp_path, five_second_model, "--skip-http", "--skip-transformers")
    sides = result["sides"]
    assert sides["rill_http"] == sides["transformers"] == {"status": "n/a", "reason": "skipped"}
    assert "rill_vs_transformers" not in result["speedups"]
    if missing() is not None:
        for name in ("faster_whisper", "ctranslate2"):
            assert sides[name]["status"] == "n/a" and "not installed" in sides[name]["reason"]
        return
    assert sides["faster_whisper"]["status"] == "n/a"
    assert "3000 mel frames" in sides["faster_whisper"]["reason"] and "500 frames" in sides["faster_whisper"]["reason"]
    assert_side_ran(sides["ctranslate2"])
    assert result["ctranslate2_conversion"]["seconds"] > 0


@pytest.mark.skipif(missing() is not None, reason="faster-whisper is not installed (extra bench-speech)")
def test_transcribe_bench_runs_faster_whisper_on_a_thirty_second_window(tmp_path):
    model = make_whisper_dir(tmp_path / "whisper-30s", multilingual=False, max_source_positions=1500)
    result = run_bench(tmp_path, model, "--skip-http", "--skip-transformers")
    for name in ("faster_whisper", "ctranslate2"):
        assert_side_ran(result["sides"][name])
    assert set(result["speedups"]["rill_vs_faster_whisper"]) == set(MODES)


def test_transcribe_bench_takes_a_dtype_for_both_in_process_sides(tmp_path, five_second_model):
    """--dtype (and --device, for a GPU) reach rill's core and transformers; bfloat16 on the CPU here."""
    result = run_bench(tmp_path, five_second_model, "--skip-http", "--skip-faster-whisper", "--dtype", "bfloat16")
    assert result["config"]["dtype"] == "bfloat16" and result["config"]["device"] == "cpu"
    for name in ("rill", "transformers"):
        assert_side_ran(result["sides"][name])
