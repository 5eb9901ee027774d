"""Phi-3 (Phi3ForCausalLM): the Llama-family decoder with LongRoPE.

Phi-3's checkpoints ship `qkv_proj` and `gate_up_proj` already fused in rill's row order (q, k, v;
gate, up), so the loader copies them as they are. What Phi-3 adds is LongRoPE (transformers'
`_compute_longrope_parameters`): two sets of per-frequency divisors, `short_factor` for sequences of
at most `original_max_position_embeddings` tokens and `long_factor` past it, and cos/sin scaled by
an attention factor.

Which set applies: transformers' rotary embedding takes max(position_ids) + 1 of each forward call,
so a prompt longer than the original length is rotated with the long factors throughout. rill decides
per sequence in the same way, by the sequence's length after this step (its seq_lens entry), so a
prompt prefilled in one step, and every decode step, match transformers. Where rill differs:
- crossing while decoding: transformers' Phi3ForCausalLM.prepare_inputs_for_generation drops the KV
  cache when the sequence first passes original_max_position_embeddings and prefills it all again
  with the long factors; rill keeps the keys it cached with the short ones (as transformers' forward
  does when called step by step) and rotates only the new tokens with the long ones.
- a prompt prefilled in several chunks: a chunk that ends at or before the original length uses the
  short factors, where transformers' single forward would use the long ones.
- the prefix cache may hand a long sequence blocks that a short one computed with the short factors.
Recomputing a sequence's KV when it crosses would take the engine's preemption path; not done.
"""

from __future__ import annotations

import torch

from rill.models.attention import AttentionMetadata
from rill.models.config import ModelConfig
from rill.models.llama import CausalLM
from rill.models.rope import RotaryEmbedding


class LongRopeEmbedding(RotaryEmbedding):
    """RoPE whose inv_freq holds two rows, [short, long]; each token takes its sequence's row."""

    def frequencies(self) -> torch.Tensor:
        # [2, head_dim / 2], as transformers: 1 / (factor_i * theta ** (2i / head_dim))
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        factors = torch.tensor([self.rope.short_factor, self.rope.long_factor], dtype=torch.float32)
        return 1.0 / (factors * self.rope.theta**exponents)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, meta: AttentionMetadata | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        is_long = _sequence_lengths(positions, meta) > self.rope.original_max_position  # [T]
        freqs = positions.float()[:, None] * self.inv_freq[is_long.long()]  # [T, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = self.rope.attention_factor  # applied in float32 before the cast, as transformers does
        return (emb.cos() * scale).to(dtype)[:, None, :], (emb.sin() * scale).to(dtype)[:, None, :]


def _sequence_lengths(positions: torch.Tensor, meta: AttentionMetadata | None) -> torch.Tensor:
    """[T]: the length after this step of the sequence each token belongs to. Without metadata the
    tokens are one sequence, as in one transformers forward call."""
    if meta is None:
        return (positions.max() + 1).expand_as(positions)
    query_lens = meta.query_start_loc.diff()
    return meta.seq_lens.repeat_interleave(query_lens, output_size=positions.numel())


class Phi3CausalLM(CausalLM):
    """Llama's decoder; with `longrope` scaling its rotary embedding is LongRoPE's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        if cfg.rope.kind == "longrope":
            self.rotary = LongRopeEmbedding(cfg.rope, cfg.head_dim)
