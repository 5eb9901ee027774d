"""Per-step attention metadata, passed explicitly through the model (never a module global)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    # None in a step's metadata whose layers read different tables (below), so that a model that
    # skips for_layer fails loudly instead of attending through another group's blocks.
    slot_mapping: torch.Tensor | None  # [T] int64: cache slot of each new token
    block_tables: torch.Tensor | None  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32: context length after this step
    query_start_loc: torch.Tensor  # [S + 1] int32
    max_query_len: int
    # Per layer, when layers read different block tables (a model whose KV groups differ by
    # sliding window, engine/kv_layout.py): layer i's metadata, its group's slot_mapping and
    # block_tables. Empty when every layer reads the fields above.
    layers: tuple[AttentionMetadata, ...] = ()

    def for_layer(self, i: int) -> AttentionMetadata:
        """The metadata decoder layer i attends with: every model's layer loop passes this."""
        return self.layers[i] if self.layers else self
