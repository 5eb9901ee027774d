"""Paged KV cache bookkeeping: fixed-size blocks, reference counts, prefix cache, window freeing.

One pool of block ids serves every KV group (engine/kv_layout.py): a sequence holds one block
table per group, all of the same logical length; a sliding group releases the leading blocks that
left its window (their table slots stay, never read again), a full group keeps them.

A full block is keyed by a hash chained over (parent hash, its token ids), so two
sequences that share a prefix share its blocks; each group keeps its own hash -> block map.
Freed blocks that carry a hash stay findable until their id is handed out again; the free
list is kept in LRU order (least recently freed first), which makes reuse evict the coldest
cached block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq

from rill.engine.sequence import Sequence

FREED_SLOT = 0  # what a table holds for a block a sliding group never had (a prefix hit past it)


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "group")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()
        self.group = 0  # the group whose prefix cache knows it (when hash is set)


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 group_windows: Seq[int | None] = (None,)):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.group_windows = tuple(group_windows)  # per KV group: its sliding window, or None
        self.num_groups = len(self.group_windows)
        self.sliding_groups = tuple((g, w) for g, w in enumerate(self.group_windows) if w is not None)
        self.full_groups = tuple(g for g, w in enumerate(self.group_windows) if w is None)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: list[dict[int, int]] = [{} for _ in self.group_windows]  # per group: chain hash -> block id
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self.peak_used_blocks = 0  # high-water mark of num_used_blocks since the last reset_peak()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free_ids)

    def reset_peak(self) -> int:
        """The high-water mark of blocks in use since the last reset; the mark restarts at what is in use now."""
        peak, self.peak_used_blocks = self.peak_used_blocks, self.num_used_blocks
        return peak

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    # -- allocation -------------------------------------------------------------------------

    def _take(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.hash is not None and self.cached[block.group].get(block.hash) == block_id:
            del self.cached[block.group][block.hash]  # evict: its contents are about to be overwritten
        block.hash, block.token_ids, block.ref_count = None, (), 1
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
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
            self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        block.ref_count += 1

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Block ids seq's next num_new_tokens take: the new logical blocks, once in every group."""
        needed = seq.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, needed - len(seq.block_tables[0])) * self.num_groups

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def num_tokens_that_fit(self, seq: Sequence) -> int:
        """How many more tokens seq could compute with its own blocks and every free one."""
        capacity = (len(seq.block_tables[0]) + self.num_free_blocks // self.num_groups) * self.block_size
        return max(0, capacity - seq.num_computed_tokens)

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give seq the blocks to hold its next num_new_tokens tokens."""
        needed = seq.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
        for table in seq.block_tables:
            for _ in range(needed - len(table)):
                table.append(self._take())

    # -- prefix cache -----------------------------------------------------------------------

    def _block_hash(self, seq: Sequence, i: int) -> tuple[int, tuple[int, ...]]:
        """Block i's chain hash and token ids. Hashes are kept on the sequence (the token ids of
        a full block never change), so each block is hashed once, not once per block that fills
        after it: a 20,000-token session would otherwise rehash its whole history every block."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < i:  # earlier blocks first (callers go in order, so rarely any)
            self._block_hash(seq, len(hashes))
        tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
        if seq.mm_items:  # placeholders look alike: the block's key names the images in it, by content
            tokens += tuple((it.content_hash, it.offset - i * bs) for it in seq.mm_items
                            if it.offset < (i + 1) * bs and it.end > i * bs)
        if len(hashes) == i:
            hashes.append(chain_hash(hashes[-1] if i else None, tokens))
        return hashes[i], tokens

    def _lookup(self, seq: Sequence, group: int, i: int) -> int | None:
        """The cached block of group holding seq's block i, if any (token ids checked: a hash
        collision must not hand out someone else's KV)."""
        h, tokens = self._block_hash(seq, i)
        block_id = self.cached[group].get(h)
        if block_id is None or self.blocks[block_id].token_ids != tokens:
            return None
        return block_id

    def _first_visible_block(self, window: int | None, num_tokens: int) -> int:
        """The first block a query at position num_tokens can see (0 without a window)."""
        return 0 if window is None else max(0, num_tokens - window + 1) // self.block_size

    def _sliding_hit(self, seq: Sequence, group: int, window: int, num_blocks: int) -> int:
        """The most blocks m <= num_blocks after which group can go on: it holds every block
        [first visible from m, m). A miss at block j rules out every m > j, so go on below j."""
        m = num_blocks
        while m > 0:
            first = self._first_visible_block(window, m * self.block_size)
            miss = next((j for j in range(m - 1, first - 1, -1) if self._lookup(seq, group, j) is None), None)
            if miss is None:
                return m
            m = miss
        return 0

    def _num_hit_blocks(self, seq: Sequence, max_blocks: int) -> int:
        """The longest prefix, in blocks, every group can serve: a full group needs all its
        blocks, a sliding group only the ones its window still sees at the end of the prefix
        (as vLLM's hybrid manager; lowering the hit for one sliding group may break another's
        tail, so this settles to a fixed point)."""
        n = max_blocks
        for g in self.full_groups:
            n = next((i for i in range(n) if self._lookup(seq, g, i) is None), n)
        settled = False
        while not settled:
            settled = True
            for g, window in self.sliding_groups:
                m = self._sliding_hit(seq, g, window, n)
                if m < n:
                    n, settled = m, False
        return n

    def match_prefix(self, seq: Sequence) -> int:
        """For a sequence with no blocks yet: share its cached blocks; return tokens covered.

        At least one token is left to compute, since the step needs its logits. A sliding group
        shares only the blocks its window sees; the slots before them count as freed.
        """
        assert not seq.block_tables[0] and seq.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return 0
        n = self._num_hit_blocks(seq, (seq.num_tokens - 1) // self.block_size)
        for g, window in enumerate(self.group_windows):
            first = self._first_visible_block(window, n * self.block_size)
            table = seq.block_tables[g]
            table.extend([FREED_SLOT] * first)
            seq.num_freed_blocks[g] = first
            for i in range(first, n):
                block_id = self._lookup(seq, g, i)
                self._share(block_id)
                table.append(block_id)
        hit = n * self.block_size
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
        for g, table in enumerate(seq.block_tables):
            cache = self.cached[g]
            for i in range(max(first, seq.num_freed_blocks[g]), last):
                block = self.blocks[table[i]]
                if block.hash is None:
                    block.hash, block.token_ids = self._block_hash(seq, i)
                    block.group = g
                    cache.setdefault(block.hash, block.block_id)

    def on_computed(self, seq: Sequence, num_committed_before: int) -> None:
        """After a step computed seq's tokens from num_committed_before on: cache the blocks that
        filled up and free those that left a window. Both are rare in decode, so each is
        checked first (this runs for every sequence on every engine step)."""
        bs = self.block_size
        if seq.num_computed_tokens // bs != num_committed_before // bs:
            self.commit_full_blocks(seq, num_committed_before)
        freed = seq.num_freed_blocks
        for g, window in self.sliding_groups:
            if (seq.num_computed_tokens - window + 1) // bs > freed[g]:
                self.free_outside_window(seq)
                return

    # -- freeing ----------------------------------------------------------------------------

    def free(self, seq: Sequence) -> None:
        # Sliding groups first, then full ones, each tail first: in LRU order a prefix outlives
        # its continuation, and a full group's prefix (any hit needs it) outlives a window's tail.
        for g in [g for g, _ in self.sliding_groups] + list(self.full_groups):
            table = seq.block_tables[g]
            for block_id in reversed(table[seq.num_freed_blocks[g] :]):
                self._release(block_id)
        seq.clear_blocks()

    def free_outside_window(self, seq: Sequence) -> int:
        """Release the leading blocks of each sliding group that no future query can see; return
        how many were released.

        The next query is at position num_computed_tokens and sees keys > pos - window, so
        block i is dead once (i + 1) * block_size <= num_computed_tokens - window + 1.
        """
        released = 0
        freed = seq.num_freed_blocks
        for g, window in self.sliding_groups:
            table = seq.block_tables[g]
            dead = min(self._first_visible_block(window, seq.num_computed_tokens), len(table))
            while freed[g] < dead:
                self._release(table[freed[g]])
                freed[g] += 1
                released += 1
        return released

    def check_invariants(self) -> None:
        """Test helper: free list and reference counts agree."""
        for block in self.blocks:
            assert block.ref_count >= 0
            assert (block.ref_count == 0) == (block.block_id in self.free_ids), block.block_id
