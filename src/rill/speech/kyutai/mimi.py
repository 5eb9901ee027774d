"""Mimi's encoder, streamed: SEANet convs -> transformer (sliding window, 25 Hz) -> stride-2 conv (12.5 Hz)
-> split residual vector quantizer -> `num_codebooks` codes per 80 ms frame.

`MimiState` is everything one stream carries between calls: the convs' last samples and the
transformer's last `sliding_window - 1` keys and values per layer, a fixed size whatever the stream's
length. Fed whole frames (multiples of `frame_size` samples), the codes are the ones the whole clip gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from rill.speech.kyutai.attention import LayerKV, RowsKV, Rotary, SelfAttention
from rill.speech.kyutai.config import MimiSpec
from rill.speech.kyutai.mimi_conv import CausalConv1d, SeanetEncoder

_ACTIVATIONS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}


@dataclass
class MimiState:
    conv_states: list = field(default_factory=list)  # one per SEANet conv, then the downsampling conv
    layers: list[LayerKV] = field(default_factory=list)
    num_steps: int = 0  # 25 Hz transformer positions consumed

    @property
    def num_bytes(self) -> int:
        convs = sum(t.numel() * t.element_size() for t in self.conv_states if t is not None)
        return convs + sum(layer.num_bytes for layer in self.layers)

    @classmethod
    def new(cls, num_convs: int, num_layers: int) -> MimiState:
        return cls([None] * num_convs, [LayerKV() for _ in range(num_layers)])


class TransformerLayer(nn.Module):
    def __init__(self, spec: MimiSpec):
        super().__init__()
        self.self_attn = SelfAttention(spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                                       spec.attention_bias)
        self.mlp = nn.ModuleDict({"fc1": nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False),
                                  "fc2": nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)})
        self.input_layernorm = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps)
        self.self_attn_layer_scale = nn.ParameterDict({"scale": nn.Parameter(torch.ones(spec.hidden_size))})
        self.mlp_layer_scale = nn.ParameterDict({"scale": nn.Parameter(torch.ones(spec.hidden_size))})
        self.act = _ACTIVATIONS[spec.hidden_act]
        self.window = spec.sliding_window

    def forward(self, x: torch.Tensor, rope, cache: LayerKV) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), rope, cache, self.window)
        x = x + self.self_attn_layer_scale["scale"] * h
        h = self.mlp["fc2"](self.act(self.mlp["fc1"](self.post_attention_layernorm(x))))
        return x + self.mlp_layer_scale["scale"] * h


class Codebooks(nn.Module):
    """One residual VQ: a 1x1 input projection, then per layer the nearest code and its residual."""

    def __init__(self, spec: MimiSpec, num_layers: int):
        super().__init__()
        self.input_proj = nn.Conv1d(spec.hidden_size, spec.vq_hidden_dim, 1, bias=False)
        # Each layer's codebook is embed_sum / cluster_usage, as the checkpoint stores it (see load).
        self.register_buffer("embed", torch.zeros(num_layers, spec.codebook_size, spec.codebook_dim))

    def encode(self, latents: torch.Tensor, num_layers: int) -> torch.Tensor:
        """latents [B, hidden, F] -> codes [B, F, num_layers]."""
        residual = self.input_proj(latents).transpose(1, 2)  # [B, F, D]
        codes = []
        for embed in self.embed[:num_layers]:
            flat = residual.reshape(-1, residual.shape[-1])
            index = torch.cdist(flat[None].float(), embed[None].float())[0].argmin(dim=-1)
            codes.append(index.view(residual.shape[:-1]))
            residual = residual - F.embedding(codes[-1], embed)
        return torch.stack(codes, dim=-1)


class MimiEncoder(nn.Module):
    """Audio frames in, codes out; parameter names follow transformers' checkpoint (`codec_model.` dropped)."""

    def __init__(self, spec: MimiSpec):
        super().__init__()
        self.spec = spec
        self.encoder = SeanetEncoder(spec)
        self.encoder_transformer = nn.ModuleDict(
            {"layers": nn.ModuleList(TransformerLayer(spec) for _ in range(spec.num_layers))})
        self.rotary = Rotary(spec.head_dim, spec.rope_theta)
        self.downsample = CausalConv1d(spec.hidden_size, spec.hidden_size, 4, stride=2, bias=False, replicate=True)
        self.semantic = Codebooks(spec, spec.num_semantic_quantizers)
        self.acoustic = Codebooks(spec, spec.num_quantizers - spec.num_semantic_quantizers)

    def new_state(self) -> MimiState:
        return MimiState.new(self.encoder.num_convs + 1, self.spec.num_layers)

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor, state: MimiState, num_codebooks: int) -> torch.Tensor:
        """audio [B, T] at 24 kHz, T a multiple of frame_size -> codes [B, T / frame_size, num_codebooks]."""
        assert audio.shape[-1] % self.spec.frame_size == 0, "Mimi streams whole frames"
        h = self.encoder(audio[:, None, :], state.conv_states)  # [B, hidden, steps]
        x = h.transpose(1, 2)
        rope = self.rotary.cos_sin(state.num_steps, x.shape[1], x.dtype)
        for layer, cache in zip(self.encoder_transformer["layers"], state.layers):
            x = layer(x, rope, cache)
        state.num_steps += x.shape[1]
        latents, state.conv_states[-1] = self.downsample(x.transpose(1, 2), state.conv_states[-1])
        return self.quantize(latents, num_codebooks)

    @torch.inference_mode()
    def encode_rows(self, audio: torch.Tensor, states: list[MimiState], num_codebooks: int) -> torch.Tensor:
        """Several streams at once: audio [B, T] (the same whole frames' length for every row), one state
        per row whose first call is behind it (a first call's conv padding is read from its own audio,
        see mimi_conv) -> codes [B, F, num_codebooks], each row's what `encode` gives it alone."""
        assert audio.shape[-1] % self.spec.frame_size == 0, "Mimi streams whole frames"
        assert all(s.num_steps for s in states), "a stream's first call runs alone"
        convs = [torch.cat([s.conv_states[i] for s in states]) for i in range(len(states[0].conv_states))]
        x = self.encoder(audio[:, None, :], convs).transpose(1, 2)  # [B, steps, hidden]
        rope = self.rotary.cos_sin_rows([s.num_steps for s in states], x.shape[1], x.dtype)
        for i, layer in enumerate(self.encoder_transformer["layers"]):
            x = layer(x, rope, RowsKV([s.layers[i] for s in states]))
        latents, convs[-1] = self.downsample(x.transpose(1, 2), convs[-1])
        for b, state in enumerate(states):
            state.num_steps += x.shape[1]
            state.conv_states = [conv[b:b + 1].clone() for conv in convs]
        return self.quantize(latents, num_codebooks)

    def quantize(self, latents: torch.Tensor, num_codebooks: int) -> torch.Tensor:
        """latents [B, hidden, F] -> codes [B, F, num_codebooks]."""
        num_semantic = self.spec.num_semantic_quantizers
        semantic = self.semantic.encode(latents, min(num_semantic, num_codebooks))
        if num_codebooks <= num_semantic:
            return semantic
        # Both quantizers read the same latents (the acoustic one is not fed the semantic residual).
        return torch.cat([semantic, self.acoustic.encode(latents, num_codebooks - num_semantic)], dim=-1)
