"""Vision encoder outputs, kept by content hash so that each image or frame is encoded once.

An entry is held while some sequence still has placeholder tokens of that item to compute (a
reference per sequence); once every holder has the item's tokens in its KV cache, or was aborted,
finished or preempted, the entry becomes freeable: it stays, least recently used first out, while
the cache holds fewer than `capacity_tokens` embeddings, so the same picture sent again soon is not
encoded again. Held entries are never evicted (a step that needs them may exceed the capacity).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class EncoderCache:
    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens
        self.entries: dict[str, torch.Tensor] = {}  # content hash -> embeddings [num_tokens, hidden]
        self.holders: dict[str, set[int]] = {}  # content hash -> ids of the sequences that hold it
        self.freeable: OrderedDict[str, None] = OrderedDict()  # unheld entries, least recently used first
        self.num_tokens = 0  # embeddings stored
        self.num_encoded_items = 0  # items the encoder ran for (a hit does not count)
        # Lookups, once per sequence and item when the sequence starts to hold it (again after a
        # preemption): found here or being encoded in the same step (a hit), or to encode (a miss).
        self.num_hits = 0
        self.num_misses = 0

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    @property
    def num_held_tokens(self) -> int:
        return sum(self.entries[k].shape[0] for k, h in self.holders.items() if h and k in self.entries)

    @property
    def num_holders(self) -> int:
        return sum(len(h) for h in self.holders.values())

    def get(self, key: str) -> torch.Tensor:
        return self.entries[key]

    def acquire(self, key: str, holder: int) -> bool:
        """Hold key's entry for holder; True when holder did not hold it yet."""
        holders = self.holders.setdefault(key, set())
        is_new = holder not in holders
        holders.add(holder)
        self.freeable.pop(key, None)
        return is_new

    def count_lookup(self, hit: bool) -> None:
        if hit:
            self.num_hits += 1
        else:
            self.num_misses += 1

    def release(self, key: str, holder: int) -> None:
        holders = self.holders.get(key)
        if holders is None or holder not in holders:
            return
        holders.discard(holder)
        if not holders:
            del self.holders[key]
            if key in self.entries:
                self.freeable[key] = None
                self._evict()

    def put(self, key: str, embeddings: torch.Tensor) -> None:
        """Store an item's encoder output (its holders acquired it when the step was scheduled)."""
        if key in self.entries:
            return
        self.entries[key] = embeddings
        self.num_tokens += embeddings.shape[0]
        self.num_encoded_items += 1
        if key not in self.holders:
            self.freeable[key] = None
        self._evict()

    def _evict(self) -> None:
        while self.num_tokens > self.capacity_tokens and self.freeable:
            key, _ = self.freeable.popitem(last=False)
            self.num_tokens -= self.entries.pop(key).shape[0]

    def check_invariants(self) -> None:
        """Test helper: counts agree, freeable entries have no holder."""
        assert self.num_tokens == sum(e.shape[0] for e in self.entries.values())
        assert all(k not in self.holders for k in self.freeable)
        assert all(k in self.entries for k in self.freeable)
