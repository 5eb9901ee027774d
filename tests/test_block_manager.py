"""Paged KV bookkeeping: allocation, prefix sharing, LRU eviction, sliding-window freeing, KV groups
(layers with different windows: per-group freeing, accounting in block ids, prefix hits)."""

import pytest

from rill.engine.block_manager import BlockManager
from rill.engine.kv_layout import KVLayout
from rill.engine.sequence import Sequence


def make_seq(tokens, block_size=4, rid="r"):
    return Sequence(rid, 0, list(tokens), params=None, block_size=block_size, max_tokens=16)


def compute_all(bm, seq):
    """What the engine does for a sequence whose whole prompt runs in one step."""
    seq.num_computed_tokens = seq.num_cached_tokens = bm.match_prefix(seq)
    n = seq.num_tokens - seq.num_computed_tokens
    assert bm.can_append(seq, n)
    before = seq.num_computed_tokens
    bm.append(seq, n)
    seq.num_computed_tokens += n
    bm.commit_full_blocks(seq, before)


def test_append_allocates_ceil_blocks_and_free_returns_them():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(range(9))
    compute_all(bm, seq)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(seq)
    assert bm.num_free_blocks == 8 and seq.block_table == []
    bm.check_invariants()


def test_peak_used_blocks_is_a_high_water_mark_that_counts_revived_cached_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(range(9), rid="a")
    compute_all(bm, a)
    b = make_seq(range(100, 105), rid="b")
    compute_all(bm, b)
    assert bm.peak_used_blocks == 5
    bm.free(a)
    bm.free(b)
    assert bm.num_used_blocks == 0 and bm.reset_peak() == 5 and bm.peak_used_blocks == 0
    c = make_seq(range(9), rid="c")  # its first two blocks come back from the prefix cache (shared, not taken)
    compute_all(bm, c)
    assert c.num_cached_tokens == 8 and bm.peak_used_blocks == 3 == bm.num_used_blocks
    assert bm.reset_peak() == 3 and bm.peak_used_blocks == 3  # the mark restarts at what is in use
    bm.free(c)
    bm.check_invariants()


def test_can_append_is_false_at_the_limit_and_true_just_under():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq(range(8))
    assert bm.can_append(seq, 8)
    assert not bm.can_append(seq, 9)


def test_shared_prefix_blocks_are_reused_and_counted_as_hits():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(list(range(10)), rid="a")
    compute_all(bm, a)
    b = make_seq(list(range(8)) + [99, 98, 97], rid="b")
    compute_all(bm, b)
    assert b.num_cached_tokens == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert bm.num_hit_tokens == 8
    bm.free(a)
    bm.free(b)
    bm.check_invariants()


def test_a_fully_cached_prompt_still_computes_its_last_token():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(range(8), rid="a")
    compute_all(bm, a)
    b = make_seq(range(8), rid="b")
    assert bm.match_prefix(b) == 4  # the second block holds the last token, which needs logits


def test_freed_cached_blocks_stay_findable_until_evicted_in_lru_order():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(range(8), rid="a")
    compute_all(bm, a)
    bm.free(a)
    b = make_seq(list(range(8)) + [1], rid="b")
    assert bm.match_prefix(b) == 8
    bm.free(b)
    # Fill the cache with other content: the cached blocks get evicted.
    c = make_seq([50 + i for i in range(16)], rid="c")
    compute_all(bm, c)
    d = make_seq(list(range(8)) + [1], rid="d")
    assert bm.match_prefix(d) == 0
    bm.check_invariants()


def test_hash_collision_guard_checks_tokens():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(range(8), rid="a")
    compute_all(bm, a)
    block = bm.blocks[a.block_table[0]]
    block.token_ids = (9, 9, 9, 9)  # simulate a colliding hash with other contents
    b = make_seq(list(range(8)) + [5], rid="b")
    assert bm.match_prefix(b) == 0


def test_prefix_caching_off_never_shares():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_seq(range(8), rid="a")
    compute_all(bm, a)
    b = make_seq(list(range(8)) + [1], rid="b")
    assert bm.match_prefix(b) == 0


@pytest.mark.parametrize("window", [4, 5, 8, 13])
def test_window_frees_blocks_no_future_query_can_see(window):
    bs = 4
    bm = BlockManager(num_blocks=64, block_size=bs, group_windows=(window,))
    seq = make_seq([1], block_size=bs)
    bm.append(seq, 1)
    seq.num_computed_tokens = 1
    peak = 0
    for step in range(200):
        seq.append_token(step)
        bm.append(seq, 1)
        seq.num_computed_tokens += 1
        bm.free_outside_window(seq)
        live = len(seq.block_table) - seq.num_freed_blocks[0]
        peak = max(peak, live)
        # every position a future query may see (>= next_pos - window + 1) is still held
        oldest_visible = max(0, seq.num_computed_tokens - window + 1)
        assert seq.num_freed_blocks[0] * bs <= oldest_visible
    assert peak <= -(-window // bs) + 2
    bm.free(seq)
    assert bm.num_free_blocks == 64
    bm.check_invariants()


def test_a_growing_sequence_hashes_each_block_once_and_its_continuation_hits(monkeypatch):
    """Decoding one token at a time: every filled block is registered (a second request with the
    same tokens reuses them all), and each block is hashed once, not again whenever a later
    block fills (which made long sessions quadratic)."""
    from rill.engine import block_manager

    calls = []
    real = block_manager.chain_hash
    monkeypatch.setattr(block_manager, "chain_hash", lambda parent, ids: calls.append(ids) or real(parent, ids))
    bm = BlockManager(num_blocks=64, block_size=4)
    tokens = list(range(1, 101))
    seq = make_seq(tokens[:3])
    compute_all(bm, seq)
    for t in tokens[3:]:
        seq.append_token(t)
        before = seq.num_computed_tokens
        bm.append(seq, 1)
        seq.num_computed_tokens += 1
        bm.on_computed(seq, before)
    assert len(calls) == 25 and len(set(calls)) == 25
    again = make_seq(tokens + [0])
    assert bm.match_prefix(again) == 100
    bm.check_invariants()


# -- KV groups: layers with different windows (engine/kv_layout.py) --------------------------------

def gemma3_windows(num_layers, window=1024, pattern=6):
    """google/gemma-3: every pattern-th layer is global, the others slide."""
    return [None if (i + 1) % pattern == 0 else window for i in range(num_layers)]


def test_one_window_for_every_layer_is_one_group_with_a_slot_per_layer():
    for windows in ([None] * 4, [24] * 4):
        layout = KVLayout.for_windows(windows)
        assert layout.group_windows == (windows[0],) and layout.layers_per_group == 4
        assert layout.layer_slot == (0, 1, 2, 3) and layout.layer_group == (0, 0, 0, 0)


def test_gemma3_layers_split_into_groups_of_the_global_layer_count():
    layout = KVLayout.for_windows(gemma3_windows(34))  # gemma-3-4b: 29 local, 5 global
    assert layout.layers_per_group == 5
    assert layout.group_windows == (1024,) * 6 + (None,)
    assert layout.num_padded_slots == 1  # 29 local layers in 6 groups of 5
    for layer in (5, 11, 17, 23, 29):
        assert layout.layer_group[layer] == 6
    # every (group, slot) pair is one layer's at most: no two layers write the same cache memory
    pairs = list(zip(layout.layer_group, layout.layer_slot))
    assert len(set(pairs)) == 34 and max(layout.layer_slot) == 4


def test_block_counts_per_sequence_add_up_over_groups():
    layout = KVLayout.for_windows([8, None, 8, None])  # two groups of two layers
    assert layout.min_blocks(100, 4) == 25 + (3 + 1)  # full: every block; sliding: window + 1 + 1
    assert layout.max_blocks(100, 4, chunk_tokens=8) == 25 + 5
    assert layout.page_bytes(4, num_kv_heads=2, head_dim=8, itemsize=2) == 2 * 2 * 4 * 2 * 8 * 2


def hybrid_bm(num_blocks=64, bs=4, windows=(None, 8), caching=True):
    return BlockManager(num_blocks, bs, enable_prefix_caching=caching, group_windows=windows)


def hybrid_seq(tokens, groups=2, rid="r"):
    return Sequence(rid, 0, list(tokens), params=None, block_size=4, max_tokens=16, num_kv_groups=groups)


def decode(bm, seq, tokens):
    """One token per step, as the engine's _advance does it."""
    for t in tokens:
        seq.append_token(t)
        before = seq.num_computed_tokens
        assert bm.can_append(seq, 1)
        bm.append(seq, 1)
        seq.num_computed_tokens += 1
        bm.on_computed(seq, before)


def live_blocks(seq, g):
    return len(seq.block_tables[g]) - seq.num_freed_blocks[g]


def test_full_group_keeps_every_block_while_the_sliding_group_frees_its_past():
    bm = hybrid_bm(num_blocks=128)
    seq = hybrid_seq([1])
    bm.append(seq, 1)
    seq.num_computed_tokens = 1
    for n in range(2, 300):
        decode(bm, seq, [n % 50])
        assert live_blocks(seq, 0) == -(-seq.num_computed_tokens // 4)  # full: all of them
        assert live_blocks(seq, 1) <= -(-8 // 4) + 2  # window 8: bounded
        first_visible = max(0, seq.num_computed_tokens - 8 + 1)
        assert seq.num_freed_blocks[1] * 4 <= first_visible  # nothing a query may still see is freed
        assert bm.num_used_blocks == live_blocks(seq, 0) + live_blocks(seq, 1)
    bm.free(seq)
    assert bm.num_free_blocks == 128 and seq.block_tables == [[], []]
    bm.check_invariants()


def test_each_new_logical_block_costs_one_block_id_per_group():
    bm = hybrid_bm(num_blocks=10, windows=(None, 8, 8))
    seq = hybrid_seq(range(10), groups=3)
    assert bm.num_new_blocks(seq, 10) == 3 * 3
    assert bm.can_append(seq, 12) and not bm.can_append(seq, 13)  # 3 x 3 = 9 ids fit in 10, 4 x 3 do not
    assert bm.num_tokens_that_fit(seq) == 12
    bm.append(seq, 10)
    assert [len(t) for t in seq.block_tables] == [3, 3, 3] and bm.num_free_blocks == 1
    assert len({b for t in seq.block_tables for b in t}) == 9  # no block id in two groups


def compute_hybrid(bm, seq, chunk=8):
    """Admit seq (prefix cache first), then prefill it in chunks as the scheduler would."""
    seq.num_computed_tokens = seq.num_cached_tokens = bm.match_prefix(seq)
    while seq.num_computed_tokens < seq.num_tokens:
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        before = seq.num_computed_tokens
        bm.append(seq, n)
        seq.num_computed_tokens += n
        bm.on_computed(seq, before)


def test_a_repeated_long_prompt_hits_with_the_full_blocks_and_only_the_windows_tail():
    bm = hybrid_bm()
    tokens = list(range(1, 41))  # 10 blocks of 4
    a = hybrid_seq(tokens, rid="a")
    compute_hybrid(bm, a)
    bm.free(a)
    b = hybrid_seq(tokens + [99], rid="b")
    assert bm.match_prefix(b) == 40
    assert live_blocks(b, 0) == 10  # the full group shares every block
    # window 8: the next query (position 40) sees positions 33..40, so blocks 8 and 9 only
    assert b.num_freed_blocks[1] == 8 and live_blocks(b, 1) == 2
    assert all(bm.blocks[i].ref_count == 1 for i in b.block_tables[1][8:])
    bm.free(b)
    assert bm.num_free_blocks == bm.num_blocks
    bm.check_invariants()


def test_a_prefix_hit_stops_where_the_sliding_tail_was_evicted():
    bm = hybrid_bm()
    tokens = list(range(1, 41))
    a = hybrid_seq(tokens, rid="a")
    compute_hybrid(bm, a)
    bm.free(a)
    h9, _ = bm._block_hash(a, 9)
    del bm.cached[1][h9]  # the sliding group lost block 9 (evicted)
    b = hybrid_seq(tokens + [99], rid="b")
    assert bm.match_prefix(b) == 36  # stop before block 9: blocks 7 and 8 hold the window there
    assert b.num_freed_blocks[1] == 7 and live_blocks(b, 1) == 2 and live_blocks(b, 0) == 9
    bm.free(b)
    bm.check_invariants()


def test_a_prefix_hit_needs_every_full_attention_block():
    bm = hybrid_bm()
    tokens = list(range(1, 41))
    a = hybrid_seq(tokens, rid="a")
    compute_hybrid(bm, a)
    bm.free(a)
    h3, _ = bm._block_hash(a, 3)
    del bm.cached[0][h3]  # the full group lost block 3
    b = hybrid_seq(tokens + [99], rid="b")
    assert bm.match_prefix(b) == 12
    assert live_blocks(b, 0) == 3 and b.num_freed_blocks[1] == 1 and live_blocks(b, 1) == 2
    bm.free(b)
    bm.check_invariants()


def test_a_sliding_only_model_hits_a_long_prompt_whose_early_blocks_were_evicted():
    bm = BlockManager(64, 4, group_windows=(8,))
    tokens = list(range(1, 41))
    a = make_seq(tokens, rid="a")
    compute_hybrid(bm, a)
    bm.free(a)
    for i in range(4):  # blocks no query at the end can see
        h, _ = bm._block_hash(a, i)
        del bm.cached[0][h]
    b = make_seq(tokens + [99], rid="b")
    assert bm.match_prefix(b) == 40 and live_blocks(b, 0) == 2
    bm.free(b)
    bm.check_invariants()


def test_evicting_a_cached_block_forgets_it_in_its_own_groups_cache():
    bm = hybrid_bm(num_blocks=24)
    tokens = list(range(1, 41))
    a = hybrid_seq(tokens, rid="a")
    compute_hybrid(bm, a)
    bm.free(a)
    c = hybrid_seq([500 + i for i in range(40)], rid="c")  # other content takes every block
    compute_hybrid(bm, c)
    cached_ids = {b for cache in bm.cached for b in cache.values()}
    assert all(bm.blocks[b].hash is not None for b in cached_ids)
    for g, cache in enumerate(bm.cached):
        assert all(bm.blocks[b].group == g and bm.blocks[b].hash == h for h, b in cache.items())
    bm.free(c)
    b = hybrid_seq(tokens + [99], rid="b")
    assert bm.match_prefix(b) < 40  # a's blocks were taken
    bm.free(b)
    bm.check_invariants()
