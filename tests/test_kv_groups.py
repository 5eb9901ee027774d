"""Per-layer windows in the KV cache, end to end: a random-weight Qwen2 whose layers interleave
sliding-window and full attention (layer_types, as transformers reads them) runs through
EngineCore with one block table per KV group. Greedy output equals transformers token for token
with prompts several windows long; the sliding groups' KV stays bounded while the full group's
grows with the text; prefix-cache hits, streaming input and preemption keep the output exact."""

import random

import pytest

from helpers_models import hf_greedy, make_model_dir
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.sampling_params import SamplingParams

WINDOW = 16
# 2 full + 4 sliding layers: groups of 2 layers, one full group and two sliding groups
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention",
               "sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2-hybrid"), "qwen2", num_hidden_layers=6,
                          use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0,
                          layer_types=LAYER_TYPES)


def engine(model_dir, **kw) -> EngineCore:
    return EngineCore(EngineConfig(model=str(model_dir), **{"num_kv_blocks": 256, **kw}))


def prompt(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(3, 400) for _ in range(n)]


def greedy(max_tokens):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def run(core, rid, ids, params, on_step=None, max_steps=5000):
    core.add_request(rid, ids, params)
    tokens = []
    for _ in range(max_steps):
        for d in core.step():
            tokens.extend(d.token_ids)
        if on_step is not None:
            on_step(core)
        if rid not in core.requests:
            return tokens
    raise AssertionError("the request did not finish")


def live(seq, g):
    return len(seq.block_tables[g]) - seq.num_freed_blocks[g]


def test_the_model_has_one_full_and_two_sliding_kv_groups(hybrid_dir):
    core = engine(hybrid_dir)
    assert core.model_config.layer_windows == tuple(WINDOW if t == "sliding_attention" else None for t in LAYER_TYPES)
    assert core.window is None  # not every layer slides
    assert core.kv_layout.group_windows == (WINDOW, WINDOW, None)  # in the order of their first layer
    assert core.kv_layout.layers_per_group == 2
    assert len({id(kv[0]) for kv in core.runner.kv_caches}) == 2  # two cache tensors, not six


@pytest.mark.parametrize("chunk", [2048, 24])
def test_greedy_output_matches_transformers_with_a_prompt_several_windows_long(hybrid_dir, chunk):
    ids = prompt(7 * WINDOW + 5, seed=1)
    params = greedy(24)
    core = engine(hybrid_dir, max_num_batched_tokens=chunk)
    assert run(core, "x", ids, params) == hf_greedy(hybrid_dir, ids, 24)
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_sliding_groups_hold_bounded_kv_while_the_full_group_grows_with_the_text(hybrid_dir):
    chunk = 32
    core = engine(hybrid_dir, max_num_batched_tokens=chunk, num_kv_blocks=512)
    bm, bs = core.block_manager, core.config.block_size
    windows = core.kv_layout.group_windows
    bound = -(-WINDOW // bs) + 2 + -(-chunk // bs)  # the window, a block being left, a prefill chunk
    used = []

    def check(core):
        for seq in core.scheduler.running:
            for g, w in enumerate(windows):
                if w is None:
                    assert live(seq, g) == -(-seq.num_computed_tokens // bs)
                else:
                    assert live(seq, g) <= bound
            assert bm.num_used_blocks == sum(live(seq, g) for g in range(len(windows)))
            used.append((seq.num_computed_tokens, bm.num_used_blocks))

    run(core, "long", prompt(300, seed=2), greedy(500), on_step=check)
    length, blocks = used[-1]
    assert length >= 790
    full_attention_blocks = 3 * -(-length // bs)  # what three groups that keep everything hold
    assert blocks <= -(-length // bs) + 2 * bound < full_attention_blocks / 2
    assert bm.num_free_blocks == bm.num_blocks
    bm.check_invariants()


def test_a_repeated_long_prompt_hits_the_prefix_cache_and_answers_the_same(hybrid_dir):
    ids = prompt(6 * WINDOW + 3, seed=3)
    core = engine(hybrid_dir, max_num_batched_tokens=40)
    first = run(core, "a", ids, greedy(16))
    hit_before = core.block_manager.num_hit_tokens
    second = run(core, "b", ids, greedy(16))
    assert core.block_manager.num_hit_tokens - hit_before == (len(ids) - 1) // 16 * 16
    assert second == first == hf_greedy(hybrid_dir, ids, 16)
    core.block_manager.check_invariants()


def test_a_streamed_session_answers_as_the_whole_prompt_at_once(hybrid_dir):
    ids = prompt(5 * WINDOW + 7, seed=4)
    core = engine(hybrid_dir)
    core.open_session("s", greedy(16))
    for i in range(0, len(ids), 9):
        core.append_input("s", ids[i : i + 9])
        core.step()
    core.finish_input("s")
    tokens = []
    while "s" in core.requests:
        for d in core.step():
            tokens.extend(d.token_ids)
    assert tokens == hf_greedy(hybrid_dir, ids, 16)
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_preemption_under_kv_pressure_keeps_every_answer_exact(hybrid_dir):
    prompts = [prompt(40 + i, seed=10 + i) for i in range(3)]
    roomy = engine(hybrid_dir)
    expected = [run(roomy, f"r{i}", p, greedy(60)) for i, p in enumerate(prompts)]
    tight = engine(hybrid_dir, num_kv_blocks=20, max_num_batched_tokens=128)  # every new block costs 3 ids
    for i, p in enumerate(prompts):
        tight.add_request(f"t{i}", p, greedy(60))
    out = {f"t{i}": [] for i in range(3)}
    for _ in range(3000):
        for d in tight.step():
            out[d.request_id].extend(d.token_ids)
        if not tight.requests:
            break
    assert [out[f"t{i}"] for i in range(3)] == expected
    assert tight.stats.num_preemptions >= 1
    assert tight.block_manager.num_free_blocks == tight.block_manager.num_blocks


def test_a_request_below_its_minimum_blocks_over_all_groups_fails_at_admission(hybrid_dir):
    core = engine(hybrid_dir)
    need = core.min_blocks_per_seq(400 + 16)
    assert need == -(-416 // 16) + 2 * (-(-(WINDOW + 16) // 16) + 1)  # full: all; sliding: window + 2 each
    small = engine(hybrid_dir, num_kv_blocks=need - 1)
    with pytest.raises(Exception, match="KV blocks"):
        small.add_request("x", [5] * 400, greedy(16))
    engine(hybrid_dir, num_kv_blocks=need).add_request("y", [5] * 400, greedy(16))


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    """Gemma 3's own pattern, five local layers to one global (google/gemma-3's sliding_window_pattern 6)."""
    return make_model_dir(tmp_path_factory.mktemp("gemma3"), "gemma3", num_hidden_layers=6, sliding_window_pattern=6)


def test_gemma3_five_local_to_one_global_matches_transformers_and_bounds_its_local_kv(gemma3_dir):
    core = engine(gemma3_dir, max_num_batched_tokens=32)
    window, bs = core.model_config.layer_windows[0], core.config.block_size
    assert core.model_config.layer_windows == (window,) * 5 + (None,)
    assert core.kv_layout.group_windows == (window,) * 5 + (None,) and core.kv_layout.layers_per_group == 1
    bound = -(-window // bs) + 2 + -(-32 // bs)

    def check(core):
        for seq in core.scheduler.running:
            assert live(seq, 5) == -(-seq.num_computed_tokens // bs)
            assert all(live(seq, g) <= bound for g in range(5))

    ids = prompt(8 * window + 3, seed=5)
    first = run(core, "a", ids, greedy(20), on_step=check)
    assert first == hf_greedy(gemma3_dir, ids, 20)
    assert run(core, "b", ids, greedy(20)) == first  # again, from the prefix cache
    assert core.block_manager.num_hit_tokens >= len(ids) - bs


def test_a_model_that_skips_for_layer_fails_loudly_rather_than_reading_another_groups_blocks(hybrid_dir):
    core = engine(hybrid_dir)
    core.add_request("x", prompt(20), greedy(2))
    batch = core.scheduler.schedule()
    _, _, meta, _ = core.runner._prepare(batch)
    assert meta.slot_mapping is None and meta.block_tables is None
    tables = {id(meta.for_layer(i).block_tables) for i in range(len(LAYER_TYPES))}
    assert len(tables) == 3  # one per group
    assert meta.for_layer(0).block_tables is meta.for_layer(2).block_tables  # layers 0 and 2: one group
