"""LlavaForConditionalGeneration: a CLIP or SigLIP vision tower, a two-layer projector, and one of
the decoders rill.models.llama runs (Llama, Mistral, Qwen2, Qwen3).

Each image's placeholder tokens (the `<image>` token, repeated tokens_per_image times by the
processor) take the projected tower features in the embedding; positions stay plain 1-D RoPE.
The engine's vision step hands `forward` 3-stream positions for steps with images; their streams
are equal for a model without M-RoPE, so the first is the position.
"""

from __future__ import annotations

import torch
from torch import nn

from rill.models.attention import AttentionMetadata
from rill.models.clip import ClipVisionTower
from rill.models.config import ModelConfig
from rill.models.llama import CausalLM
from rill.models.siglip import SiglipVisionTower
from rill.models.vit import ACTIVATIONS


class Projector(nn.Module):
    """transformers' LlavaMultiModalProjector: linear_1, activation, linear_2."""

    def __init__(self, in_dim: int, out_dim: int, act: str, bias: bool):
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, out_dim, bias=bias)
        self.act = ACTIVATIONS[act]
        self.linear_2 = nn.Linear(out_dim, out_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaModel(CausalLM):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        v = cfg.vision
        tower = ClipVisionTower if v.tower.kind == "clip" else SiglipVisionTower
        self.vision_tower = tower(v.tower, num_layers=max(v.feature_indices))  # later layers are never read
        self.multi_modal_projector = Projector(v.tower.hidden_size * len(v.feature_indices), cfg.hidden_size,
                                               v.projector_act, v.projector_bias)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata,
                mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        # input_ids [T]; positions [T] or [3, T] (equal streams); mm_embeds (rows [K], embeddings [K, hidden])
        if positions.dim() == 2:
            positions = positions[0]
        x = self.embed_tokens(input_ids)
        if mm_embeds is not None:
            rows, embeds = mm_embeds
            x[rows] = embeds.to(x.dtype)
        cos, sin = self.rotary.cos_sin(positions, x.dtype, meta)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            x = layer(x, cos, sin, kv_cache, meta.for_layer(i))
        return self.norm(x)

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """Images' pixels [N, 3, S, S] -> their placeholder embeddings [N * tokens_per_image, hidden]."""
        v = self.config.vision
        weight = self.multi_modal_projector.linear_1.weight
        states = self.vision_tower(pixels.to(weight.device, weight.dtype), v.feature_indices)
        if v.select_strategy == "default":
            states = [s[:, 1:] for s in states]
        return self.multi_modal_projector(torch.cat(states, dim=-1)).flatten(0, 1)
