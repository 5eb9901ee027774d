"""`rill bench voice` end to end on random-weight models (a small LLM and a Whisper with a 5 s window):
it serves, streams espeak-ng questions over /v1/realtime, and writes its JSON and PNG. Numbers from
random weights mean nothing; the test pins that every measurement is there and sane in kind."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from helpers_models import make_model_dir
from helpers_whisper import make_whisper_dir
from rill.bench import main as bench_main

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng makes the questions")]


def test_bench_voice_writes_every_measurement(tmp_path):
    llm = make_model_dir(tmp_path / "llm", "mistral")
    speech = make_whisper_dir(tmp_path / "whisper", multilingual=False, max_source_positions=250,
                              max_target_positions=64)
    out = tmp_path / "voice.json"
    assert bench_main(["voice", "--llm", str(llm), "--speech-model", str(speech), "--n", "2", "--streams", "1,2",
                       "--max-tokens", "4", "--threads", "1", "--json", str(out), "--spoken-sessions", "1", "--voices", "espeak,kokoro", "--kokoro-shape", "small", "--cache-dir",
                       str(tmp_path / "cache"), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    first = result["first_token_ms"]
    assert first["manual_commit"] > 0 and first["baseline_transcribe_then_chat"] > 0
    assert first["server_vad"] > result["config"]["silence_ms"]  # the VAD waits for its silence first
    assert _swept(result["concurrency"], [1, 2])
    assert len(result["turns"]) == 2 and all("lags_s" in t for t in result["turns"])
    # answers spoken by each voice (the default, a random Kokoro), and the transcribe-chat-speak cascade
    assert list(result["spoken_answer"]) == ["espeak", "kokoro"]
    for spoken in result["spoken_answer"].values():
        assert [s["sessions"] for s in spoken["sessions"]] == [1] and spoken["cascade"]["n"] == 2
        assert spoken["manual_commit"]["n"] == 2 and spoken["manual_commit"]["p50"] > 0


def test_bench_voice_spoken_only_measures_the_spoken_half_alone(tmp_path):
    llm = make_model_dir(tmp_path / "llm", "mistral")
    speech = make_whisper_dir(tmp_path / "whisper", multilingual=False, max_source_positions=250,
                              max_target_positions=64)
    out = tmp_path / "spoken.json"
    assert bench_main(["voice", "--llm", str(llm), "--speech-model", str(speech), "--n", "2", "--max-tokens", "4",
                       "--threads", "1", "--json", str(out), "--spoken-only", "--spoken-sessions", "1,2",
                       "--voices", "espeak", "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert "first_token_ms" not in result and list(result["spoken_answer"]) == ["espeak"]
    spoken = result["spoken_answer"]["espeak"]
    assert [s["sessions"] for s in spoken["sessions"]] == [1, 2]
    assert all(s["unfinished"] == 0 and s["n"] >= 2 for s in spoken["sessions"])  # every answer ended in time


def test_bench_voice_compares_a_causal_model_with_the_whisper_path(tmp_path):
    """`--speech-model whisper,causal`: one block per model on the same clips, each with its figures."""
    from rill.tiny_causal import model as M
    from rill.tiny_causal.vocab import Vocab, word_pieces

    llm = make_model_dir(tmp_path / "llm", "mistral")
    whisper = make_whisper_dir(tmp_path / "whisper", multilingual=False, max_source_positions=250,
                               max_target_positions=64)
    vocab = Vocab(word_pieces(256))
    causal = M.save(tmp_path / "causal", *M.create(vocab, "test"), vocab, delay_ms=480, n_left=2)  # random weights
    out = tmp_path / "voice.json"
    assert bench_main(["voice", "--llm", str(llm), "--speech-model", f"{whisper},{causal}", "--n", "2",
                       "--streams", "1,2", "--max-tokens", "4", "--threads", "1", "--json", str(out),
                       "--spoken-sessions", "", "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["config"]["causal"] == [False, True]
    assert result["config"]["clip_bound_s"] == 5.0  # the Whisper's window bounds both models' clips
    blocks = result["models"]
    assert [b["speech_model"] for b in blocks] == [str(whisper), str(causal)]
    assert result["first_token_ms"] == blocks[0]["first_token_ms"]  # the first model's figures stay on top
    for block in blocks:
        assert 0 <= block["exact_transcripts"] <= 1 and len(block["turns"]) == 2
        # a commit always ends its turn with a final transcript, and the whole recording always transcribes
        assert block["commit_to_final_ms"]["n"] == 2 and block["whole_recording_ms"]["n"] == 2
        assert 0 < block["commit_to_final_ms"]["p50"] < 60_000 and 0 < block["whole_recording_ms"]["p50"] < 60_000
        assert math.isfinite(block["commit_vs_whole"]) and block["commit_vs_whole"] > 0
        assert _swept(block["concurrency"], [1, 2])
        for s in block["concurrency"]:
            assert s["final_after_vad_end_ms"]["n"] + s["unfinished"] == 3 * s["streams"]  # every turn counted
    assert "causal" in result["targets"] and result["spoken_answer"] is None
    assert "(causal)" in bench_summary(result)


def bench_summary(result: dict) -> str:
    from rill.bench import voice

    return voice.summary(result)


def _swept(concurrency: list[dict], counts: list[int]) -> bool:
    """The sweep ran the counts in order and stopped at the first that fell behind, if any."""
    ran = [s["streams"] for s in concurrency]
    behind = [s["keeps_up"] is False for s in concurrency]
    return ran == counts[:len(ran)] and (ran == counts or behind[-1]) and not any(behind[:-1])
