"""Pooling requests: a prompt run as prefill only, its hidden states pooled into one vector
(/v1/embeddings). Decoder embedders (Qwen3-Embedding, gte-Qwen2) take the last token's final
hidden state; sentence-transformers' `1_Pooling/config.json` may ask for the mean instead.

A prefill chunk that computes positions [begin, end) of a sequence holds their hidden states in
rows [offset, offset + end - begin) of the step's output. Last-token pooling reads the row of the
prompt's last position; mean pooling sums every position once (a recompute after preemption
skips the positions already summed, and a mean-pooled prompt takes no prefix-cache hit, as a
prompt scored for logprobs takes none: cached positions would never be computed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rill.engine.scheduler import ScheduledBatch
from rill.engine.sequence import Sequence

POOLING_MODES = ("last", "mean")


class Pooler:
    """One sequence's pooled state: the running float32 sum (mean) or the last row (last)."""

    def __init__(self, mode: str):
        if mode not in POOLING_MODES:
            raise ValueError(f"pooling mode {mode!r}: rill pools with one of {', '.join(POOLING_MODES)}")
        self.mode = mode
        self.num_pooled_tokens = 0  # prompt positions already in `total`
        self.total: torch.Tensor | None = None  # [hidden] float32

    @property
    def needs_every_position(self) -> bool:
        return self.mode == "mean"

    def first_position(self, begin: int, num_prompt_tokens: int) -> int:
        """The first position of a chunk starting at `begin` that this pooler still reads."""
        if self.mode == "last":
            return num_prompt_tokens - 1
        return max(begin, self.num_pooled_tokens)

    def add(self, rows: torch.Tensor, end: int) -> None:
        """rows: [n, hidden], the hidden states of the positions up to `end` (exclusive) not yet pooled."""
        summed = rows.float().sum(dim=0)
        self.total = summed if self.total is None or self.mode == "last" else self.total + summed
        self.num_pooled_tokens = end

    def result(self) -> list[float]:
        """The pooled vector, not normalized: a client's `dimensions` truncates it first (Matryoshka)."""
        vector = self.total / max(self.num_pooled_tokens, 1) if self.mode == "mean" else self.total
        return vector.tolist()


@dataclass(frozen=True)
class PoolSpan:
    """The rows of one step's hidden states that one sequence's pooler reads."""

    seq: Sequence
    rows: slice
    end: int  # the position after the last row


def pool_spans(batch: ScheduledBatch) -> list[PoolSpan]:
    """The spans of the batch's pooling sequences whose chunk reaches positions they still read."""
    spans, offset = [], 0
    for seq, num_new, before in zip(batch.seqs, batch.num_new_tokens, batch.num_computed):
        pooler = seq.pooler
        if pooler is not None:
            end = min(before + num_new, seq.num_prompt_tokens)
            first = pooler.first_position(before, seq.num_prompt_tokens)
            if first < end:
                spans.append(PoolSpan(seq, slice(offset + first - before, offset + end - before), end))
        offset += num_new
    return spans


def add_pooled(hidden: torch.Tensor, spans: list[PoolSpan]) -> None:
    """Each span's rows of the step's hidden states [num_batched_tokens, hidden] into its pooler."""
    for span in spans:
        span.seq.pooler.add(hidden[span.rows], span.end)
