"""Prompt logprobs (SamplingParams.prompt_logprobs): the logprob of each prompt token given the
tokens before it, as /v1/completions' echo with logprobs returns them (lm-evaluation-harness
scores answers this way).

A prefill chunk that computes positions [begin, end) has the hidden state of position p predict
token p + 1, so the chunk scores prompt tokens begin + 1 .. end (those still inside the prompt).
The scoring runs only for sequences that asked for it; every other step is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rill.engine.scheduler import ScheduledBatch
from rill.engine.sequence import Sequence
from rill.outputs import TokenLogprob

# Rows scored at once: bounds the float32 [rows, vocab] log-softmax of a long prefill chunk.
MAX_ROWS_PER_PASS = 512


@dataclass(frozen=True)
class PromptSpan:
    """One sequence's prompt tokens that this step scores."""

    seq: Sequence
    rows: slice  # into the step's hidden states [num_batched_tokens, hidden]
    target_ids: list[int]  # the prompt tokens those rows predict


def prompt_spans(batch: ScheduledBatch, owed: set[Sequence]) -> list[PromptSpan]:
    """The spans of the batch's sequences in `owed` whose chunk reaches prompt tokens not yet scored."""
    spans, offset = [], 0
    for seq, num_new, before in zip(batch.seqs, batch.num_new_tokens, batch.num_computed):
        if seq in owed:
            # Tokens first..last (inclusive) are predicted by positions first-1..last-1 of this chunk.
            first = max(before + 1, len(seq.prompt_logprobs))  # a recompute skips what was scored
            last = min(before + num_new, seq.num_prompt_tokens - 1)
            if first <= last:
                rows = slice(offset + first - 1 - before, offset + last - before)
                spans.append(PromptSpan(seq, rows, seq.token_ids[first : last + 1]))
        offset += num_new
    return spans


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """Each row's logprob of its token, its rank and the top num_top, from raw logits [R, V] (the
    model's own distribution, as for sampled tokens)."""
    logprobs = logits.float().log_softmax(dim=-1)  # [R, V]
    ids = torch.tensor(token_ids, dtype=torch.long, device=logits.device)
    chosen = logprobs.gather(1, ids[:, None])  # [R, 1]
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    top_values, top_ids = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)  # [R, num_top]
    rows = zip(token_ids, chosen[:, 0].tolist(), ranks, top_ids.tolist(), top_values.tolist())
    return [TokenLogprob(t, lp, rank, list(zip(ids_, values))) for t, lp, rank, ids_, values in rows]
