"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over rill's paged KV cache.

Projections are fused (qkv, gate_up) for fewer matmuls per layer; the loader maps
Hugging Face's separate tensors into them.
Their Linear takes a faster CPU path for a decode step's few rows (models/linear.py). On the CPU in
float32 or bfloat16 the elementwise work between the matrix products (RMSNorm with the residual add, the rotary
embedding with the KV write, SiLU-times-up) runs in C when rill's kernels are built
(kernels/cpu_glue.py), one pass each instead of a dozen torch operators.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rill import kernels
from rill.kernels import cpu_glue
from rill.models.attention import AttentionMetadata
from rill.models.config import ModelConfig
from rill.models.linear import Linear
from rill.models.rope import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_glue.supports(x, self.weight):
            return cpu_glue.rms_norm(x, self.weight, self.eps)
        # float32 statistics, as transformers computes them
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int | None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.window = window
        self.scale = cfg.head_dim**-0.5
        self.softcap: float | None = None  # attention logit soft-capping (Gemma 2 sets it)

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata):
        k_cache, v_cache = kv_cache
        glue = self.q_norm is None and cpu_glue.supports(x, cos, k_cache, v_cache)
        # on the C path qkv lives in this thread's scratch: q, a view of it, is dead once attended
        qkv = self.qkv_proj(x, out=cpu_glue.scratch("qkv", x.shape[0], self.q_size + 2 * self.kv_size, x.dtype)
                           if glue else None)
        if glue:
            # one pass in C: q and k rotated in qkv, k and v written to their cache slots
            q = cpu_glue.rotary_write_kv(qkv, cos, sin, self.num_heads, self.num_kv_heads, k_cache, v_cache,
                                         meta.slot_mapping)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(-1, self.num_heads, self.head_dim)  # [T, H, D]
            k = k.view(-1, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
            v = v.view(-1, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            kernels.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = kernels.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, self.scale, self.window,
            max_query_len=meta.max_query_len, softcap=self.softcap,  # known on the host: no device sync
        )
        return self.o_proj(out.flatten(1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x):
        if cpu_glue.supports(x):  # both intermediates in this thread's scratch: dead after down_proj
            rows = x.numel() // x.shape[-1]
            gate_up = self.gate_up_proj(x, out=cpu_glue.scratch("gate_up", rows, 2 * self.intermediate, x.dtype))
            return self.down_proj(cpu_glue.silu_mul(gate_up, out=cpu_glue.scratch("act", rows, self.intermediate,
                                                                                   x.dtype)))
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int | None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, window)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv_cache, meta):
        if x.dim() == 2 and x.is_contiguous() and cpu_glue.supports(x, self.post_attention_layernorm.weight,
                                                                     self.input_layernorm.weight):
            # The residual stream x is the step's own (the embedding's output, then each layer's):
            # updated in place, the attention's add fused into the next norm's pass.
            # The norms' outputs share one scratch buffer: each is dead once the next projection read it.
            first, second = self.input_layernorm, self.post_attention_layernorm
            norm = cpu_glue.scratch("norm", *x.shape, x.dtype)
            attn = self.self_attn(cpu_glue.rms_norm(x, first.weight, first.eps, out=norm), cos, sin, kv_cache, meta)
            h = cpu_glue.rms_norm(x, second.weight, second.eps, delta=attn, out=norm)
            return x.add_(self.mlp(h))
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Token ids of one engine step (all sequences flattened) -> hidden states -> logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, w) for w in cfg.layer_windows)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [T]; kv_caches: one (k_cache, v_cache) per layer -> hidden [T, hidden]
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype, meta)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            x = layer(x, cos, sin, kv_cache, meta.for_layer(i))  # its KV group's block table
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
