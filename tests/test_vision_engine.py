"""Images inside rill's engine: the encoder budget per step, the encoder cache (each image encoded once,
held while needed, freed by abort and preemption), the prefix cache keyed by image content, and
M-RoPE positions under preemption and streaming sessions, against the same engine run plainly."""

from __future__ import annotations

import pytest
import torch

from helpers_vision import circle_image, make_vl_model_dir, noise_image
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.errors import ValidationError
from rill.sampling_params import SamplingParams

torch.set_num_threads(1)
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_5_vl"), "qwen2_5_vl")


def _core(model_dir, **kw) -> EngineCore:
    return EngineCore(EngineConfig(model=str(model_dir), **{"max_num_seqs": 8, **kw}))


def _prompt(core: EngineCore, images, question="What colour is the circle?"):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
    text = core.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    ids = core.tokenizer.encode(text, add_special_tokens=False)
    return core.mm_inputs.expand(ids, [core.mm_inputs.item("image", im) for im in images])


def _drain(core: EngineCore) -> tuple[dict[str, list[int]], dict[str, int]]:
    out, cached = {}, {}
    while core.has_work:
        for d in core.step():
            out.setdefault(d.request_id, []).extend(d.token_ids)
            cached[d.request_id] = d.num_cached_tokens
    return out, cached


def _assert_nothing_held(core: EngineCore) -> None:
    cache = core.scheduler.vision.cache
    assert cache.num_holders == 0 and cache.num_held_tokens == 0
    assert cache.num_tokens <= cache.capacity_tokens
    cache.check_invariants()
    core.block_manager.check_invariants()


def _alone(model_dir, images, **kw) -> list[int]:
    core = _core(model_dir, **kw)
    ids, items = _prompt(core, images)
    core.add_request("a", ids, GREEDY, items)
    return _drain(core)[0]["a"]


def test_same_image_twice_is_encoded_once_and_hits_the_prefix_cache(model_dir):
    core = _core(model_dir)
    ids, items = _prompt(core, [circle_image("red")])
    core.add_request("first", ids, GREEDY, items)
    first, cached = _drain(core)
    assert cached["first"] == 0
    ids2, items2 = _prompt(core, [circle_image("red")])  # decoded again: a new item, the same content
    core.add_request("second", ids2, GREEDY, items2)
    second, cached2 = _drain(core)
    assert second["second"] == first["first"]
    # every full block of the prompt, image included, came from the prefix cache (usage's cached tokens)
    assert cached2["second"] == (len(ids2) - 1) // 16 * 16 > items[0].end
    assert core.scheduler.vision.cache.num_encoded_items == 1
    _assert_nothing_held(core)


def test_a_different_image_of_the_same_size_does_not_hit(model_dir):
    core = _core(model_dir)
    ids, items = _prompt(core, [circle_image("red")])
    core.add_request("red", ids, GREEDY, items)
    _drain(core)
    ids2, items2 = _prompt(core, [circle_image("blue")])
    assert ids2 == ids  # the same tokens: only the image's content tells them apart
    core.add_request("blue", ids2, GREEDY, items2)
    out, cached = _drain(core)
    assert cached["blue"] == items2[0].offset // 16 * 16  # the text before the image only
    assert out["blue"] == _alone(model_dir, [circle_image("blue")])


def test_concurrent_requests_with_one_image_encode_it_once(model_dir):
    core = _core(model_dir)
    for i in range(3):
        ids, items = _prompt(core, [noise_image(90, 60, 5)], question=f"Question {i}?")
        core.add_request(f"r{i}", ids, GREEDY, items)
    core.step()
    assert core.scheduler.vision.cache.num_encoded_items == 1
    _drain(core)
    _assert_nothing_held(core)


def test_encoder_budget_spreads_images_over_steps(model_dir):
    images = [noise_image(90, 60, 1), noise_image(60, 90, 2), noise_image(56, 56, 3)]
    core = _core(model_dir, max_num_encoder_tokens=8)
    ids, items = _prompt(core, images)
    assert all(it.num_tokens <= 8 for it in items) and sum(it.num_tokens for it in items) > 8
    core.add_request("a", ids, GREEDY, items)
    encoded = []
    while core.has_work:
        before = core.scheduler.vision.cache.num_encoded_items
        core.step()
        encoded.append(core.scheduler.vision.cache.num_encoded_items - before)
    assert max(encoded) == 1 and sum(encoded) == 3  # one image per step: each fills the budget
    assert _alone(model_dir, images, max_num_encoder_tokens=8) == _alone(model_dir, images)


def test_an_image_larger_than_the_budget_runs_alone(model_dir):
    images = [noise_image(150, 100, 4)]
    assert _alone(model_dir, images, max_num_encoder_tokens=2) == _alone(model_dir, images)


def test_decodes_go_on_while_an_image_waits_for_budget(model_dir):
    core = _core(model_dir, max_num_encoder_tokens=8)
    ids, items = _prompt(core, [noise_image(90, 60, 1)])
    core.add_request("decoding", ids, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), items)
    core.step()
    many = [noise_image(90, 60, 10 + i) for i in range(3)]
    ids2, items2 = _prompt(core, many)
    core.add_request("big", ids2, GREEDY, items2)
    for _ in range(3):  # each step encodes one of the new images and still decodes the first request
        deltas = core.step()
        assert any(d.request_id == "decoding" and d.token_ids for d in deltas)
    _drain(core)
    _assert_nothing_held(core)


def test_abort_frees_what_the_image_holds(model_dir):
    core = _core(model_dir, max_num_batched_tokens=16)
    ids, items = _prompt(core, [noise_image(150, 100, 6)])
    core.add_request("a", ids, GREEDY, items)
    seq = core.requests["a"][0]
    while seq.num_computed_tokens <= items[0].offset:  # until the image is partly in the KV cache
        core.step()
    assert seq.num_computed_tokens < items[0].end
    assert core.scheduler.vision.cache.num_holders == 1 and core.block_manager.num_used_blocks > 0
    core.abort("a")
    assert core.block_manager.num_used_blocks == 0
    _assert_nothing_held(core)


def test_preemption_recomputes_with_the_same_positions(model_dir):
    expected = {}
    images = {f"r{i}": [noise_image(90, 60, 20 + i)] for i in range(4)}
    for rid, ims in images.items():
        expected[rid] = _alone(model_dir, ims, enable_prefix_caching=False)
    core = _core(model_dir, num_kv_blocks=12, max_num_batched_tokens=32, enable_prefix_caching=False)
    for rid, ims in images.items():
        ids, items = _prompt(core, ims)
        core.add_request(rid, ids, GREEDY, items)
    out, _ = _drain(core)
    assert core.stats.num_preemptions > 0
    assert out == expected
    _assert_nothing_held(core)


def test_streaming_session_with_an_image_then_text(model_dir):
    """A session opened with an image in its prompt, its question appended later, answers as the whole
    prompt sent at once (text after the image continues M-RoPE at i + delta)."""
    whole = _core(model_dir, enable_prefix_caching=False)
    ids, items = _prompt(whole, [circle_image("green")])
    whole.add_request("w", ids, GREEDY, items)
    expected = _drain(whole)[0]["w"]
    core = _core(model_dir, enable_prefix_caching=False, max_num_batched_tokens=16)
    split = items[0].end + 3
    core.open_session("s", GREEDY, prompt_token_ids=ids[:split], mm_items=items)
    for _ in range(6):
        core.step()
    core.append_input("s", ids[split:])
    core.finish_input("s")
    assert _drain(core)[0]["s"] == expected
    _assert_nothing_held(core)


def test_text_only_model_refuses_images(tmp_path):
    from helpers_models import make_model_dir

    core = EngineCore(EngineConfig(model=str(make_model_dir(tmp_path, "qwen2"))))
    vl = _core(make_vl_model_dir(tmp_path / "vl"))
    ids, items = _prompt(vl, [noise_image(56, 56)])
    with pytest.raises(ValidationError, match="text only"):
        core.add_request("a", [1, 2, 3], GREEDY, items)


def test_misplaced_items_are_refused(model_dir):
    core = _core(model_dir)
    ids, items = _prompt(core, [noise_image(56, 56)])
    with pytest.raises(ValidationError, match="placeholders"):
        core.add_request("a", ids, GREEDY, [items[0].at(0)])
    assert not core.requests


def test_n_samples_and_prompt_logprobs_with_an_image(model_dir):
    expected = _alone(model_dir, [circle_image("red")])
    core = _core(model_dir)
    ids, items = _prompt(core, [circle_image("red")])
    core.add_request("n2", ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, n=2), items)
    core.add_request("lp", ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0),
                     items)
    out: dict[tuple[str, int], list[int]] = {}
    scored = None
    while core.has_work:
        for d in core.step():
            out.setdefault((d.request_id, d.index), []).extend(d.token_ids)
            scored = d.prompt_logprobs if d.prompt_logprobs is not None else scored
    assert out[("n2", 0)] == out[("n2", 1)] == out[("lp", 0)] == expected
    assert len(scored) == len(ids) and scored[0] is None and all(s is not None for s in scored[1:])
    assert core.scheduler.vision.cache.num_encoded_items == 1
    _assert_nothing_held(core)
