"""Same-process A/B of EngineCore.step() at N running requests with a no-op model (rill bench scheduler's
NoOpRunner): this tree's core against another version of rill/engine/core.py (OLD=path), two cores side by
side, their steps alternating, so that the machine's drift falls on both alike.

    git show <rev>:src/rill/engine/core.py > /tmp/core_old.py
    OLD=/tmp/core_old.py N=1024 STEPS=300 python benchmarks/token-loop-ab.py
"""

import argparse
import importlib.util
import os
import statistics
import time

import torch

from rill.bench import scheduler as S
from rill.bench.common import resolve_model
from rill.engine.core import EngineCore

N, STEPS = int(os.environ.get("N", 1024)), int(os.environ.get("STEPS", 300))
spec = importlib.util.spec_from_file_location("core_old", os.environ["OLD"])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

torch.set_num_threads(1)
args = argparse.Namespace(num_seqs=N, steps=STEPS, prompt_tokens=64, model="random-small", seed=0, gc_freeze=True,
                          max_steps_ahead=4)
model = resolve_model(args.model, None, 0)
cores = {"new": EngineCore(S._config(args, model)), "old": old.EngineCore(S._config(args, model))}
for core in cores.values():
    core.runner = S.NoOpRunner(S._vocab(core))
    for rid, ids, params in S._requests(args, S._vocab(core)):
        core.add_request(rid, ids, params)
    for _ in range(S._max_tokens(args)):  # warm up: until every request decodes
        core.step()
        if all(seq.num_output_tokens > 0 for seqs in core.requests.values() for seq in seqs):
            break
S._startup_done(args)
times = {name: [] for name in cores}
for _ in range(STEPS):
    for name, core in cores.items():
        t0 = time.perf_counter()
        deltas = core.step()
        times[name].append(time.perf_counter() - t0)
        assert len(deltas) == N
p50 = {name: statistics.median(t) * 1e3 for name, t in times.items()}
print(f"{N} requests, {STEPS} alternating steps: core step p50 new {p50['new']:.3f} ms, old {p50['old']:.3f} ms "
      f"({p50['old'] / p50['new']:.2f}x)")
