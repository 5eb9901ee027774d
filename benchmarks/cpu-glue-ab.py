"""Issue 33: the C glue's two parts against what they replaced, two engines in one process (same model and
requests) alternating one step each; prefill and decode wall time at THREADS threads.

OFF=glue (default): the elementwise ops in C (kernels/cpu_glue.c) against torch's (cpu_glue.supports -> False).
OFF=scratch: the layer's activations in reused buffers (cpu_glue.scratch) against fresh tensors each time.

    B=8|64 OFF=glue|scratch ROUNDS=20 THP_MEM_ALLOC_ENABLE=1 .venv/bin/python benchmarks/cpu-glue-ab.py
"""
import os, time, random, statistics
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
from pathlib import Path
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.kernels import cpu_glue
from rill.sampling_params import SamplingParams
from rill.bench.common import resolve_model
MODEL = resolve_model("random-qwen2-100m")  # made on first use
B = int(os.environ.get("B", "8"))
PROMPT = int(os.environ.get("PROMPT", "256"))
OFF = os.environ.get("OFF", "glue")
ATTR, REPLACEMENT = {"glue": ("supports", lambda *tensors: False),
                     "scratch": ("scratch", lambda name, rows, cols: torch.empty(rows, cols))}[OFF]
real = getattr(cpu_glue, ATTR)
OLD, NEW = {"glue": ("torch", "c"), "scratch": ("fresh", "scratch")}[OFF]
cores = {name: EngineCore(EngineConfig(model=MODEL, dtype="float32", seed=0, max_num_seqs=64, max_num_batched_tokens=2048))
         for name in (OLD, NEW)}
params = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
for core in cores.values():
    rng = random.Random(0)
    for i in range(B):
        core.add_request(f"r{i}", [rng.randrange(3, 32000) for _ in range(PROMPT)], params)


def step(name):
    setattr(cpu_glue, ATTR, real if name == NEW else REPLACEMENT)
    try:
        t = time.perf_counter()
        out = cores[name].step()
        return time.perf_counter() - t, out
    finally:
        setattr(cpu_glue, ATTR, real)


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
    print(f"B={B} {name:6s} prefill {sum(prefill[name])*1000:7.0f} ms ({len(prefill[name])} steps)  "
          f"decode min {min(ts)*1000:6.1f} p50 {statistics.median(ts)*1000:6.1f} ms")
p, q = times[OLD], times[NEW]
print(f"{OLD}/{NEW}: prefill {sum(prefill[OLD])/sum(prefill[NEW]):.3f}x  decode p50 "
      f"{statistics.median(p)/statistics.median(q):.3f}x  min {min(p)/min(q):.3f}x")
same = sum(a == b for a, b in zip(tokens[OLD], tokens[NEW]))
print(f"decode steps with identical greedy tokens: {same}/{len(tokens[OLD])}")
