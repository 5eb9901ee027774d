"""Voxtral Realtime's text decoder: a Mistral-like stack (RMSNorm, rotary grouped-query attention over a
sliding window, gated SiLU MLP, tied embeddings) whose input at position p is the sum of one text token's
embedding and frame p's audio embedding.

The delay conditions every MLP: a sinusoidal embedding of the number of delay tokens, through each layer's
`ada_rms_norm` (linear to 32, GELU, linear back), scales the MLP's normalised input by (1 + that). The
delay is fixed for a stream, so the scales are computed once when the stream starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from rill.speech.kyutai.attention import LayerKV, Rotary, RowsKV, SelfAttention
from rill.speech.kyutai.decoder import RMSNorm
from rill.speech.voxtral_realtime.config import LayerStack, VoxtralSpec
from rill.speech.voxtral_realtime.encoder import GatedMLP

_TIME_THETA = 10000.0  # transformers' VoxtralRealtimeTimeEmbedding


@dataclass
class DecoderState:
    scales: list[torch.Tensor]  # per layer [1, 1, D]: 1 + ada_rms_norm(time embedding of the delay)
    layers: list[LayerKV] = field(default_factory=list)
    num_positions: int = 0  # positions so far (the KV keeps only the last window - 1)


class AdaNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear1 = nn.Linear(dim, 32, bias=False)
        self.linear2 = nn.Linear(32, dim, bias=False)

    def forward(self, t_cond: torch.Tensor) -> torch.Tensor:
        return self.linear2(F.gelu(self.linear1(t_cond)))


class DecoderLayer(nn.Module):
    def __init__(self, s: LayerStack):
        super().__init__()
        self.self_attn = SelfAttention(s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, bias=False)
        self.mlp = GatedMLP(s.hidden_size, s.intermediate_size, s.hidden_act, down_bias=False)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.ada_rms_norm = AdaNorm(s.hidden_size)
        self.window = s.sliding_window

    def forward(self, x: torch.Tensor, rope, cache: LayerKV, scale: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, self.window)
        return x + self.mlp(self.post_attention_layernorm(x) * scale)


def time_embedding(num_delay_tokens: int, dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[dim]: cos and sin of the delay (in tokens) at dim / 2 geometric frequencies."""
    half = dim // 2
    inv_freq = torch.exp(-math.log(_TIME_THETA) * torch.arange(half, device=device).float() / half).to(dtype)
    angle = torch.full((1,), num_delay_tokens, dtype=dtype, device=device) * inv_freq
    return torch.cat((angle.cos(), angle.sin()))


class TextDecoder(nn.Module):
    """Parameter names as transformers' `model.language_model` (the lm_head lives beside it)."""

    def __init__(self, spec: VoxtralSpec):
        super().__init__()
        s = spec.decoder
        self.embed_tokens = nn.Embedding(spec.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.rotary = Rotary(s.head_dim, s.rope_theta)

    @torch.inference_mode()
    def new_state(self, num_delay_tokens: int) -> DecoderState:
        weight = self.norm.weight
        t_cond = time_embedding(num_delay_tokens, weight.shape[0], weight.dtype, weight.device)[None, None]
        scales = [1 + layer.ada_rms_norm(t_cond) for layer in self.layers]
        return DecoderState(scales, [LayerKV() for _ in self.layers])

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, audio: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """tokens [B, T], audio [B, T, D] (frames at the same positions) -> hidden states [B, T, D]."""
        x = self.embed_tokens(tokens) + audio.to(self.norm.weight.dtype)
        rope = self.rotary.cos_sin(state.num_positions, x.shape[1], x.dtype)
        for layer, cache, scale in zip(self.layers, state.layers, state.scales):
            x = layer(x, rope, cache, scale)
        state.num_positions += x.shape[1]
        return self.norm(x)

    @torch.inference_mode()
    def forward_rows(self, tokens: torch.Tensor, audio: torch.Tensor, states: list[DecoderState]) -> torch.Tensor:
        """One position for each of several streams (row b at its own position, with its own cache and delay):
        tokens [B, 1], audio [B, 1, D] -> hidden states [B, 1, D], each row's what `forward` gives it alone."""
        x = self.embed_tokens(tokens) + audio.to(self.norm.weight.dtype)
        rope = self.rotary.cos_sin_rows([s.num_positions for s in states], 1, x.dtype)
        for i, layer in enumerate(self.layers):
            scale = torch.cat([s.scales[i] for s in states])
            x = layer(x, rope, RowsKV([s.layers[i] for s in states]), scale)
        for state in states:
            state.num_positions += 1
        return self.norm(x)
