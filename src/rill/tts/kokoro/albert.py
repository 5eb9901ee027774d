"""Kokoro's text encoder for durations: ALBERT (one transformer layer's weights shared by every layer).

Parameter names are the checkpoint's (transformers' AlbertModel layout), so `bert` loads as shipped;
the pooler the checkpoint also holds is unused (Kokoro reads the last hidden state) and not loaded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """ALBERT's default activation, GELU's tanh approximation, written out term by term: torch's
    fused F.gelu(approximate="tanh") rounds differently, and a last-bit difference here can grow into
    an audible one (see prosody.py on the pitch), so rill computes what the reference computes."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class AlbertEmbeddings(nn.Module):
    def __init__(self, vocab_size: int, embedding_size: int, max_positions: int, eps: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, embedding_size)
        self.position_embeddings = nn.Embedding(max_positions, embedding_size)
        self.token_type_embeddings = nn.Embedding(2, embedding_size)  # Kokoro uses type 0 only
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x + self.position_embeddings(positions))


class AlbertAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, hidden = x.shape
        return x.view(batch, steps, self.heads, hidden // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, H], every token real (rill runs ALBERT one utterance at a time, unpadded)."""
        q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
        scale = 1 / math.sqrt(q.shape[-1])
        attended = F.scaled_dot_product_attention(q, k, v, scale=scale)
        attended = attended.transpose(1, 2).reshape(x.shape)
        return self.LayerNorm(x + self.dense(attended))


class AlbertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.attention = AlbertAttention(hidden, heads, eps)
        self.ffn = nn.Linear(hidden, intermediate)
        self.ffn_output = nn.Linear(intermediate, hidden)
        self.full_layer_layer_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return self.full_layer_layer_norm(x + self.ffn_output(gelu_new(self.ffn(x))))


class AlbertEncoder(nn.Module):
    """num_hidden_groups = inner_group_num = 1, as every Kokoro config has it: one shared layer."""

    def __init__(self, embedding_size: int, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.embedding_hidden_mapping_in = nn.Linear(embedding_size, hidden)
        group = nn.Module()
        group.albert_layers = nn.ModuleList([AlbertLayer(hidden, heads, intermediate, eps)])
        self.albert_layer_groups = nn.ModuleList([group])


class Albert(nn.Module):
    def __init__(self, plbert: dict, vocab_size: int):
        super().__init__()
        eps = float(plbert.get("layer_norm_eps", 1e-12))
        embedding_size = int(plbert.get("embedding_size", 128))
        self.num_layers = int(plbert["num_hidden_layers"])
        self.max_positions = int(plbert["max_position_embeddings"])
        self.embeddings = AlbertEmbeddings(vocab_size, embedding_size, self.max_positions, eps)
        self.encoder = AlbertEncoder(
            embedding_size, int(plbert["hidden_size"]), int(plbert["num_attention_heads"]),
            int(plbert["intermediate_size"]), eps,
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> the last hidden state [B, T, H]."""
        x = self.encoder.embedding_hidden_mapping_in(self.embeddings(ids))
        layer = self.encoder.albert_layer_groups[0].albert_layers[0]
        for _ in range(self.num_layers):
            x = layer(x)
        return x
