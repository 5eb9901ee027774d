"""Issue 33: linear layers by the C kernel (kernels/cpu_linear.c) against oneDNN's packed GEMM, two engines in
one process (same model and requests) alternating one step each; prefill and decode wall time at THREADS threads.

    B=8 ROUNDS=20 THP_MEM_ALLOC_ENABLE=1 .venv/bin/python benchmarks/cpu-linear-ab.py
"""
import os, time, random, statistics
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
from pathlib import Path
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.kernels import cpu_linear
from rill.sampling_params import SamplingParams
from rill.bench.common import resolve_model
MODEL = resolve_model("random-qwen2-100m")  # made on first use
B = int(os.environ.get("B", "8"))
real = cpu_linear.supports
cores = {}
for name in ("onednn", "c"):
    cpu_linear.supports = real if name == "c" else (lambda w: False)
    cores[name] = EngineCore(EngineConfig(model=MODEL, dtype="float32", seed=0, max_num_seqs=64, max_num_batched_tokens=2048))
cpu_linear.supports = real
params = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
for core in cores.values():
    rng = random.Random(0)
    for i in range(B):
        core.add_request(f"r{i}", [rng.randrange(3, 32000) for _ in range(256)], params)
prefill = {k: 0.0 for k in cores}
while any(any(s.num_computed_tokens < 256 for s in c.scheduler.running) or c.scheduler.waiting for c in cores.values()):
    for name, core in cores.items():
        if any(s.num_computed_tokens < 256 for s in core.scheduler.running) or core.scheduler.waiting:
            t = time.perf_counter(); core.step(); prefill[name] += time.perf_counter() - t
times = {k: [] for k in cores}; tokens = {k: [] for k in cores}
for rnd in range(int(os.environ.get("ROUNDS", "20"))):
    for name, core in cores.items():
        t = time.perf_counter(); out = core.step(); times[name].append(time.perf_counter() - t)
        tokens[name].append(sorted((d.request_id, tuple(d.token_ids)) for d in out))
for name in cores:
    ts = times[name]
    print(f"B={B} {name:6s} prefill {prefill[name]*1000:7.0f} ms  decode min {min(ts)*1000:6.1f} p50 {statistics.median(ts)*1000:6.1f} ms")
p, q = times["onednn"], times["c"]
print(f"oneDNN/C: prefill {prefill['onednn']/prefill['c']:.2f}x decode p50 {statistics.median(p)/statistics.median(q):.2f}x min {min(p)/min(q):.2f}x")
same = sum(a == b for a, b in zip(tokens["onednn"], tokens["c"]))
print(f"steps with identical greedy tokens: {same}/{len(tokens['onednn'])}")
