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

from rill.speech.kyutai.attention import LayerKV, Rotary, RowsKV, SelfAttention
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
        cols, pending = self.windows(x, pending)
        return self.apply_windows(cols).transpose(1, 2), pending

    def windows(self, x: torch.Tensor, pending: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, C, T] -> (the input windows of the outputs it completes [B, k, C * kernel], the new pending).
        A convolution as a matrix product over its windows: one product for several streams' windows
        (whatever each one's stride phase), and on CPU much cheaper than conv1d on a few columns."""
        x = torch.cat([pending, x], dim=2)
        kernel, stride = self.kernel_size[0], self.stride[0]
        count = (x.shape[2] - kernel) // stride + 1 if x.shape[2] >= kernel else 0
        cols = x[:, :, : (count - 1) * stride + kernel].unfold(2, kernel, stride) if count else x.new_zeros(
            x.shape[0], x.shape[1], 0, kernel)  # [B, C, k, kernel]
        return cols.transpose(1, 2).flatten(2), x[:, :, count * stride :]

    def apply_windows(self, cols: torch.Tensor) -> torch.Tensor:
        """[..., C * kernel] windows -> [..., C_out] outputs."""
        return F.linear(cols, self.weight.flatten(1), self.bias)


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
        return self._frames(self._layers(self._embed(mel, state), state), state)

    @torch.inference_mode()
    def stream_rows(self, mels: list[torch.Tensor], states: list[EncoderState]) -> list[torch.Tensor]:
        """Several streams' new mel frames ([1, n_mels, T_b] each, T_b may differ) -> each stream's
        completed frames [1, F_b, factor * D], what `stream` gives it alone.

        The convolutions run row by row (a stride-2 convolution's phase is each row's own, and they are
        a small share of the work); the layers run once for all rows: each row's new positions right-padded
        to the longest, every row at its own rotary position with its own sliding-window cache (RowsKV).
        Padding rather than grouping by length: a live step gives each stream what arrived since the last
        (bounded by max_frames), so lengths differ by a few positions and one forward wastes little, where
        groups would split a step into many small forwards exactly when clients send irregular pieces."""
        xs = self._embed_rows(mels, states)
        rows = [b for b, x in enumerate(xs) if x.shape[1]]
        if len(rows) > 1:
            lengths = [xs[b].shape[1] for b in rows]
            longest = max(lengths)
            x = torch.cat([F.pad(xs[b], (0, 0, 0, longest - xs[b].shape[1])) for b in rows])
            rope = self.rotary.cos_sin_rows([states[b].num_positions for b in rows], longest, x.dtype)
            for i, layer in enumerate(self.layers):
                x = layer(x, rope, RowsKV([states[b].layers[i] for b in rows], lengths))
            x = self.norm(x)
            for j, b in enumerate(rows):
                xs[b] = x[j : j + 1, : lengths[j]]
                states[b].num_positions += lengths[j]
        elif rows:
            xs[rows[0]] = self._layers(xs[rows[0]], states[rows[0]])
        return [self._frames(x, state) for x, state in zip(xs, states)]

    def _embed_rows(self, mels: list[torch.Tensor], states: list[EncoderState]) -> list[torch.Tensor]:
        """`_embed` of each row, each convolution one product over all rows' windows."""
        xs = [mel.to(self.norm.weight.dtype) for mel in mels]
        for name in ("conv1", "conv2"):
            conv = getattr(self.embedder, name)
            cols = []
            for b, state in enumerate(states):
                c, pending = conv.windows(xs[b], getattr(state, name))
                setattr(state, name, pending)
                cols.append(c[0])
            out = F.gelu(conv.apply_windows(torch.cat(cols)))  # [sum k_b, C_out]
            xs = [part.T[None] for part in out.split([c.shape[0] for c in cols])]  # [1, C_out, k_b] each
        return [x.transpose(1, 2) for x in xs]

    def _embed(self, mel: torch.Tensor, state: EncoderState) -> torch.Tensor:
        """The two causal convolutions: mel [B, n_mels, T] -> [B, T', D] new encoder positions."""
        mel = mel.to(self.norm.weight.dtype)
        h, state.conv1 = self.embedder.conv1.stream(mel, state.conv1)
        h, state.conv2 = self.embedder.conv2.stream(F.gelu(h), state.conv2)
        return F.gelu(h).transpose(1, 2)

    def _layers(self, x: torch.Tensor, state: EncoderState) -> torch.Tensor:
        """One stream's new positions [B, T', D] through the layers and the final norm."""
        if x.shape[1]:
            rope = self.rotary.cos_sin(state.num_positions, x.shape[1], x.dtype)
            for layer, cache in zip(self.layers, state.layers):
                x = layer(x, rope, cache)
            state.num_positions += x.shape[1]
            x = self.norm(x)
        return x

    def _frames(self, x: torch.Tensor, state: EncoderState) -> torch.Tensor:
        """Encoder positions -> the 80 ms frames they complete; fewer than `factor` wait for the next."""
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
