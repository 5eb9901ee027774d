"""Prompt logprobs (SamplingParams.prompt_logprobs) from EngineCore, driven directly, against
transformers on the same random-weight model: whole prefill, chunked prefill, a prompt whose
prefix is in the cache, preemption, and batches that mix scoring and plain requests."""

import random

import pytest
import torch

from helpers_models import make_model_dir
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.sampling_params import SamplingParams

SCORE = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")  # window 24


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_prompt_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row t is log p(. | ids[:t]) for t >= 1 (row 0 unused)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.cat([torch.zeros_like(logits[:1]), logits[:-1].log_softmax(-1)])


def engine(model_dir, **kw) -> EngineCore:
    return EngineCore(EngineConfig(model=str(model_dir), **{"num_kv_blocks": 256, **kw}))


def run(core: EngineCore, requests: dict, max_steps=2000) -> dict:
    """request id -> (prompt logprobs, sampled token ids), each request's deltas joined."""
    for rid, (ids, params) in requests.items():
        core.add_request(rid, ids, params)
    out = {rid: [None, []] for rid in requests}
    done = set()
    for _ in range(max_steps):
        for d in core.step():
            if d.prompt_logprobs is not None:
                assert out[d.request_id][0] is None, "prompt logprobs are handed out once"
                out[d.request_id][0] = d.prompt_logprobs
            out[d.request_id][1] += d.token_ids
            done |= {d.request_id} if d.finished else set()
        if len(done) == len(requests):
            return out
    raise AssertionError("requests did not finish")


def prompt(n: int, seed=0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


def assert_matches_transformers(hf_model, ids, scored, num_top=3):
    expected = hf_prompt_logprobs(hf_model, ids)
    assert len(scored) == len(ids) and scored[0] is None
    for t in range(1, len(ids)):
        lp = scored[t]
        assert lp.token_id == ids[t]
        assert lp.logprob == pytest.approx(expected[t, ids[t]].item(), abs=1e-4)
        assert lp.rank == int((expected[t] > expected[t, ids[t]]).sum()) + 1
        top_values, top_ids = expected[t].topk(num_top)
        assert [i for i, _ in lp.top] == top_ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top_values.tolist(), abs=1e-4)


def test_prompt_logprobs_match_transformers(model_dir, hf_model):
    ids = prompt(40)
    scored, tokens = run(engine(model_dir), {"x": (ids, SCORE)})["x"]
    assert len(tokens) == 1
    assert_matches_transformers(hf_model, ids, scored)


def test_chunked_prefill_scores_every_chunk(model_dir, hf_model):
    ids = prompt(70, seed=1)
    scored, _ = run(engine(model_dir, max_num_batched_tokens=16), {"x": (ids, SCORE)})["x"]
    assert_matches_transformers(hf_model, ids, scored)


def test_a_cached_prefix_is_scored_anyway(model_dir, hf_model):
    ids = prompt(64, seed=2)
    core = engine(model_dir, block_size=16)
    run(core, {"warm": (ids, SamplingParams(temperature=0, max_tokens=1))})
    scored, _ = run(core, {"x": (ids, SCORE)})["x"]
    assert_matches_transformers(hf_model, ids, scored)
    plain = run(core, {"again": (ids, SamplingParams(temperature=0, max_tokens=1))})
    assert core.block_manager.num_hit_tokens >= 48  # requests that score nothing still hit the cache
    assert plain["again"][0] is None


def test_scoring_and_plain_requests_share_batches(model_dir, hf_model):
    requests = {f"p{i}": (prompt(30, seed=10 + i), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
                for i in range(4)}
    requests |= {f"s{i}": (prompt(50, seed=20 + i), SCORE) for i in range(3)}
    out = run(engine(model_dir, max_num_batched_tokens=64), requests)
    for i in range(3):
        assert_matches_transformers(hf_model, requests[f"s{i}"][0], out[f"s{i}"][0])
    assert all(out[f"p{i}"][0] is None and len(out[f"p{i}"][1]) == 5 for i in range(4))


def test_preempted_mid_prefill_scores_each_token_once(tmp_path):
    # 6 blocks of 16 tokens, no sliding window to free any: "a" (60 + 8 tokens, 5 blocks) leaves
    # "b" (60 tokens, 4 blocks) room for part of its prefill, then takes it back; b is scored
    # partly, preempted, and recomputed once a is done.
    model_dir = make_model_dir(tmp_path, "qwen2")
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = [prompt(60, seed=30), prompt(60, seed=31)]
    core = engine(model_dir, num_kv_blocks=6, block_size=16, max_num_batched_tokens=64)
    out = run(core, {"a": (ids[0], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)),
                     "b": (ids[1], SCORE)})
    assert core.stats.num_preemptions > 0
    assert_matches_transformers(hf_model, ids[1], out["b"][0])
    assert not core._owed_prompt_logprobs


def test_abort_while_scoring_forgets_the_request(model_dir):
    core = engine(model_dir, max_num_batched_tokens=16)
    core.add_request("x", prompt(60), SCORE)
    core.step()
    core.abort("x")
    assert not core._owed_prompt_logprobs and not core.step()


def test_streamed_input_refuses_prompt_logprobs(model_dir):
    from rill.errors import ValidationError

    with pytest.raises(ValidationError) as info:
        engine(model_dir).open_session("s", SCORE)
    assert info.value.param == "prompt_logprobs"
