"""Voxtral Realtime's audio encoder, run causally over a stream, and the projector into the decoder.

Log-mel frames [n_mels, T] pass two causal convolutions (kernel 3; the second of stride 2, so one
encoder position per 20 ms), then a stack of pre-norm layers (RMSNorm, rotary multi-head attention over a
sliding window, a gated SiLU MLP), then a final RMSNorm. Every `downsample_factor` (4) consecutive
positions are concatenated, one 80 ms frame, and projected (linear, GELU, linear) to one decoder-sized
embedding.

Whatever sizes the mel frames arrive in, the result is the same: each convolution keeps the inputs it has
not yet used (at most kernel - stride + stride - 1 columns), each attention layer its last window - 1 keys
and values, and fewer than 4 finished positions wait for their frame to complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from rill.speech.kyutai.attention import LayerKV, Rotary, SelfAttention
from rill.speech.kyutai.decoder import RMSNorm
from rill.speech.voxtral_realtime.config import LayerStack, VoxtralSpec

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


class GatedMLP(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, act: str, down_bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=down_bias)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class CausalConv(nn.Conv1d):
    """A causal Conv1d that streams: `pending` [B, C, n] holds the inputs the next output still needs."""

    @property
    def left_pad(self) -> int:
        return self.kernel_size[0] - self.stride[0]

    def initial(self, batch: int) -> torch.Tensor:
        return self.weight.new_zeros(batch, self.in_channels, self.left_pad)  # zeros before the first input

    def stream(self, x: torch.Tensor, pending: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, C, T] -> (outputs [B, C_out, k], the new pending)."""
        x = torch.cat([pending, x], dim=2)
        kernel, stride = self.kernel_size[0], self.stride[0]
        count = (x.shape[2] - kernel) // stride + 1 if x.shape[2] >= kernel else 0
        out = super().forward(x[:, :, : (count - 1) * stride + kernel]) if count else x.new_zeros(
            x.shape[0], self.out_channels, 0)
        return out, x[:, :, count * stride :]


class EncoderLayer(nn.Module):
    def __init__(self, s: LayerStack):
        super().__init__()
        self.self_attn = SelfAttention(s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, bias=True)
        self.self_attn.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)  # Whisper's
        self.self_attn_layer_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.final_layer_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = GatedMLP(s.hidden_size, s.intermediate_size, s.hidden_act, down_bias=True)
        self.window = s.sliding_window

    def forward(self, x: torch.Tensor, rope, cache: LayerKV) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), rope, cache, self.window)
        return x + self.mlp(self.final_layer_norm(x))


class Embedder(nn.Module):
    def __init__(self, num_mel_bins: int, dim: int):
        super().__init__()
        self.conv1 = CausalConv(num_mel_bins, dim, kernel_size=3)
        self.conv2 = CausalConv(dim, dim, kernel_size=3, stride=2)


@dataclass
class EncoderState:
    conv1: torch.Tensor
    conv2: torch.Tensor
    layers: list[LayerKV] = field(default_factory=list)
    num_positions: int = 0  # encoder positions so far (20 ms each)
    waiting: torch.Tensor | None = None  # [B, < factor, D]: positions of a frame not yet complete


class AudioTower(nn.Module):
    """Parameter names as transformers' `model.audio_tower`."""

    def __init__(self, spec: VoxtralSpec):
        super().__init__()
        s = spec.encoder
        self.factor = spec.downsample_factor
        self.embedder = Embedder(spec.num_mel_bins, s.hidden_size)
        self.layers = nn.ModuleList(EncoderLayer(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.rotary = Rotary(s.head_dim, s.rope_theta)

    def new_state(self, batch: int = 1) -> EncoderState:
        conv = self.embedder
        return EncoderState(conv.conv1.initial(batch), conv.conv2.initial(batch), [LayerKV() for _ in self.layers])

    @torch.inference_mode()
    def stream(self, mel: torch.Tensor, state: EncoderState) -> torch.Tensor:
        """mel [B, n_mels, T] -> [B, F, factor * D]: the 80 ms frames completed (F may be 0)."""
        mel = mel.to(self.norm.weight.dtype)
        h, state.conv1 = self.embedder.conv1.stream(mel, state.conv1)
        h, state.conv2 = self.embedder.conv2.stream(F.gelu(h), state.conv2)
        x = F.gelu(h).transpose(1, 2)  # [B, T', D]
        if x.shape[1]:
            rope = self.rotary.cos_sin(state.num_positions, x.shape[1], x.dtype)
            for layer, cache in zip(self.layers, state.layers):
                x = layer(x, rope, cache)
            state.num_positions += x.shape[1]
            x = self.norm(x)
        if state.waiting is not None:
            x = torch.cat([state.waiting, x], dim=1)
        whole = x.shape[1] - x.shape[1] % self.factor
        state.waiting = x[:, whole:]
        return x[:, :whole].reshape(x.shape[0], whole // self.factor, self.factor * x.shape[2])


class Projector(nn.Module):
    """Parameter names as transformers' `model.multi_modal_projector`."""

    def __init__(self, spec: VoxtralSpec):
        super().__init__()
        dim = spec.decoder.hidden_size
        self.linear_1 = nn.Linear(spec.encoder.hidden_size * spec.downsample_factor, dim, bias=False)
        self.linear_2 = nn.Linear(dim, dim, bias=False)
        self.act = ACTIVATIONS[spec.projector_act]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(frames)))
