"""Paged KV cache bookkeeping: fixed-size blocks, reference counts, prefix cache, window freeing.

A full block is keyed by a hash chained over (parent hash, its token ids), so two
sequences that share a prefix share its blocks. Freed blocks that carry a hash stay
findable until their id is handed out again; the free list is kept in LRU order
(least recently freed first), which makes reuse evict the coldest cached block.
"""

from __future__ import annotations

from collections import OrderedDict

from rill.engine.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    # -- allocation -------------------------------------------------------------------------

    def _take(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash is not None and self.cached.get(block.hash) == block_id:
            del self.cached[block.hash]  # evict: its contents are about to be overwritten
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"double free of block {block_id}"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_ids[block_id] = None

    def _share(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_ids[block_id]
        block.ref_count += 1

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        needed = seq.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def num_tokens_that_fit(self, seq: Sequence) -> int:
        """How many more tokens seq could compute with its own blocks and every free one."""
        capacity = (len(seq.block_table) + self.num_free_blocks) * self.block_size
        return max(0, capacity - seq.num_computed_tokens)

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give seq the blocks to hold its next num_new_tokens tokens."""
        for _ in range(self.num_new_blocks(seq, num_new_tokens)):
            seq.block_table.append(self._take())

    # -- prefix cache -----------------------------------------------------------------------

    def _block_hash(self, seq: Sequence, i: int) -> tuple[int, tuple[int, ...]]:
        """Block i's chain hash and token ids. Hashes are kept on the sequence (the token ids of
        a full block never change), so each block is hashed once, not once per block that fills
        after it: a 20,000-token session would otherwise rehash its whole history every block."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < i:  # earlier blocks first (callers go in order, so rarely any)
            self._block_hash(seq, len(hashes))
        tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
        if len(hashes) == i:
            hashes.append(chain_hash(hashes[-1] if i else None, tokens))
        return hashes[i], tokens

    def match_prefix(self, seq: Sequence) -> int:
        """For a sequence with no blocks yet: share its cached full blocks; return tokens covered.

        At least one token is left to compute, since the step needs its logits.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        for i in range(max_blocks):
            h, tokens = self._block_hash(seq, i)
            block_id = self.cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            self._share(block_id)
            seq.block_table.append(block_id)
        hit = len(seq.block_table) * self.block_size
        self.num_queried_tokens += seq.num_tokens
        self.num_hit_tokens += hit
        return hit

    def commit_full_blocks(self, seq: Sequence, num_committed_before: int) -> None:
        """Register blocks that became full and computed this step."""
        if not self.enable_prefix_caching:
            return
        first = num_committed_before // self.block_size
        last = seq.num_computed_tokens // self.block_size
        if last <= first:
            return
        for i in range(max(first, seq.num_window_freed_blocks), last):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = self._block_hash(seq, i)
                self.cached.setdefault(block.hash, block.block_id)

    def on_computed(self, seq: Sequence, num_committed_before: int, window: int | None) -> None:
        """After a step computed seq's tokens from num_committed_before on: cache the blocks that
        filled up and free those that left the window. Both are rare in decode, so each is
        checked inline first (this runs for every sequence on every engine step)."""
        bs = self.block_size
        if seq.num_computed_tokens // bs != num_committed_before // bs:
            self.commit_full_blocks(seq, num_committed_before)
        if window is not None and (seq.num_computed_tokens - window + 1) // bs > seq.num_window_freed_blocks:
            self.free_outside_window(seq, window)

    # -- freeing ----------------------------------------------------------------------------

    def free(self, seq: Sequence) -> None:
        # Release the tail first so that, in LRU order, a prefix outlives its continuation.
        for block_id in reversed(seq.block_table[seq.num_window_freed_blocks :]):
            self._release(block_id)
        seq.block_table = []
        seq.num_window_freed_blocks = 0

    def free_outside_window(self, seq: Sequence, window: int) -> int:
        """Release leading blocks no future query can see; return how many were released.

        The next query is at position num_computed_tokens and sees keys > pos - window, so
        block i is dead once (i + 1) * block_size <= num_computed_tokens - window + 1.
        """
        dead = max(0, seq.num_computed_tokens - window + 1) // self.block_size
        released = 0
        while seq.num_window_freed_blocks < min(dead, len(seq.block_table)):
            self._release(seq.block_table[seq.num_window_freed_blocks])
            seq.num_window_freed_blocks += 1
            released += 1
        return released

    def check_invariants(self) -> None:
        """Test helper: free list and reference counts agree."""
        for block in self.blocks:
            assert block.ref_count >= 0
            assert (block.ref_count == 0) == (block.block_id in self.free_ids), block.block_id
