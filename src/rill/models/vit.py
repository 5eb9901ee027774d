"""The transformer encoder that CLIP's and SigLIP's vision towers share (pre-norm, biased projections).

Each layer: x + attn(layer_norm1(x)), then x + mlp(layer_norm2(x)), with full (non-causal)
attention over the image's tokens. Parameter names are transformers' (`encoder.layers.N.self_attn.
q_proj`, `mlp.fc1`, ...), so checkpoints load by name. `forward` returns the hidden states a LLaVA
projector reads, in transformers' `output_hidden_states` numbering: index 0 is the encoder's input,
index i the output of layer i, and only the layers up to the highest index asked for are run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),  # SigLIP's
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True)
class ViTConfig:
    kind: str  # "clip" or "siglip"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape  # [images, tokens, hidden]

        def heads(t):
            return t.view(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class MLP(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        if cfg.hidden_act not in ACTIVATIONS:
            raise ValueError(f"vision hidden_act {cfg.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = Attention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class Encoder(nn.Module):
    def __init__(self, cfg: ViTConfig, num_layers: int | None = None):
        super().__init__()
        count = cfg.num_layers if num_layers is None else num_layers
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(count))

    def forward(self, x: torch.Tensor, indices: tuple[int, ...]) -> list[torch.Tensor]:
        """The hidden states at `indices` (0: the input; i: layer i's output), in that order."""
        states = {0: x} if 0 in indices else {}
        for i, layer in enumerate(self.layers[: max(indices)], start=1):
            x = layer(x)
            if i in indices:
                states[i] = x
        return [states[i] for i in indices]


def hidden_state_indices(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """transformers' vision_feature_layer (negative counts from the end of num_layers + 1 states)."""
    out = tuple(layer + num_layers + 1 if layer < 0 else layer for layer in layers)
    if any(not 0 <= i <= num_layers for i in out):
        raise ValueError(f"vision_feature_layer {layers} is outside the tower's {num_layers + 1} hidden states")
    return out
