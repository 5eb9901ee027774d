"""The Kyutai STT decoder: a Llama-like stack (RMSNorm, rotary, sliding window, gated MLP) whose input at
each position is the sum of one text token's embedding and one audio frame's code embeddings.

Position 0 holds the text BOS and every codebook's audio BOS; position p >= 1 holds the text token
sampled at p - 1 and the codes of frame p - 1, and its logits choose the text token for p + 1. The text
is thus one frame behind the audio it was sampled from, plus whatever delay the model was trained with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from rill.speech.kyutai.attention import LayerKV, RowsKV, Rotary, SelfAttention
from rill.speech.kyutai.config import KyutaiSpec

_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


@dataclass
class DecoderState:
    layers: list[LayerKV] = field(default_factory=list)
    num_positions: int = 0  # positions in the stream so far (the KV keeps only the last window - 1)

    @property
    def num_bytes(self) -> int:
        return sum(layer.num_bytes for layer in self.layers)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


class GatedMLP(nn.Module):
    """fc1 writes [gate | up]; fc2 reads act(gate) * up."""

    def __init__(self, dim: int, ffn_dim: int, act: str):
        super().__init__()
        self.fc1 = nn.Linear(dim, ffn_dim, bias=False)
        self.fc2 = nn.Linear(ffn_dim // 2, dim, bias=False)
        self.act = _ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).unflatten(-1, (2, -1)).unbind(-2)
        return self.fc2(self.act(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: KyutaiSpec):
        super().__init__()
        self.self_attn = SelfAttention(spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim, False)
        self.mlp = GatedMLP(spec.hidden_size, spec.ffn_dim, spec.hidden_act)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.window = spec.sliding_window

    def forward(self, x: torch.Tensor, rope, cache: LayerKV) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, self.window)
        return x + self.mlp(self.post_attention_layernorm(x))


class KyutaiDecoder(nn.Module):
    """Parameter names follow transformers' checkpoint (`model.` prefix and `.linear` dropped)."""

    def __init__(self, spec: KyutaiSpec):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.embed_rows, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.rotary = Rotary(spec.head_dim, spec.rope_theta)
        offsets = spec.vocab_size + torch.arange(spec.num_codebooks) * spec.codebook_vocab_size
        self.register_buffer("offsets", F.pad(offsets, (1, 0)), persistent=False)  # text ids are not shifted

    def new_state(self) -> DecoderState:
        return DecoderState([LayerKV() for _ in range(self.spec.num_layers)])

    def embed(self, text: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """text [B], codes [B, K] -> [B, 1, D]: the sum of 1 + K embeddings."""
        ids = torch.cat([text[:, None], codes], dim=1)
        ids = torch.where(ids == self.spec.audio_pad_token_id, ids, ids + self.offsets)
        return self.embed_tokens(ids).sum(dim=1, keepdim=True)

    def first_inputs(self, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        text = torch.full((batch,), self.spec.bos_token_id, dtype=torch.long, device=device)
        codes = torch.full((batch, self.spec.num_codebooks), self.spec.audio_bos_token_id, dtype=torch.long,
                           device=device)
        return text, codes

    @torch.inference_mode()
    def step(self, text: torch.Tensor, codes: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """One position for every row: text [B], codes [B, K] -> logits [B, vocab] (float32)."""
        x = self.embed(text, codes)
        rope = self.rotary.cos_sin(state.num_positions, 1, x.dtype)
        for layer, cache in zip(self.layers, state.layers):
            x = layer(x, rope, cache)
        state.num_positions += 1
        return self.lm_head(self.norm(x))[:, 0].float()

    @torch.inference_mode()
    def step_rows(self, text: torch.Tensor, codes: torch.Tensor, states: list[DecoderState]) -> torch.Tensor:
        """One position for each of several streams (row b at its own position, with its own cache):
        text [B], codes [B, K] -> logits [B, vocab] (float32), each row's what `step` gives it alone."""
        x = self.embed(text, codes)
        rope = self.rotary.cos_sin_rows([s.num_positions for s in states], 1, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, RowsKV([s.layers[i] for s in states]))
        for state in states:
            state.num_positions += 1
        return self.lm_head(self.norm(x))[:, 0].float()
