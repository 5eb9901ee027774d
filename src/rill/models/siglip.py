"""SigLIP's vision tower (SiglipVisionModel without its attention-pooling head): patches with learned
positions, no class token, no pre-norm, then the shared ViT encoder (rill.models.vit).

The patch convolution has a bias; position embeddings cover num_patches tokens. post_layernorm and
the pooling head feed SigLIP's image embedding, not the hidden states LLaVA reads, so they are not
built here.
"""

from __future__ import annotations

import torch
from torch import nn

from rill.models.vit import Encoder, ViTConfig


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size, cfg.patch_size)
        self.position_embedding = nn.Embedding(cfg.num_patches, cfg.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [B, num_patches, hidden]
        return patches + self.position_embedding.weight


class SiglipVisionTower(nn.Module):
    has_class_token = False

    def __init__(self, cfg: ViTConfig, num_layers: int | None = None):
        super().__init__()
        self.config = cfg
        self.embeddings = SiglipEmbeddings(cfg)
        self.encoder = Encoder(cfg, num_layers)

    def forward(self, pixels: torch.Tensor, indices: tuple[int, ...]) -> list[torch.Tensor]:
        """pixels [B, 3, image_size, image_size] -> hidden states [B, num_patches, hidden] at indices."""
        return self.encoder(self.embeddings(pixels), indices)
