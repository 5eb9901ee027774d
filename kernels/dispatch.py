"""One signature per operation; the tensors' device picks the backend."""

from __future__ import annotations

import torch

from rill.kernels import reference


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    if _use_triton(k_cache):
        from rill.kernels import triton_attn

        return triton_attn.write_kv(key, value, k_cache, v_cache, slot_mapping)
    return reference.write_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=None, out=None):
    if _use_triton(query):
        from rill.kernels import triton_attn

        return triton_attn.paged_attention(
            query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, out
        )
    return reference.paged_attention(
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, out
    )
