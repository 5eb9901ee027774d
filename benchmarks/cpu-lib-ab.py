"""Issue 33: rill's C kernels (kernels/*.c) as built now against an earlier build of the library,
two engines in one process (same model and requests) alternating one step each, each step run with its
engine's library; wall time at THREADS threads. OLD is the earlier library (.so), e.g. a copy of the one
~/.cache/rill/kernels held before the source changed; NEW another .so instead of the one built from the source.
The engine made first decodes about 5% slower than the other in an A/A run (the same library both sides) and
prefills about 4% faster: run each comparison both ways (NEW and OLD swapped) and take the geometric mean.

    OLD=/tmp/old_cpu.so B=64 ROUNDS=20 THP_MEM_ALLOC_ENABLE=1 .venv/bin/python benchmarks/cpu-lib-ab.py
"""
import ctypes, os, random, statistics, time
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "2")))
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.kernels import cpu_build

from rill.bench.common import resolve_model
MODEL = resolve_model("random-qwen2-100m")  # made on first use
B, PROMPT = int(os.environ.get("B", "64")), int(os.environ.get("PROMPT", "256"))
libs = {"new": ctypes.CDLL(os.environ["NEW"]) if os.environ.get("NEW") else cpu_build.library(),
        "old": ctypes.CDLL(os.environ["OLD"])}
for lib in libs.values():
    cpu_build._declare(lib)
cores = {n: EngineCore(EngineConfig(model=MODEL, dtype="float32", seed=0, max_num_seqs=64,
                                    max_num_batched_tokens=2048)) for n in libs}
def use(name):
    cpu_build._loaded[0] = libs[name]
params = dict(temperature=0, max_tokens=2000, ignore_eos=True)
from rill.sampling_params import SamplingParams
for name, core in cores.items():  # a warm-up request each: no side's first timed step pays a first call's costs
    use(name)
    core.add_request("warm-up", list(range(3, 259)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while core.has_work:
        core.step()
for name, core in cores.items():
    rng = random.Random(0)
    for i in range(B):
        core.add_request(f"r{i}", [rng.randrange(3, 32000) for _ in range(PROMPT)], SamplingParams(**params))
def prefilling(core):
    return any(s.num_computed_tokens < PROMPT for s in core.scheduler.running) or core.scheduler.waiting
prefill = {k: 0.0 for k in cores}  # the prefill steps, the engines taking turns step by step
step = 0
while any(prefilling(core) for core in cores.values()):
    step += 1
    for name in (("old", "new") if step % 2 else ("new", "old")):
        core = cores[name]
        if prefilling(core):
            use(name)
            t = time.perf_counter(); core.step(); prefill[name] += time.perf_counter() - t
times = {k: [] for k in cores}; tokens = {k: [] for k in cores}
for rnd in range(int(os.environ.get("ROUNDS", "20"))):
    for name in (("old", "new") if rnd % 2 else ("new", "old")):
        use(name)
        t = time.perf_counter(); out = cores[name].step(); times[name].append(time.perf_counter() - t)
        tokens[name].append(sorted((d.request_id, tuple(d.token_ids)) for d in out))
for name in cores:
    ts = times[name]
    print(f"B={B} prompt {PROMPT} {name}: decode step min {min(ts)*1000:6.1f} p50 {statistics.median(ts)*1000:6.1f} ms")
print(f"prefill of {B} x {PROMPT} tokens: old {prefill['old']:.2f} s, new {prefill['new']:.2f} s "
      f"({prefill['old'] / prefill['new']:.3f}x)")
print(f"old/new: decode p50 {statistics.median(times['old'])/statistics.median(times['new']):.3f}x")
same = sum(a == b for a, b in zip(tokens["old"], tokens["new"]))
print(f"steps with identical greedy tokens: {same}/{len(tokens['old'])}")
