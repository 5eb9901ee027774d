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

import dataclasses
import os
import pickle
import random
import signal
import subprocess
import sys

import httpx
import msgspec
import pytest
import trio

from helpers_families import make_family_dir
from helpers_models import make_model_dir
from helpers_server import one_torch_thread, parse_sse, running_server  # noqa: F401 (fixture)
from rill import LLM
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.engine.core import EngineCore
from rill.errors import EngineDeadError, ModelLoadError, RankFailedError
from rill.models.config import load_model_config
from rill.models.parallel import shard_config
from rill.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
# max_num_batched_tokens below the longest prompt: it is prefilled in chunks.
ENGINE = dict(max_num_batched_tokens=64, max_num_seqs=8)
# KV blocks of 16 tokens, per model: enough for the longest request, too few for all of them at once,
# so some are preempted and recomputed (sliding windows need fewer, Gemma's KV groups more).
# Small enough that the workload preempts (the fair admission between requests, engine/fair_queue.py,
# runs it in another order than FIFO did: 8 and 32 blocks no longer ran short for these families).
KV_BLOCKS = {"phi3": 7, "mistral": 7, "mixtral": 7, "gemma2": 16, "gemma3": 24}


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


# -- rill-tiny through the command line ------------------------------------------------------------------


def test_rill_tiny_answers_the_same_through_rill_chat_with_two_ranks():
    questions = ["What is 347 + 58?", "Reverse the word: stream", "Uppercase: hello world"]
    expected = ["347 + 58 = 405", "maerts", "HELLO WORLD"]
    with LLM("rill-tiny") as llm:
        one = [o.outputs[0].text for o in llm.chat([[{"role": "user", "content": q}] for q in questions],
                                                     SamplingParams(temperature=0, max_tokens=64))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "rill", "chat", "--tensor-parallel-size", "2", "--json",
                           "--max-tokens", "64", *questions], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    two = [msgspec.json.decode(line)["text"] for line in done.stdout.splitlines()]
    assert two == one
    assert all(answer.endswith(e) for answer, e in zip(two, expected)), two


# -- a rank that dies ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tp-mistral"), "mistral")


HI = [{"role": "user", "content": "hi"}]


async def test_a_rank_killed_mid_stream_ends_it_with_an_error_then_health_is_503(mistral_dir):
    async with running_server(mistral_dir, tensor_parallel_size=2) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        pids = rank_pids(server.engine.core)
        body = {"messages": HI, "max_tokens": 400, "ignore_eos": True, "stream": True}
        raw = ""
        with trio.fail_after(60):
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for text in response.aiter_text():
                    raw += text
                    if '"content"' in raw and is_running(pids[0]):
                        os.kill(pids[0], signal.SIGKILL)
        frames = parse_sse(raw)
        assert frames[-1].event == "error" and all(f.data != "[DONE]" for f in frames)
        assert "tensor-parallel rank 1" in frames[-1].json["error"]["message"]
        health = await client.get("/health")
        assert health.status_code == 503
        late = await client.post("/v1/chat/completions", json={"messages": HI})
        assert late.status_code == 503 and late.json()["error"]["code"] == "engine_dead"
    assert_gone(pids)


async def test_a_rank_killed_while_the_engine_idles_kills_the_engine_at_once(mistral_dir):
    config = EngineConfig(model=str(mistral_dir), num_kv_blocks=64, tensor_parallel_size=2)
    async with open_engine(config) as engine:
        (pid,) = rank_pids(engine.core)
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(10):
            await engine.died.wait()
        assert isinstance(engine.dead, RankFailedError) and "tensor-parallel rank 1" in str(engine.dead)
        with pytest.raises(EngineDeadError):
            engine.submit("late", [5, 6, 7], GREEDY)
    assert_gone([pid])


def test_offline_generate_after_a_rank_died_raises_instead_of_waiting(mistral_dir):
    with LLM(str(mistral_dir), num_kv_blocks=64, tensor_parallel_size=2) as llm:
        (pid,) = rank_pids(llm.engine)
        assert llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids  # works while the rank lives
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RankFailedError):
            for _ in range(100):  # the monitor notices within a moment; until then the pipe or gloo does
                llm.generate([[5, 6, 7]], GREEDY)
    assert_gone([pid])


# -- what is refused before any process starts ------------------------------------------------------------


def test_sizes_that_do_not_split_the_model_are_refused_before_spawning(mistral_dir):
    with pytest.raises(ModelLoadError, match="does not divide num_attention_heads 4"):
        EngineCore(EngineConfig(model=str(mistral_dir), num_kv_blocks=8, tensor_parallel_size=3))
    twelve_heads = dataclasses.replace(load_model_config(mistral_dir), num_heads=12, num_kv_heads=3,
                                       intermediate_size=120)
    with pytest.raises(ModelLoadError, match="neither a divisor nor a multiple of num_key_value_heads 3"):
        shard_config(twelve_heads, 4)
    assert shard_config(twelve_heads, 6).num_kv_heads == 1  # each of 3 heads on 2 ranks
    assert shard_config(twelve_heads, 3).num_heads == 4
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        EngineConfig(tensor_parallel_size=0)


# -- the pieces, without processes -----------------------------------------------------------------------


def test_a_step_travels_as_a_skeleton_and_one_buffer_and_comes_back_equal():
    import torch

    from rill.distributed import wire
    from rill.models.attention import AttentionMetadata

    lens, starts = torch.tensor([5], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32)
    groups = [AttentionMetadata(torch.arange(5) + 16 * g, torch.tensor([[g, 3]], dtype=torch.int32), lens, starts, 5)
              for g in range(2)]  # two KV groups, as ModelRunner._prepare_groups builds them
    meta = AttentionMetadata(None, None, lens, starts, 5, layers=(groups[0], groups[1], groups[0]))
    hidden = torch.randn(3, 7, dtype=torch.bfloat16)
    args = (torch.tensor([9, 8, 7, 6, 5]), torch.arange(5), meta, hidden)
    skeleton, tensors, num_bytes = wire.split(args)
    assert len(tensors) == 9 and num_bytes % wire.ALIGN_BYTES == 0  # shared tensors and groups sent once
    back = wire.fill(pickle.loads(pickle.dumps(skeleton)), wire.pack(tensors, num_bytes, torch.device("cpu")))
    ids, pos, meta2, hidden2 = back
    assert torch.equal(ids, args[0]) and torch.equal(pos, args[1]) and torch.equal(hidden2, hidden)
    assert hidden2.dtype == torch.bfloat16 and meta2.block_tables is None and meta2.max_query_len == 5
    assert meta2.layers[0] is meta2.layers[2] and meta2.layers[0] is not meta2.layers[1]
    for got, want in zip(meta2.layers, meta.layers):
        assert torch.equal(got.slot_mapping, want.slot_mapping) and torch.equal(got.block_tables, want.block_tables)
        assert got.block_tables.dtype == torch.int32


def test_each_rank_gets_its_heads_its_vocabulary_rows_and_the_replicated_rest(mistral_dir):
    import torch

    from rill.models.parallel_loader import RankSlicer

    cfg = dataclasses.replace(load_model_config(mistral_dir), num_heads=4, num_kv_heads=2, head_dim=2, vocab_size=7)
    q, k = torch.arange(8.0)[:, None], torch.arange(4.0)[:, None]  # rows: 4 heads x 2, 2 heads x 2
    for rank, (q_rows, kv_rows) in enumerate([([0, 1, 2, 3], [0, 1]), ([4, 5, 6, 7], [2, 3])]):
        cut = RankSlicer(cfg, rank, 2)
        assert cut("layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.q_proj.weight", q)[:, 0].tolist() \
            == q_rows
        assert cut("layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.k_proj.weight", k)[:, 0].tolist() \
            == kv_rows
    for rank in range(4):  # 4 ranks, 2 KV heads: ranks 0, 1 hold head 0; ranks 2, 3 head 1
        kv = RankSlicer(cfg, rank, 4)("layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.v_proj.weight", k)
        assert kv[:, 0].tolist() == [[0, 1], [2, 3]][rank // 2]
    fused = torch.cat([q, k, k + 10])  # Phi-3's fused qkv: each part cut at the whole model's sizes
    assert RankSlicer(cfg, 1, 2)("layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.qkv_proj.weight",
                                 fused)[:, 0].tolist() == [4, 5, 6, 7, 2, 3, 12, 13]
    vocab = torch.arange(7.0)[:, None].expand(7, 3)  # 7 rows over 2 ranks: 4 each, the last padded with 0
    last = RankSlicer(cfg, 1, 2)("embed_tokens.weight", "model.embed_tokens.weight", vocab)
    assert last[:, 0].tolist() == [4, 5, 6, 0]
    down = torch.arange(12.0).view(3, 4)
    assert RankSlicer(cfg, 1, 2)("layers.0.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight",
                                 down).tolist() == [[2, 3], [6, 7], [10, 11]]
    norm = torch.ones(5)
    assert RankSlicer(cfg, 1, 2)("layers.0.input_layernorm.weight", "model.layers.0.input_layernorm.weight",
                                 norm) is norm
