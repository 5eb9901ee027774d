"""Issue 33: decode attention by the C kernel (kernels/cpu_attn.c) against the torch reference, two
engines in one process (same model and requests) alternating one step each; wall time at THREADS threads.

    B=64 ROUNDS=12 THP_MEM_ALLOC_ENABLE=1 .venv/bin/python benchmarks/cpu-decode-ab.py
"""
import os, time, random, statistics
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
from pathlib import Path
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.kernels import cpu_attn
from rill.sampling_params import SamplingParams
from rill.bench.common import resolve_model
MODEL = resolve_model("random-qwen2-100m")  # made on first use
B = int(os.environ.get("B", "64"))
real = cpu_attn.supports
cores = {n: EngineCore(EngineConfig(model=MODEL, dtype="float32", seed=0, max_num_seqs=64, max_num_batched_tokens=2048)) for n in ("ref", "c")}
def use(name):
    cpu_attn.supports = real if name == "c" else (lambda *a: False)
params = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
prefill = {k: 0.0 for k in cores}
for name, core in cores.items():
    use(name); rng = random.Random(0)
    for i in range(B):
        core.add_request(f"r{i}", [rng.randrange(3, 32000) for _ in range(256)], params)
    while any(s.num_computed_tokens < 256 for s in core.scheduler.running) or core.scheduler.waiting:
        t = time.perf_counter(); core.step(); prefill[name] += time.perf_counter() - t
times = {k: [] for k in cores}; tokens = {k: [] for k in cores}
for rnd in range(int(os.environ.get("ROUNDS", "20"))):
    for name, core in cores.items():
        use(name)
        t = time.perf_counter(); out = core.step(); times[name].append(time.perf_counter() - t)
        tokens[name].append(sorted((d.request_id, tuple(d.token_ids)) for d in out))
for name in cores:
    ts = times[name]
    print(f"B={B} {name:4s} prefill {prefill[name]*1000:7.0f} ms  decode min {min(ts)*1000:6.1f} p50 {statistics.median(ts)*1000:6.1f} ms")
p, q = times["ref"], times["c"]
print(f"ratio ref/c: decode p50 {statistics.median(p)/statistics.median(q):.2f}x min {min(p)/min(q):.2f}x")
same = sum(a == b for a, b in zip(tokens["ref"], tokens["c"]))
print(f"steps with identical greedy tokens: {same}/{len(tokens['ref'])}")
