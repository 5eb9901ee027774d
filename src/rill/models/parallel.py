"""Tensor parallelism for rill's decoders, Megatron-style (Shoeybi et al. 2019, section 3).

Each rank holds a slice of every large matrix:
- column-parallel (output features split): qkv_proj, gate_up_proj, the experts' gate_up: plain
  nn.Linear / parameters of the rank's size; the rank computes its heads or its part of the
  intermediate activations with no communication;
- row-parallel (input features split): o_proj, down_proj, the experts' down: each rank's product is
  a partial sum; one all-reduce after attention and one after the MLP make it whole;
- the embedding and the LM head are split by vocabulary rows: a rank looks up only the ids it holds
  (one all-reduce adds the rows), and the head's logits shards are gathered on rank 0, which samples.

A decoder is built at a rank's size by building it from `shard_config(cfg, size)`, whose head and
intermediate counts are the rank's, and then `parallelize` swaps the row-parallel and vocabulary
modules in (same parameter names, so the loader fills them by name). Everything else (norms, RoPE,
routers, q/k norms) is replicated; so is the residual stream, which every rank holds whole.

KV heads are split like the query heads when there are at least as many as ranks; with fewer, each
is replicated on size / num_kv_heads ranks (rank r holds head r * num_kv_heads // size), as vLLM does.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from rill.distributed.group import TPGroup
from rill.errors import ModelLoadError
from rill.models.config import ModelConfig
from rill.models.moe import Experts, SparseMoeBlock


def kv_heads_per_rank(num_kv_heads: int, size: int) -> int:
    return max(1, num_kv_heads // size)


def padded_vocab_per_rank(vocab_size: int, size: int) -> int:
    """Rows of the embedding and LM head each rank holds (the last one padded with zero rows)."""
    return -(-vocab_size // size)


def check_divisible(cfg: ModelConfig, size: int) -> None:
    """Raise ModelLoadError unless the model splits over `size` ranks."""
    need = [("num_attention_heads", cfg.num_heads), ("intermediate_size", cfg.intermediate_size)]
    if cfg.moe is not None:
        need.append(("moe intermediate_size", cfg.moe.intermediate_size))
    if cfg.num_kv_heads >= size:
        need.append(("num_key_value_heads", cfg.num_kv_heads))
    for name, value in need:
        if value % size:
            raise ModelLoadError(f"tensor_parallel_size {size} does not divide {name} {value}")
    if cfg.num_kv_heads < size and size % cfg.num_kv_heads:
        raise ModelLoadError(f"tensor_parallel_size {size} is neither a divisor nor a multiple of "
                             f"num_key_value_heads {cfg.num_kv_heads}")


def shard_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The config one rank's decoder is built from: its share of the heads and intermediate sizes."""
    check_divisible(cfg, size)
    moe = cfg.moe and dataclasses.replace(cfg.moe, intermediate_size=cfg.moe.intermediate_size // size)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // size, intermediate_size=cfg.intermediate_size // size,
                               num_kv_heads=kv_heads_per_rank(cfg.num_kv_heads, size), moe=moe)


class RowParallelLinear(nn.Module):
    """y = x W^T + b with x's features (W's columns) split over the ranks: [T, in / size] -> [T, out].
    The partial products are summed by one all-reduce; the bias, replicated, is added once after it."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: TPGroup):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class ParallelExperts(Experts):
    """The experts with each one's intermediate features split over the ranks (gate_up by rows, down by
    columns): each rank's output is a partial sum over its slice, made whole by one all-reduce."""

    def __init__(self, moe, hidden_size: int, group: TPGroup):
        super().__init__(moe, hidden_size)
        self.group = group

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(super().forward(x, experts, weights))


class VocabParallelEmbedding(nn.Module):
    """Rank r holds vocabulary rows [r * rows, (r + 1) * rows); ids outside give zero rows, and one
    all-reduce adds the ranks' lookups, so each id's row comes from exactly one rank."""

    def __init__(self, vocab_size: int, hidden_size: int, group: TPGroup):
        super().__init__()
        self.group = group
        rows = padded_vocab_per_rank(vocab_size, group.size)
        self.start = group.rank * rows
        self.weight = nn.Parameter(torch.empty(rows, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start  # [T]
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)  # [T, hidden]
        return self.group.all_reduce(out.masked_fill_(outside[:, None], 0))


class ParallelLMHead(nn.Module):
    """Logits of rank r's vocabulary rows; rank 0 gathers the shards into [N, vocab_size]. Other ranks
    return their own shard, which nobody reads (only rank 0 samples)."""

    def __init__(self, vocab_size: int, hidden_size: int, group: TPGroup):
        super().__init__()
        self.group, self.vocab_size = group, vocab_size
        self.weight = nn.Parameter(torch.empty(padded_vocab_per_rank(vocab_size, group.size), hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shard = F.linear(hidden, self.weight)  # [N, rows]
        parts = self.group.gather_to_first(shard)
        return shard if parts is None else torch.cat(parts, dim=-1)[:, : self.vocab_size]


def parallelize(model: nn.Module, cfg: ModelConfig, group: TPGroup) -> None:
    """Swap the row-parallel and vocabulary modules into a decoder built from shard_config(cfg, size)
    (on the meta device: the swapped-out modules never held memory). `cfg` is the whole model's."""
    local = model.config
    model.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, group)
    model.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, group)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    for i, layer in enumerate(model.layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not isinstance(getattr(attn, "o_proj", None), nn.Linear) or mlp is None:
            raise ModelLoadError(f"{cfg.architecture}: layer {i} is not a decoder layer tensor parallelism "
                                 "knows (self_attn.o_proj and an MLP)")
        attn.o_proj = RowParallelLinear(attn.o_proj.in_features, cfg.hidden_size, cfg.o_bias, group)
        if isinstance(mlp, SparseMoeBlock):
            mlp.experts = ParallelExperts(local.moe, cfg.hidden_size, group)
        else:
            mlp.down_proj = RowParallelLinear(mlp.down_proj.in_features, cfg.hidden_size, cfg.mlp_bias, group)
