"""Paged KV bookkeeping: allocation, prefix sharing, LRU eviction, sliding-window freeing."""

import pytest

from rill.engine.block_manager import BlockManager
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
    bm = BlockManager(num_blocks=64, block_size=bs)
    seq = make_seq([1], block_size=bs)
    bm.append(seq, 1)
    seq.num_computed_tokens = 1
    peak = 0
    for step in range(200):
        seq.append_token(step)
        bm.append(seq, 1)
        seq.num_computed_tokens += 1
        bm.free_outside_window(seq, window)
        live = len(seq.block_table) - seq.num_window_freed_blocks
        peak = max(peak, live)
        # every position a future query may see (>= next_pos - window + 1) is still held
        oldest_visible = max(0, seq.num_computed_tokens - window + 1)
        assert seq.num_window_freed_blocks * bs <= oldest_visible
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
        bm.on_computed(seq, before, None)
    assert len(calls) == 25 and len(set(calls)) == 25
    again = make_seq(tokens + [0])
    assert bm.match_prefix(again) == 100
    bm.check_invariants()
