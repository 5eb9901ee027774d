"""A decoder layer's elementwise work on the CPU in C (kernels/cpu_glue.c): RMSNorm (with the residual
add before it), the rotary embedding with the KV cache write, and the gated MLP's SiLU-times-up.

models/llama.py calls these for float32 or bfloat16 CPU tensors (kernels/cpu_glue_bf16.c) when the
library is built (kernels/cpu_build.py) and keeps its torch code otherwise; each function here computes
what that torch code computes in the tensors' dtype, one row at a time (a row's result does not depend
on the other rows or the thread count).
"""

from __future__ import annotations

import threading

import torch

from rill.kernels import cpu_build


DTYPES = (torch.float32, torch.bfloat16)


def supports(*tensors: torch.Tensor) -> bool:
    """Whether these tensors can go to the C glue (on the CPU, all float32 or all bfloat16, the library built)."""
    dtype = tensors[0].dtype
    return (dtype in DTYPES and all(t.device.type == "cpu" and t.dtype == dtype for t in tensors)
            and cpu_build.library() is not None)


_scratch = threading.local()  # per thread: the engine's worker reuses its buffers every layer and step


def scratch(name: str, rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A [rows, cols] buffer (float32 unless dtype says) of this thread's, the same memory at every call with this name: for
    an activation that is dead before the next call asks for it (a layer's qkv, its norm's output,
    its MLP's gate_up). A fresh tensor of 2 MB or more costs its page faults every time (with huge
    pages, 2 MB zeroed per fault): at a prefill chunk of 2,048 rows those outweighed the ops."""
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    key = (name, dtype, torch.is_inference_mode_enabled())  # an inference tensor is read-only outside it
    buf = buffers.get(key)
    if buf is None or buf.numel() < rows * cols:
        buf = buffers[key] = torch.empty(rows * cols, dtype=dtype)
    return buf[: rows * cols].view(rows, cols)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension. With delta, x += delta first, in
    place (x must then be contiguous): the residual stream's add and the next norm in one pass. out:
    where to write (contiguous, x's size), else a new tensor."""
    dim = x.shape[-1]
    if delta is not None:
        if not x.is_contiguous():
            raise ValueError("rms_norm with a delta updates x in place: x must be contiguous")
        delta = delta.contiguous()
    else:
        x = x.contiguous()
    out = torch.empty_like(x) if out is None else out.view(x.shape)
    lib = cpu_build.library()
    (lib.rill_rms_norm_bf16 if x.dtype == torch.bfloat16 else lib.rill_rms_norm_f32)(
        x.data_ptr(), None if delta is None else delta.data_ptr(), weight.detach().contiguous().data_ptr(), eps,
        out.data_ptr(), x.numel() // dim, dim, torch.get_num_threads(),
    )
    return out


def rotary_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """The fused qkv projection's output [T, (H + 2 Hkv) D] -> q [T, H, D] (a view of qkv), rotated;
    k rotated and, with v, written to the cache slots (a negative slot: not written). qkv is changed
    in place. cos, sin: [T, 1, D] (models/rope.py); caches [N, B, Hkv, D] contiguous."""
    rows, width = qkv.shape
    dim = width // (num_heads + 2 * num_kv_heads)
    if qkv.stride(1) != 1:
        raise ValueError("qkv's rows must be contiguous")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    cos, sin = cos.reshape(rows, dim).contiguous(), sin.reshape(rows, dim).contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    lib = cpu_build.library()
    (lib.rill_rotary_kv_bf16 if qkv.dtype == torch.bfloat16 else lib.rill_rotary_kv_f32)(
        qkv.data_ptr(), qkv.stride(0), rows, num_heads, num_kv_heads, dim, cos.data_ptr(), sin.data_ptr(),
        k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), torch.get_num_threads(),
    )
    return qkv[:, : num_heads * dim].view(rows, num_heads, dim)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[..., 2 I] -> [..., I]: silu(gate) * up, gate and up the two halves (out: where, contiguous)."""
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    shape = (*gate_up.shape[:-1], inter)
    out = torch.empty(shape, dtype=gate_up.dtype) if out is None else out.view(shape)
    lib = cpu_build.library()
    (lib.rill_silu_mul_bf16 if gate_up.dtype == torch.bfloat16 else lib.rill_silu_mul_f32)(
        gate_up.data_ptr(), gate_up.numel() // (2 * inter), inter, out.data_ptr(), torch.get_num_threads())
    return out
