"""`rill bench speak` end to end at tiny sizes: rill's Kokoro backend on the speech-out worker against the
kokoro package's KPipeline on one random-weight directory, and the default voice over the WebSocket; it
writes its JSON and PNG. Numbers from random weights and tiny sizes mean nothing; the test pins that every
measurement is there and sane in kind."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers_voice_out import needs_voice
from rill.bench import main as bench_main

pytestmark = [pytest.mark.slow, needs_voice,
              pytest.mark.skipif(importlib.util.find_spec("kokoro") is None, reason="the kokoro package is the "
                                 "other side")]


def test_bench_speak_writes_every_measurement(tmp_path):
    out = tmp_path / "speak.json"
    assert bench_main(["speak", "--levels", "1,2", "--streams", "1,2", "--kokoro-shape", "stft", "--piece-ms", "5",
                       "--threads", "1", "--json", str(out), "--cache-dir", str(tmp_path / "cache"),
                       "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    for side in ("rill", "kpipeline"):
        assert [lv["concurrent"] for lv in result[side]] == [1, 2]
        for lv in result[side]:
            assert lv["requests"] == lv["concurrent"] and lv["audio_s"] > 0 and lv["audio_s_per_s"] > 0
            assert 0 < lv["first_audio_ms"]["p50"] <= 1000 * lv["wall_s"]
    assert result["speedup_at_top"] > 0 and set(result["met"]) == {"speedup", "default_voice_first_audio"}
    streams = result["default_voice_streams"]
    assert [s["streams"] for s in streams] == [1, 2]
    assert all(s["first_audio_ms"]["n"] == s["streams"] and s["first_audio_ms"]["p50"] > 0 for s in streams)
