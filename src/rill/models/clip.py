"""CLIP's vision tower (CLIPVisionModel without its pooled head): a class token, learned positions,
pre-layernorm, then the shared ViT encoder (rill.models.vit).

Patch embedding: a bias-free convolution with stride = patch_size; a learned class embedding goes
first; position embeddings cover num_patches + 1 tokens. transformers applies `pre_layrnorm` (sic,
its parameter name) before the encoder, and post_layernorm only to the pooled class token, which
LLaVA does not read, so it is not built here.
"""

from __future__ import annotations

import torch
from torch import nn

from rill.models.vit import Encoder, ViTConfig


class ClipEmbeddings(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.class_embedding = nn.Parameter(torch.empty(cfg.hidden_size))
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size, cfg.patch_size, bias=False)
        self.position_embedding = nn.Embedding(cfg.num_patches + 1, cfg.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [B, num_patches, hidden]
        cls = self.class_embedding.expand(len(pixels), 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class ClipVisionTower(nn.Module):
    has_class_token = True

    def __init__(self, cfg: ViTConfig, num_layers: int | None = None):
        super().__init__()
        self.config = cfg
        self.embeddings = ClipEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.encoder = Encoder(cfg, num_layers)

    def forward(self, pixels: torch.Tensor, indices: tuple[int, ...]) -> list[torch.Tensor]:
        """pixels [B, 3, image_size, image_size] -> hidden states [B, num_patches + 1, hidden] at indices."""
        return self.encoder(self.pre_layrnorm(self.embeddings(pixels)), indices)
