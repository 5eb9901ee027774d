"""The patch probe A/B of rill train-tiny-vision: two 2,000-step runs side by side on the two cores
(--probe-weight 0 against 1.0, seed 0, one thread each), their answer loss and held-out table.

    python benchmarks/tiny-vision-probe-plot.py   # reads bench-results/tiny-vision-probe/*.json, writes probe-ab.png there
"""

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = Path(__file__).resolve().parents[1] / "bench-results" / "tiny-vision-probe"  # the results it plots
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
for name, label in (("base", "answer loss only (--probe-weight 0)"), ("probe", "with the patch probe (1.0)")):
    run = json.loads((here / f"{name}-training_run.json").read_text())
    losses = run["losses_every_10_steps"]
    smooth = [statistics.mean(losses[max(0, i - 10): i + 1]) for i in range(len(losses))]
    left.plot([10 * i for i in range(len(smooth))], smooth, label=label)
    table = json.loads((here / f"{name}-eval.json").read_text())["table"]
    families = list(table)
    offset = -0.2 if name == "base" else 0.2
    right.bar([k + offset for k in range(len(families))], [100 * table[f]["accuracy"] for f in families], 0.4,
              label=label)
left.set_xlabel("step")
left.set_ylabel("answer cross-entropy (mean of 110 steps)")
left.set_yscale("log")
left.legend()
right.set_xticks(range(len(families)), families, rotation=30)
right.set_ylabel("held-out exact answers, % (40 a family)")
right.axhline(95, color="gray", linestyle=":")
right.legend(fontsize=8)
fig.suptitle("rill train-tiny-vision, 2,000 steps from scratch, seed 0, one thread each, side by side")
fig.tight_layout()
fig.savefig(here / "probe-ab.png", dpi=110)
