"""Per-step attention metadata, passed explicitly through the model (never a module global)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32: context length after this step
    query_start_loc: torch.Tensor  # [S + 1] int32
    max_query_len: int
