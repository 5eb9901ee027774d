"""Tensor parallelism on CPU (gloo): an engine split over two processes answers exactly as one process.

For each architecture family (Llama-family, Gemma, Phi-3, mixture of experts) a random-weight model
runs the same workload in a one-process engine and a tensor_parallel_size=2 one: greedy tokens equal
token for token, logprobs equal to float rounding. The workload takes the paths a step can take:
batched prefill and decode, prompts longer than the sliding windows and the token budget (chunked
prefill), a prefix-cache hit, preemption under a small KV cache, prompt logprobs, a streamed-input
session. rill-tiny answers the same through `rill chat --tensor-parallel-size 2`. A rank that dies
ends the engine as a dead engine ends: every request an error, /health 503, no hang, no process left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import httpx
import pytest
import trio

from helpers_families import make_family_dir
from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401 (fixture)
from rill import LLM
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.engine.core import EngineCore
from rill.errors import EngineDeadError, ModelLoadError, RankFailedError
from rill.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
# max_num_batched_tokens below the longest prompt: it is prefilled in chunks.
ENGINE = dict(max_num_batched_tokens=64, max_num_seqs=8)
# KV blocks of 16 tokens, per model: enough for the longest request, too few for all of them at once,
# so some are preempted and recomputed (sliding windows need fewer, Gemma's KV groups more).
KV_BLOCKS = {"phi3": 8, "mistral": 8, "mixtral": 8, "gemma2": 16, "gemma3": 32}


def build(kind: str, path):
    if kind in ("phi3", "phi3-longrope", "mixtral", "qwen3-moe"):
        return make_family_dir(path, kind)
    if kind == "qwen2-one-kv-head":  # fewer KV heads than ranks: the head is replicated on both
        return make_model_dir(path, "qwen2", num_key_value_heads=1)
    return make_model_dir(path, kind)


def workload(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [5, 17, 40, 150, 90, 33]
    prompts = [[rng.randrange(3, 400) for _ in range(n)] for n in lengths]
    prompts.append(prompts[3][:64] + [rng.randrange(3, 400) for _ in range(10)])  # shares 4 blocks with one
    return prompts


def run(core: EngineCore) -> dict[str, list]:
    """The workload on `core`; per request: its tokens, their logprobs, and its prompt logprobs if asked."""
    prompts = workload()
    for i, ids in enumerate(prompts[:-1]):
        params = GREEDY if i != 2 else SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=1)
        core.add_request(f"r{i}", ids, params)
    core.open_session("s", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    out: dict[str, list] = {}
    chunks = [prompts[1][:6], prompts[1][6:], prompts[0]]
    while core.has_work or core._pending or chunks:
        if chunks:
            core.append_input("s", chunks.pop(0))
            if not chunks:
                core.finish_input("s")
        for delta in core.step():
            entry = out.setdefault(delta.request_id, [[], [], None])
            entry[0] += delta.token_ids
            entry[1] += [lp.logprob for lp in delta.logprobs or []]
            if delta.prompt_logprobs is not None:
                entry[2] = [None if lp is None else lp.logprob for lp in delta.prompt_logprobs]
        if "r3" not in core.requests and "late" not in out and "late" not in core.requests:
            core.add_request("late", prompts[-1], GREEDY)  # after r3's blocks are cached: a prefix hit
    return out


def run_engine(model_dir, num_kv_blocks: int, **kw) -> tuple[dict[str, list], int, int]:
    core = EngineCore(EngineConfig(model=str(model_dir), num_kv_blocks=num_kv_blocks, **ENGINE, **kw))
    pids = rank_pids(core)
    try:
        out = run(core)
        return out, core.stats.num_preemptions, core.block_manager.num_free_blocks
    finally:
        core.close()
        assert_gone(pids)


def rank_pids(core: EngineCore) -> list[int]:
    if core.config.tensor_parallel_size == 1:
        return []
    pids = core.runner.model.ranks.pids
    assert len(pids) == core.config.tensor_parallel_size - 1 and all(is_running(p) for p in pids)
    return pids


def is_running(pid: int) -> bool:
    """Alive and not a zombie (a rank that exited is reaped by close: it is not even that)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_gone(pids: list[int]) -> None:
    assert [p for p in pids if is_running(p)] == []


def assert_same(one: dict[str, list], two: dict[str, list]) -> None:
    assert sorted(one) == sorted(two)
    for rid in one:
        tokens, logprobs, prompt_logprobs = one[rid]
        assert two[rid][0] == tokens, rid
        assert two[rid][1] == pytest.approx(logprobs, abs=1e-4), rid
        if prompt_logprobs is not None:
            assert two[rid][2][0] is None
            assert two[rid][2][1:] == pytest.approx(prompt_logprobs[1:], abs=1e-4), rid


FAMILIES = ["qwen2-one-kv-head", "gemma3", "phi3", "qwen3-moe"]
MORE = ["llama", "mistral", "qwen3", "gemma2", "phi3-longrope", "mixtral"]


@pytest.mark.parametrize("kind", FAMILIES + [pytest.param(k, marks=pytest.mark.slow) for k in MORE])
def test_two_ranks_answer_token_for_token_as_one_process(tmp_path, kind):
    model_dir = build(kind, tmp_path / kind)
    blocks = KV_BLOCKS.get(kind, 12)
    one, preempted_one, free_one = run_engine(model_dir, blocks)
    two, preempted_two, free_two = run_engine(model_dir, blocks, tensor_parallel_size=2)
    assert_same(one, two)
    assert preempted_one > 0 and preempted_two == preempted_one  # the same schedule, KV pressure included
    assert one["late"] and free_two == free_one  # every block back (the prefix cache keeps freed ones)
