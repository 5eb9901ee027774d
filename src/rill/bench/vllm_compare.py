"""The table of benchmarks/vllm-compare.sh: `vllm bench serve` results for rill and vLLM, per scenario
and round, as JSON and a PNG (rill / vLLM output tokens per second and TPOT p50, round by round).

    python -m rill.bench.vllm_compare DIR     # reads DIR/{rill,vllm}-{inf,c8}-{round}.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from rill.bench.common import save_plot

SCENARIOS = {"inf": "request rate inf", "c8": "8 in flight"}
TARGET = 1.25  # issue 33: rill's output tok/s at least 1.25x vLLM's in both scenarios
TPOT_TARGET = 0.8  # and TPOT p50 at 8 in flight at most 0.8x vLLM's
# per dtype (DIR/setup.json, written by the script): {scenario: output tok/s ratio}, TPOT p50 ratio at 8 in flight
TARGETS = {"float32": ({"inf": TARGET, "c8": TARGET}, TPOT_TARGET),
           "bfloat16": ({"inf": 1.25, "c8": 1.5}, 0.7)}  # issue 53


def load(directory: Path) -> list[dict]:
    """One row per (scenario, round) that both sides finished."""
    runs: dict[tuple[str, int], dict[str, dict]] = {}
    for path in sorted(directory.glob("*-*-*.json")):
        m = re.fullmatch(r"(rill|vllm)-(inf|c8)-(\d+)\.json", path.name)
        if m:
            runs.setdefault((m[2], int(m[3])), {})[m[1]] = json.loads(path.read_text())
    rows = []
    for (scenario, rnd), sides in sorted(runs.items()):
        if {"rill", "vllm"} <= sides.keys():
            r, v = sides["rill"], sides["vllm"]
            rows.append({
                "scenario": scenario, "round": rnd,
                "rill_tok_s": r["output_throughput"], "vllm_tok_s": v["output_throughput"],
                "ratio": r["output_throughput"] / v["output_throughput"],
                "rill_tpot_p50_ms": r["median_tpot_ms"], "vllm_tpot_p50_ms": v["median_tpot_ms"],
                "tpot_ratio": r["median_tpot_ms"] / v["median_tpot_ms"],
                "rill_ttft_p50_ms": r["median_ttft_ms"], "vllm_ttft_p50_ms": v["median_ttft_ms"],
                "completed": [r["completed"], v["completed"]],
                # what each server counted: the same prompts' text, tokenized by each side
                "prompt_tokens": [r.get("total_input_tokens"), v.get("total_input_tokens")],
            })
    return rows


def tokenizer_warnings(rows: list[dict]) -> list[str]:
    """A line per row whose sides counted more than 1% apart in prompt tokens: the client sends text, so the
    two servers' tokenizers disagree and the sides did not prefill the same work."""
    out = []
    for row in rows:
        r, v = row.get("prompt_tokens") or (None, None)
        if r and v and abs(r - v) > 0.01 * v:
            out.append(f"warning: {SCENARIOS[row['scenario']]}, round {row['round']}: rill counted {r} prompt tokens, "
                       f"vLLM {v}: their tokenizers disagree, so the sides did not prefill the same work")
    return out


SHORT = {"c8": "8 in flight", "inf": "rate inf"}


def table(rows: list[dict]) -> str:
    lines = ["| scenario, round | rill out tok/s | vLLM out tok/s | rill/vLLM | TPOT p50 rill / vLLM ms | TTFT p50 rill / vLLM ms |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {SCENARIOS[row['scenario']]}, {row['round']} | {row['rill_tok_s']:.1f} | {row['vllm_tok_s']:.1f} | "
                     f"{row['ratio']:.2f}x | {row['rill_tpot_p50_ms']:.0f} / {row['vllm_tpot_p50_ms']:.0f} | "
                     f"{row['rill_ttft_p50_ms']:.0f} / {row['vllm_ttft_p50_ms']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, dtype: str = "float32", targets: dict | None = None) -> Path | None:
    def draw(axes):
        labels = [f"{SHORT[r['scenario']]}\nround {r['round']}" for r in rows]
        xs = range(len(rows))
        axes[0].bar([x - 0.2 for x in xs], [r["rill_tok_s"] for r in rows], 0.4, label="rill")
        axes[0].bar([x + 0.2 for x in xs], [r["vllm_tok_s"] for r in rows], 0.4, label="vLLM")
        for x, r in zip(xs, rows):  # the ratio over each pair
            axes[0].annotate(f"{r['ratio']:.2f}x", (x, max(r["rill_tok_s"], r["vllm_tok_s"])), ha="center",
                             va="bottom", fontsize=8)
        axes[0].set_xticks(list(xs), labels, fontsize=8)
        axes[0].set_ylabel("output tokens/s (vllm bench serve)")
        axes[0].set_ylim(0, 1.15 * max(max(r["rill_tok_s"], r["vllm_tok_s"]) for r in rows))
        axes[0].legend(loc="lower right")

    wanted = ", ".join(f"{s} {t}x" for s, t in (targets or {"both": TARGET}).items())
    return save_plot(path, draw, title=f"rill vs vLLM CPU, random-qwen2-100m, {dtype}\n(target rill/vLLM: {wanted})")


def main(argv: list[str] | None = None) -> int:
    directory = Path((argv or sys.argv[1:])[0])
    rows = load(directory)
    setup_path = directory / "setup.json"
    setup = json.loads(setup_path.read_text()) if setup_path.is_file() else {"dtype": "float32"}
    targets, tpot_target = TARGETS[setup["dtype"]]
    result = {"setup": setup, "rows": rows, "target_ratio": targets, "tpot_target": tpot_target,
              "met": bool(rows) and all(r["ratio"] >= targets[r["scenario"]] for r in rows)
              and all(r["tpot_ratio"] <= tpot_target for r in rows if r["scenario"] == "c8")}
    (directory / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    for warning in tokenizer_warnings(rows):
        print(warning)
    wanted = ", ".join(f"{SCENARIOS[s]} >= {t}x" for s, t in targets.items())
    print(f"{setup['dtype']}: target ({wanted}, TPOT p50 at 8 in flight <= {tpot_target}x): "
          f"{'met' if result['met'] else 'not met'}")
    plot(rows, directory / "summary.png", setup["dtype"], targets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
