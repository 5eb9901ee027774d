"""Paged attention on the CPU: decode rows in C (kernels/cpu_attn.c), prefill chunks in torch.

Same signature and rule as kernels/reference.py, which stays the oracle and the fallback: the C
path takes float32 or bfloat16 caches (kernels/cpu_attn_bf16.c) with a head_dim up to 256, and
everything else (a float16 cache, the library unavailable: kernels/cpu_build.py says why, once) takes
the reference.

A decode query reads each key and value row of its window once, straight from the page that holds
it. A prefill chunk (q_len > 1) keeps the reference's per-sequence SDPA, whose matrix products are
where a chunk's time belongs.
"""

from __future__ import annotations

import torch

from rill.kernels import cpu_build, reference

MAX_HEAD_DIM = 256


def supports(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the C decode path takes these tensors (else the reference does): all float32 or all bfloat16."""
    return (query.device.type == "cpu" and query.dtype in (torch.float32, torch.bfloat16)
            and k_cache.dtype == query.dtype and v_cache.dtype == query.dtype
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and query.shape[-1] <= MAX_HEAD_DIM and cpu_build.library() is not None)


def paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=None, out=None,
                    max_query_len=None, softcap=None):
    if not supports(query, k_cache, v_cache):
        return reference.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                         window, out, max_query_len, softcap=softcap)
    return reference.attend_step(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, out,
                                 softcap, decode)


def decode(query, k_cache, v_cache, block_tables, seq_lens, scale, window, softcap) -> torch.Tensor:
    """One query per sequence: query [S, H, D] -> [S, H, D] in its dtype (float32 or bfloat16), in C."""
    if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
        query = query.contiguous()
    tables = block_tables.to(torch.int32).contiguous()  # no copy when it already is
    lens = seq_lens.to(torch.int32).contiguous()
    num_seqs, num_heads, dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty(num_seqs, num_heads, dim, dtype=query.dtype)
    lib = cpu_build.library()
    status = (lib.rill_paged_decode_bf16 if query.dtype == torch.bfloat16 else lib.rill_paged_decode_f32)(
        query.data_ptr(), query.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
        tables.stride(0), lens.data_ptr(), num_seqs, num_heads, num_kv_heads, dim, block_size, window or 0,
        scale, softcap or 0.0, out.data_ptr(), torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"rill_paged_decode ({query.dtype}) failed ({num_heads} heads, {num_kv_heads} KV heads, dim {dim})")
    return out
