"""Issue 33: a layer's activations in reused per-thread buffers (kernels/cpu_glue.scratch) against fresh tensors
each time, two engines in one process (same model and requests) alternating one step each; prefill and decode wall
time at THREADS threads, huge pages on as rill sets them. The fresh side has cpu_glue.scratch return new tensors.

    B=64 ROUNDS=20 THP_MEM_ALLOC_ENABLE=1 .venv/bin/python bench-results/cpu-scratch-ab.py
"""
import os, time, random, statistics
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
from pathlib import Path
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.kernels import cpu_glue
from rill.sampling_params import SamplingParams
MODEL = str(Path.home() / ".cache/rill/bench/random-qwen2-100m-seed0-v1")
B = int(os.environ.get("B", "64"))
PROMPT = int(os.environ.get("PROMPT", "256"))
real = cpu_glue.scratch
fresh = lambda name, rows, cols: torch.empty(rows, cols)
cores = {name: EngineCore(EngineConfig(model=MODEL, dtype="float32", seed=0, max_num_seqs=64, max_num_batched_tokens=2048))
         for name in ("fresh", "scratch")}
params = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
for core in cores.values():
    rng = random.Random(0)
    for i in range(B):
        core.add_request(f"r{i}", [rng.randrange(3, 32000) for _ in range(PROMPT)], params)


def step(name):
    cpu_glue.scratch = real if name == "scratch" else fresh
    try:
        t = time.perf_counter()
        out = cores[name].step()
        return time.perf_counter() - t, out
    finally:
        cpu_glue.scratch = real


def prefilling(core):
    return any(s.num_computed_tokens < PROMPT for s in core.scheduler.running) or core.scheduler.waiting


prefill = {k: [] for k in cores}
while any(prefilling(c) for c in cores.values()):
    for name, core in cores.items():
        if prefilling(core):
            prefill[name].append(step(name)[0])
times = {k: [] for k in cores}; tokens = {k: [] for k in cores}
for rnd in range(int(os.environ.get("ROUNDS", "20"))):
    for name in cores:
        dt, out = step(name)
        times[name].append(dt)
        tokens[name].append(sorted((d.request_id, tuple(d.token_ids)) for d in out))
for name in cores:
    ts = times[name]
    print(f"B={B} {name:8s} prefill {sum(prefill[name])*1000:7.0f} ms ({len(prefill[name])} steps)  "
          f"decode min {min(ts)*1000:6.1f} p50 {statistics.median(ts)*1000:6.1f} ms")
p, q = times["fresh"], times["scratch"]
print(f"fresh/scratch: prefill {sum(prefill['fresh'])/sum(prefill['scratch']):.3f}x  decode p50 "
      f"{statistics.median(p)/statistics.median(q):.3f}x  min {min(p)/min(q):.3f}x")
same = sum(a == b for a, b in zip(tokens["fresh"], tokens["scratch"]))
print(f"decode steps with identical greedy tokens: {same}/{len(tokens['fresh'])}")
