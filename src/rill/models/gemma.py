"""Gemma 2 and Gemma 3 (text) over rill's paged KV cache, computed as transformers computes them.

What sets them apart from the Llama family (llama.py, whose attention they reuse):
- RMSNorm scales by (1 + weight), in float32 before the cast back;
- a norm after attention and after the MLP as well as before each, both inside the residual;
- GeGLU: gelu (tanh approximation) on the gate;
- embeddings times sqrt(hidden_size), that factor first rounded to the embedding dtype;
- attention scaled by query_pre_attn_scalar ** -0.5; Gemma 2 soft-caps attention scores
  (the kernels' softcap) and both may soft-cap the output logits;
- sliding and global layers interleaved (cfg.layer_windows); Gemma 3 rotates the sliding layers
  with their own RoPE base and normalizes q and k per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rill.models.attention import AttentionMetadata
from rill.models.gemma_config import GemmaConfig
from rill.models.llama import MLP, Attention
from rill.models.rope import RotaryEmbedding


class GemmaRMSNorm(nn.Module):
    """weight is stored centred on 0 (the checkpoint's own values); the scale applied is 1 + weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Unlike Llama, the product with the weight is taken in float32, then cast (transformers PR 29402).
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(Attention):
    def __init__(self, cfg: GemmaConfig, window: int | None):
        super().__init__(cfg, window)
        self.scale = cfg.query_pre_attn_scalar**-0.5
        self.softcap = cfg.attn_softcap
        if cfg.qk_norm:
            self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)


class GemmaMLP(MLP):
    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: GemmaConfig, window: int | None):
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = GemmaAttention(cfg, window)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GemmaMLP(cfg)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, meta):
        attn = self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


class GemmaCausalLM(nn.Module):
    """Token ids of one engine step (all sequences flattened) -> hidden states -> logits; the
    interface of llama.CausalLM."""

    def __init__(self, cfg: GemmaConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, w) for w in cfg.layer_windows)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)
        self.local_rotary = RotaryEmbedding(cfg.local_rope, cfg.head_dim) if cfg.local_rope else self.rotary

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [T]; kv_caches: one (k_cache, v_cache) per layer -> hidden [T, hidden]
        x = self.embed(input_ids)
        global_rope = self.rotary.cos_sin(positions, x.dtype)  # (cos, sin), each [T, 1, head_dim]
        local_rope = global_rope if self.local_rotary is self.rotary else self.local_rotary.cos_sin(positions, x.dtype)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            cos, sin = local_rope if layer.self_attn.window else global_rope
            x = layer(x, cos, sin, kv_cache, meta.for_layer(i))  # its KV group's block table
        return self.norm(x)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # sqrt(hidden) rounded to the weights' dtype first, as transformers scales (sqrt(3072) is 55.5 in bf16)
        weight = self.embed_tokens.weight
        # (a host number, not a tensor copied to the device: a captured CUDA graph allows no such copy)
        scale = float(torch.tensor(self.config.hidden_size**0.5).to(weight.dtype))
        return self.embed_tokens(input_ids) * scale

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # capped in the head's dtype, then widened, in transformers' order
        return soft_cap(self.lm_head(hidden), self.config.final_softcap).float()
