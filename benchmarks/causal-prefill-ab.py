"""Issue 33: whole-sequence prefill chunks through torch's is_causal (kernels/reference.py) against the
explicit causal mask they used before; two engines in one process (same model and requests), taking turns at one whole
prefill each, at THREADS threads (round 0 a warm-up; who goes first alternates). Prints the median prefill
time of each side and checks the first tokens agree.

    B=8 PROMPT=256|1024 THP_MEM_ALLOC_ENABLE=1 .venv/bin/python benchmarks/causal-prefill-ab.py
"""
import os
import random
import statistics
import time
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "2")))
from rill.config import EngineConfig  # noqa: E402
from rill.engine.core import EngineCore  # noqa: E402
from rill.kernels import reference  # noqa: E402
from rill.sampling_params import SamplingParams  # noqa: E402

from rill.bench.common import resolve_model
MODEL = resolve_model("random-qwen2-100m")  # made on first use
B, PROMPT = int(os.environ.get("B", "8")), int(os.environ.get("PROMPT", "256"))
real = reference._sdpa


def with_mask(q, k, v, visible, scale, softcap, causal=False):
    if causal:  # what the code did before: the causal mask written out
        pos = torch.arange(q.shape[2])
        visible, causal = pos[None, :] <= pos[:, None], False
    return real(q, k, v, visible, scale, softcap, causal)


cores = {name: EngineCore(EngineConfig(model=MODEL, dtype="float32", seed=0, max_num_seqs=64,
                                       max_num_batched_tokens=2048)) for name in ("mask", "causal")}
params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
ROUNDS = int(os.environ.get("ROUNDS", "4"))
seconds = {k: [] for k in cores}
agree = True
for rnd in range(ROUNDS + 1):  # round 0 warms both engines up and is not counted
    rng = random.Random(rnd)
    prompts = [[rng.randrange(3, 32000) for _ in range(PROMPT)] for _ in range(B)]
    first = {}
    for name in (list(cores) if rnd % 2 else list(cores)[::-1]):  # who goes first alternates
        core, firsts, took = cores[name], {}, 0.0
        for i, ids in enumerate(prompts):
            core.add_request(f"{rnd}-{i}", ids, params)
        while len(firsts) < B:
            reference._sdpa = with_mask if name == "mask" else real
            t = time.perf_counter()
            out = core.step()
            took += time.perf_counter() - t
            reference._sdpa = real
            for d in out:
                firsts.setdefault(d.request_id, d.token_ids[0])
        for i in range(B):
            core.abort(f"{rnd}-{i}")
        first[name] = firsts
        if rnd:
            seconds[name].append(took)
    agree &= first["mask"] == first["causal"]
mask, causal = statistics.median(seconds["mask"]), statistics.median(seconds["causal"])
print(f"prefill of {B} x {PROMPT} tokens, median of {ROUNDS} rounds: explicit mask {mask:.2f} s, is_causal "
      f"{causal:.2f} s ({mask / causal:.3f}x); first tokens equal in every round: {agree}")
