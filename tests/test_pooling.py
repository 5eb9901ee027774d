"""Pooling requests in the engine core (rill.engine.pooling), driven with no thread and no socket:
the pooled vector of a prompt prefilled in chunks, beside generating requests, after a prefix-cache
hit or a preemption, equals the prompt's hidden states from one whole forward pass; an abort frees
its KV; a pooling request samples nothing."""

from __future__ import annotations

import pytest
import torch

from helpers_models import make_model_dir
from helpers_server import one_torch_thread  # noqa: F401
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.models.attention import AttentionMetadata
from rill.sampling_params import SamplingParams

PROMPT = list(range(3, 45))  # 42 tokens: three blocks of 16, several chunks of 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen3"), "qwen3")


def hidden_states(core: EngineCore, ids: list[int]) -> torch.Tensor:
    """The decoder's final hidden states [len(ids), hidden] from one prefill step on fresh KV."""
    model, bs = core.runner.model, 16
    cfg, n = model.config, len(ids)
    blocks = -(-n // bs)
    kv = [(torch.zeros(blocks, bs, cfg.num_kv_heads, cfg.head_dim), torch.zeros(blocks, bs, cfg.num_kv_heads,
                                                                                cfg.head_dim))
          for _ in range(cfg.num_layers)]
    meta = AttentionMetadata(slot_mapping=torch.arange(n), block_tables=torch.arange(blocks, dtype=torch.int32)[None],
                             seq_lens=torch.tensor([n], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, n], dtype=torch.int32), max_query_len=n)
    with torch.inference_mode():
        return model(torch.tensor(ids), torch.arange(n), kv, meta).float()


def run(core: EngineCore, max_steps: int = 400) -> dict[str, list]:
    out: dict[str, list] = {}
    for _ in range(max_steps):
        for delta in core.step():
            out.setdefault(delta.request_id, []).append(delta)
        if not core.requests:
            return out
    raise AssertionError("the engine did not finish its requests")


def pooled(deltas) -> torch.Tensor:
    (delta,) = deltas  # one delta: the vector and the end, no token
    assert delta.finish_reason == "stop" and delta.token_ids == [] and delta.text == ""
    return torch.tensor(delta.embedding)


def engine(model_dir, **kw) -> EngineCore:
    return EngineCore(EngineConfig(model=str(model_dir), **{"num_kv_blocks": 64, "max_num_batched_tokens": 8, **kw}))


def test_chunked_pooling_beside_generation_matches_one_forward_pass(model_dir):
    core = engine(model_dir)
    reference = hidden_states(core, PROMPT)
    core.add_request("gen", PROMPT[:10], SamplingParams(max_tokens=12, temperature=0))
    core.add_request("last", PROMPT, SamplingParams(pooling="last"))
    core.add_request("mean", PROMPT, SamplingParams(pooling="mean"))
    out = run(core)
    torch.testing.assert_close(pooled(out["last"]), reference[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pooled(out["mean"]), reference.mean(dim=0), atol=1e-4, rtol=1e-4)
    assert sum(len(d.token_ids) for d in out["gen"]) == 12
    assert out["last"][0].num_prompt_tokens == len(PROMPT)
    bm = core.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_last_pooling_takes_a_prefix_cache_hit_and_mean_pooling_takes_none(model_dir):
    core = engine(model_dir)
    reference = hidden_states(core, PROMPT)
    core.add_request("warm", PROMPT, SamplingParams(pooling="last"))
    run(core)
    core.add_request("last", PROMPT, SamplingParams(pooling="last"))
    core.add_request("mean", PROMPT, SamplingParams(pooling="mean"))
    out = run(core)
    assert out["last"][0].num_cached_tokens == 32 and out["mean"][0].num_cached_tokens == 0
    torch.testing.assert_close(pooled(out["last"]), reference[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pooled(out["mean"]), reference.mean(dim=0), atol=1e-4, rtol=1e-4)


def test_mean_pooling_survives_preemption(model_dir):
    """A KV cache too small for everything at once: generating requests preempt the pooling prompt
    mid-prefill (recompute), and its mean still counts every position once."""
    core = engine(model_dir, num_kv_blocks=6, max_num_batched_tokens=16)
    reference = hidden_states(core, PROMPT)
    for i in range(2):
        core.add_request(f"gen{i}", PROMPT[:14], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    core.add_request("mean", PROMPT, SamplingParams(pooling="mean"))
    out = run(core)
    assert core.stats.num_preemptions > 0
    torch.testing.assert_close(pooled(out["mean"]), reference.mean(dim=0), atol=1e-4, rtol=1e-4)


def test_abort_mid_prefill_frees_the_kv_and_limits_hold(model_dir):
    core = engine(model_dir)
    core.add_request("mean", PROMPT, SamplingParams(pooling="mean"))
    core.step()
    assert core.abort("mean") and not core.requests
    bm = core.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not core._pooling
    core.check_fits_pooling(core.max_model_len)  # a pooling prompt may fill the context
    with pytest.raises(Exception, match="maximum context length"):
        core.add_request("long", [5] * (core.max_model_len + 1), SamplingParams(pooling="last"))
    with pytest.raises(Exception, match="n=1"):
        core.add_request("n2", PROMPT, SamplingParams(pooling="last", n=2))
