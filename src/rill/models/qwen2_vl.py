"""Qwen2-VL and Qwen2.5-VL: the Qwen2 decoder with M-RoPE, plus the vision tower.

M-RoPE (multimodal rotary embedding): each position is three numbers (time, row, column). A text
token has the same number in all three; an image's tokens share a time and take their row and
column in the merged grid (rill.multimodal.mrope). The head's frequencies are split into
mrope_section sections, and section i rotates by stream i % 3. When the three streams are equal
this is plain RoPE, so a step of text-only sequences passes 1-D positions and pays nothing extra.
"""

from __future__ import annotations

import torch

from rill.models.attention import AttentionMetadata
from rill.models.config import ModelConfig
from rill.models.llama import CausalLM
from rill.models.qwen2_vl_vision import VisionTower
from rill.models.rope import RotaryEmbedding


class MRotaryEmbedding(RotaryEmbedding):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.rope, cfg.head_dim)
        self.sections = tuple(cfg.mrope_section)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, meta: AttentionMetadata | None = None):
        if positions.dim() == 1:
            return super().cos_sin(positions, dtype, meta)
        freqs = positions.float()[..., None] * self.inv_freq  # [3, T, D/2]
        parts = freqs.split(self.sections, dim=-1)
        freqs = torch.cat([part[i % 3] for i, part in enumerate(parts)], dim=-1)  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


class Qwen2VLModel(CausalLM):
    """CausalLM whose step may carry vision embeddings for some of its rows, and 3-stream positions."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.rotary = MRotaryEmbedding(cfg)
        self.visual = VisionTower(cfg.vision)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata,
                mm_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        # input_ids [T]; positions [T] or [3, T]; mm_embeds: (rows [K], embeddings [K, hidden]) that
        # replace those rows' token embeddings (the image and video placeholders of this step)
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
        """Items' patches -> their placeholder embeddings [sum of num_tokens, hidden], item after item."""
        dtype = self.visual.patch_embed.proj.weight.dtype
        return self.visual(pixels.to(self.embed_tokens.weight.device, dtype), grids)
