"""Mimi's SEANet encoder as streaming causal convolutions.

A causal conv with (effective) kernel k and stride s pads k - s samples on the left. Streamed, that
padding is the previous call's last k - s input samples, so each conv keeps just those as its state
([B, C_in, k - s]); fed whole frames, every conv sees a multiple of its stride and the outputs are the
ones the whole clip gives (causality: an output never depends on later input). The first call's
"previous samples" are zeros, or the first sample repeated where the conv pads by replication.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rill.speech.kyutai.config import MimiSpec


class CausalConv1d(nn.Module):
    """One conv of the encoder; `conv` holds the weights under transformers' names (`....conv.weight`)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, replicate: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.num_state = (kernel - 1) * dilation + 1 - stride  # samples carried from one call to the next
        self.replicate = replicate

    def initial_state(self, x: torch.Tensor) -> torch.Tensor:
        if self.replicate:
            return x[..., :1].expand(-1, -1, self.num_state).contiguous()
        return x.new_zeros(x.shape[0], x.shape[1], self.num_state)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, C_in, T] (T a multiple of stride) -> ([B, C_out, T / stride], the next call's state)."""
        past = self.initial_state(x) if state is None else state
        full = torch.cat([past, x], dim=2) if self.num_state else x
        next_state = full[..., max(0, full.shape[2] - self.num_state):]
        return self.conv(full), next_state


class ResnetBlock(nn.Module):
    """x + conv1x1(elu(conv_k(elu(x)))): `block.1` and `block.3` as transformers numbers them."""

    def __init__(self, dim: int, hidden: int, kernel: int, dilation: int, replicate: bool):
        super().__init__()
        self.block = nn.ModuleDict({"1": CausalConv1d(dim, hidden, kernel, dilation=dilation, replicate=replicate),
                                    "3": CausalConv1d(hidden, dim, 1, replicate=replicate)})

    def convs(self) -> list[CausalConv1d]:
        return [self.block["1"], self.block["3"]]

    def forward(self, x: torch.Tensor, states: list, first: int) -> torch.Tensor:
        h, states[first] = self.block["1"](F.elu(x), states[first])
        h, states[first + 1] = self.block["3"](F.elu(h), states[first + 1])
        return x + h


class SeanetEncoder(nn.Module):
    """conv -> [resnet blocks, elu, strided conv] per ratio -> elu -> conv; 24 kHz in, 25 Hz out."""

    def __init__(self, spec: MimiSpec):
        super().__init__()
        replicate = spec.pad_mode == "replicate"
        layers: dict[str, nn.Module] = {"0": CausalConv1d(1, spec.num_filters, spec.kernel_size, replicate=replicate)}
        index, scale = 1, 1
        for ratio in reversed(spec.upsampling_ratios):
            dim = scale * spec.num_filters
            for j in range(spec.num_residual_layers):
                layers[str(index)] = ResnetBlock(dim, dim // spec.compress, spec.residual_kernel_size,
                                                 spec.dilation_growth_rate**j, replicate)
                index += 1
            index += 1  # an ELU sits here in transformers' list
            layers[str(index)] = CausalConv1d(dim, 2 * dim, 2 * ratio, stride=ratio, replicate=replicate)
            index, scale = index + 1, scale * 2
        index += 1
        layers[str(index)] = CausalConv1d(scale * spec.num_filters, spec.hidden_size, spec.last_kernel_size,
                                          replicate=replicate)
        self.layers = nn.ModuleDict(layers)
        self.num_convs = sum(len(m.convs()) if isinstance(m, ResnetBlock) else 1 for m in self.layers.values())

    def forward(self, x: torch.Tensor, states: list) -> torch.Tensor:
        """x [B, 1, T] -> [B, hidden, T / hop]; `states` (one entry per conv, None at first) is updated."""
        slot, previous = 0, None
        for name, layer in self.layers.items():
            if isinstance(layer, ResnetBlock):
                x = layer(x, states, slot)
                slot += 2
            else:
                gap = previous is not None and int(name) > int(previous) + 1
                x, states[slot] = layer(F.elu(x) if gap else x, states[slot])  # a gap in the numbering is an ELU
                slot += 1
            previous = name
        return x
