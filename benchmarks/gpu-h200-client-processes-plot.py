"""256 streaming clients against `rill serve --cuda-graphs` on one H200 (2026-11-27), from 1, 2 and 4
client processes (`rill bench serve --client-processes N`, benchmarks/gpu-run.sh 12): tokens/s and TTFT p99.

    python benchmarks/gpu-h200-client-processes-plot.py   # reads and writes bench-results/gpu-h200/run12/
"""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = Path(__file__).resolve().parents[1] / "bench-results" / "gpu-h200" / "run12"  # the results it plots
procs = [1, 2, 4]
levels = [json.loads((here / f"serve-graphs-p{n}.json").read_text())["levels"][0] for n in procs]
fig, (tput, ttft) = plt.subplots(1, 2, figsize=(10, 4))
tput.bar([str(n) for n in procs], [lv["output_tokens_per_s"] for lv in levels], color="tab:blue")
tput.axhline(12305.7, color="grey", ls="--", label="engine alone, 256 in flight (rill bench throughput)")
tput.set_xlabel("client processes")
tput.set_ylabel("output tokens/s, 256 clients")
tput.legend(loc="lower right", fontsize=8)
ttft.bar([str(n) for n in procs], [lv["ttft_p99_ms"] for lv in levels], color="tab:orange", label="p99")
ttft.bar([str(n) for n in procs], [lv["ttft_p50_ms"] for lv in levels], color="tab:green", label="p50")
ttft.set_xlabel("client processes")
ttft.set_ylabel("time to first token (ms)")
ttft.legend()
fig.suptitle("rill serve --cuda-graphs, random-qwen2-0.5b bf16, one H200: 256 streaming clients")
fig.tight_layout()
fig.savefig(here / "client-processes.png", dpi=110)
summary = [{"client_processes": n, **{k: lv[k] for k in ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
                                                           "itl_p50_ms", "itl_p99_ms")}} for n, lv in zip(procs, levels)]
(here / "client-processes.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
