"""How the layers share the paged KV cache: layers grouped by sliding window, one block table per group.

A model whose layers all attend alike (Llama, Mistral, Qwen) has one group: layer i reads its own
cache tensor through the sequence's one block table, as it always did. A model that interleaves
sliding-window and full-attention layers (Gemma 2 and 3, Qwen2 with max_window_layers) splits its
layers into groups of the same size k, each group with one window (or none) and its own block
table per sequence. The cache holds k tensors for K and k for V, and the j-th layer of every group
reads the j-th: a block id from the one shared pool is a page of k layers' KV for block_size
tokens, owned by exactly one group at a time. A sliding group frees its pages once they leave the
window, a full group keeps them, so a long sequence costs about
    full layers x length + sliding layers x window
tokens of per-layer KV instead of all layers x length.

This is the layout of vLLM's hybrid KV cache manager (docs.vllm.ai, design/hybrid_kv_cache_manager):
k is the smallest number of layers that share a window; a window whose layer count is not a
multiple of k pads its last group (those pages leave a slot unused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayout:
    group_windows: tuple[int | None, ...]  # per group: its layers' sliding window, None for full attention
    layer_group: tuple[int, ...]  # per layer: the group whose block table it reads
    layer_slot: tuple[int, ...]  # per layer: which of the k cache tensors it reads
    layers_per_group: int  # k: a page holds KV of k layers

    @classmethod
    def for_windows(cls, layer_windows: Sequence[int | None]) -> KVLayout:
        windows = list(dict.fromkeys(layer_windows))  # distinct, in the order of their first layer
        layers_of = {w: [i for i, lw in enumerate(layer_windows) if lw == w] for w in windows}
        k = min(len(layers) for layers in layers_of.values())
        group_windows: list[int | None] = []
        layer_group, layer_slot = [0] * len(layer_windows), [0] * len(layer_windows)
        for w in windows:
            layers = layers_of[w]
            for start in range(0, len(layers), k):
                for slot, layer in enumerate(layers[start : start + k]):
                    layer_group[layer], layer_slot[layer] = len(group_windows), slot
                group_windows.append(w)
        return cls(tuple(group_windows), tuple(layer_group), tuple(layer_slot), k)

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    @property
    def num_padded_slots(self) -> int:
        """Layer slots of a page that no layer uses (0 unless a window's layers do not divide by k)."""
        return self.num_groups * self.layers_per_group - len(self.layer_group)

    def page_bytes(self, block_size: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
        """Bytes of one block id: K and V of block_size tokens in k layers."""
        return 2 * self.layers_per_group * block_size * num_kv_heads * head_dim * itemsize

    def max_blocks(self, num_tokens: int, block_size: int, chunk_tokens: int) -> int:
        """Blocks one sequence of num_tokens can hold at once over all groups: a sliding group
        holds its window, the prefill chunk being computed and the block being written."""
        total = 0
        for w in self.group_windows:
            n = num_tokens if w is None else min(num_tokens, w + chunk_tokens + block_size)
            total += -(-n // block_size)
        return total

    def min_blocks(self, num_tokens: int, block_size: int) -> int:
        """Blocks a sequence of num_tokens needs to make progress alone, one token per step if it
        must: every block in a full group; in a sliding group the window's worth plus the block
        being written and one the window has not yet let go of."""
        total = 0
        for w in self.group_windows:
            if w is None:
                total += -(-num_tokens // block_size)
            else:
                total += -(-min(num_tokens, w + block_size) // block_size) + 1
        return total
