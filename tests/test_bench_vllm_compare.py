"""benchmarks/vllm-compare.sh's summary: `vllm bench serve` result files (the fields vLLM 0.32 writes) turned into
the issue 33 table, with the target judged per row. The inputs are written by the test, in vLLM's field names."""

from __future__ import annotations

import json

from rill.bench import vllm_compare


def result(tok_s: float, tpot: float, ttft: float = 500.0) -> dict:
    return {"output_throughput": tok_s, "median_tpot_ms": tpot, "median_ttft_ms": ttft, "completed": 64}


def test_summary_pairs_sides_per_scenario_and_round_and_judges_the_target(tmp_path):
    files = {"rill-inf-1": result(200, 300), "vllm-inf-1": result(160, 270),
             "rill-c8-1": result(150, 40), "vllm-c8-1": result(120, 52),
             "rill-c8-2": result(100, 60)}  # round 2's vLLM side never finished: no row
    for name, body in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    (tmp_path / "rill-serve.log").write_text("not a result")
    assert vllm_compare.main([str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = {(r["scenario"], r["round"]): r for r in summary["rows"]}
    assert set(rows) == {("inf", 1), ("c8", 1)}
    assert rows[("inf", 1)]["ratio"] == 1.25 and round(rows[("c8", 1)]["tpot_ratio"], 3) == round(40 / 52, 3)
    assert summary["met"] is True
    assert (tmp_path / "summary.png").stat().st_size > 0


def test_one_row_under_the_ratio_or_a_slow_tpot_at_8_in_flight_misses_the_target(tmp_path):
    for name, body in {"rill-inf-1": result(200, 300), "vllm-inf-1": result(160, 270),
                       "rill-c8-1": result(150, 45), "vllm-c8-1": result(120, 52)}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    vllm_compare.main([str(tmp_path)])
    assert json.loads((tmp_path / "summary.json").read_text())["met"] is False  # TPOT 45/52 > 0.8


def test_sides_that_counted_different_prompt_tokens_are_flagged(tmp_path, capsys):
    for name, tokens in {"rill-inf-1": 15740, "vllm-inf-1": 16384, "rill-c8-1": 16384, "vllm-c8-1": 16384}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({**result(200, 30), "total_input_tokens": tokens}))
    vllm_compare.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "request rate inf, round 1: rill counted 15740 prompt tokens, vLLM 16384" in out
    assert "8 in flight, round 1: rill counted" not in out
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert {tuple(r["prompt_tokens"]) for r in rows} == {(15740, 16384), (16384, 16384)}
