"""`rill bench turn-detection`'s parts without a server: a cut question holds its pause between two words
(espeak-ng), and the summary counts false commits, latency and pause commits per side."""

from __future__ import annotations

import random
from argparse import Namespace
from pathlib import Path

import numpy as np

from helpers_voice import needs_espeak
from rill.bench import turn_detection as bench
from rill.bench.speech_set import Clip

RATE = 16_000


@needs_espeak
def test_a_cut_question_holds_its_pause_between_two_words():
    from rill.tiny_speech.synth import synthesize
    from rill.tiny_speech.voices import Voice

    voice = Voice("en-us", "", 160, 50, 100, 0)
    audio = synthesize("What is 12 plus 30?", voice)
    clip = Clip(Path("unused.wav"), "What is 12 + 30?", audio)
    case = bench.cut_case(0, clip, voice.args(), random.Random(3), pause_s=1.0)
    assert case.cut and 1 <= len(case.heard_first.split()) < 5 and case.text == clip.text
    assert len(case.audio) == len(audio) + RATE
    assert abs(case.speech_end_s - (bench.sound_end_s(audio) + 1.0)) < 0.01
    loud = np.abs(case.audio) > bench.LOUD
    gaps = np.diff(np.flatnonzero(loud))
    assert gaps.max() >= RATE  # the whole pause is silent, and speech comes on both sides of it


def run(mode: str, cut: bool, commits: list[float]) -> dict:
    after = [c for c in commits if c >= 0]
    return {"index": 0, "cut": cut, "mode": mode, "text": "", "first_words": "", "commits_s": commits,
            "false_commits": sum(c < 0 for c in commits), "commit_s": after[0] if after else None, "transcripts": []}


def test_result_counts_false_commits_latency_and_commits_at_a_pause():
    runs = [run("server_vad", False, [0.6]), run("server_vad", True, [-1.2, 0.65]),
            run("semantic_vad", False, [0.3]), run("semantic_vad", True, [4.1])]
    args = Namespace(llm="rill-tiny", speech_model="rill-tiny-speech", pause_s=1.0, silence_ms=500, eagerness="auto",
                     streams=4)
    cases = [bench.Case(0, False, "a b", "a b", np.zeros(1), 0.5), bench.Case(0, True, "a b", "a", np.zeros(1), 1.5)]
    result = bench.result(runs, cases, [0.9, 0.01], args)
    assert result["server_vad"]["false_commits"] == 1 and result["server_vad"]["cut"]["runs_with_false_commit"] == 1
    assert result["semantic_vad"]["false_commits"] == 0
    assert result["server_vad"]["end_to_commit_ms"]["p50"] == 600.0
    assert result["semantic_vad"]["end_to_commit_ms"]["p50"] == 300.0
    assert result["semantic_at_a_pause"] == {"share": 0.5, "end_to_commit_ms": {"n": 1, "p50": 300.0, "p95": 300.0}}
    assert result["semantic_over_server_p50"] == 0.5
    assert result["targets"]["false_commits_met"] and result["targets"]["p50_met"]
    assert result["end_of_turn_probability"]["complete"][50] == 0.9
    assert "semantic_vad auto" in bench.summary(result)
