"""One signature per operation; the tensors' device picks the backend.

CUDA tensors go to the Triton kernels, others to kernels/cpu_attn.py (decode in C over float32
caches, the torch reference for the rest). With
TRITON_INTERPRET=1 in the environment, CPU tensors go to the Triton kernels too, run by
Triton's interpreter (slow: for tests of the kernels without a GPU).
"""

from __future__ import annotations

import os

import torch

from rill.kernels import cpu_attn, reference


def _use_triton(t: torch.Tensor) -> bool:
    return _triton_runs_on(t.device)


def _triton_runs_on(device: torch.device) -> bool:
    return device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def check_head_dim(head_dim: int, device: torch.device) -> None:
    """Refuse at load, not at the first attention call, a head size the device's kernels cannot run:
    the Triton kernels take powers of two from 16 (the CPU kernels take any)."""
    if _triton_runs_on(torch.device(device)):
        from rill.kernels import triton_attn

        try:
            triton_attn.check_head_dim(head_dim)
        except ValueError as e:
            raise ValueError(f"{e}: rill's Triton attention kernels ({device.type}) cannot run this model; "
                             "the CPU kernels can (--device cpu)") from None


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    if _use_triton(k_cache):
        from rill.kernels import triton_attn

        return triton_attn.write_kv(key, value, k_cache, v_cache, slot_mapping)
    return reference.write_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=None, out=None,
    max_query_len=None, softcap=None,
):
    """max_query_len: the largest q_len in the batch (or an upper bound), if the caller knows it;
    it spares the Triton path a device sync when choosing between decode and prefill.
    softcap: attention logit soft-capping (Gemma 2), None for none."""
    backend = cpu_attn
    if _use_triton(query):
        from rill.kernels import triton_attn as backend
    return backend.paged_attention(
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, out, max_query_len,
        softcap=softcap,
    )
