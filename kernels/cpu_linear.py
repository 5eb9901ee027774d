"""Linear layers on the CPU in C (kernels/cpu_linear.c, kernels/cpu_linear_bf16.c): y = x W^T + b over a
weight packed once.

`pack(weight)` lays a float32 or bfloat16 [N, K] weight out in 16-column panels for the kernel (the
same bytes as the weight, plus padding to 16 columns, and for bfloat16 to an even K);
`linear(x, packed, bias)` multiplies, x in the weight's dtype (a bfloat16 layer returns bfloat16, or
float32 into a float32 `out`). models/linear.py packs every float32 and bfloat16 CPU Linear this way
when the library is built (kernels/cpu_build.py), and keeps torch's oneDNN otherwise. A row's result does not depend on the other rows, their number or
the thread count (see the C file), which is what chunked prefill and batched decoding rely on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rill.kernels import cpu_build

PANEL = 16  # output columns per panel, as in cpu_linear.c
_ALIGN = 16  # 4-byte elements: 64 bytes, what the kernel's aligned loads need (a zmm register with AVX-512)
DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class Packed:
    # the panels, 64-byte aligned (a view of its buffer): float32 [ceil(N/16) * K * 16], or for a bfloat16
    # weight int32 words of two bfloat16 each, [ceil(N/16) * ceil(K/2) * 16]
    data: torch.Tensor
    out_features: int
    in_features: int
    dtype: torch.dtype = torch.float32  # the weight's, which x must have


def supports(weight: torch.Tensor) -> bool:
    """Whether a Linear with this weight can run in C (else torch's oneDNN or F.linear)."""
    return (weight.device.type == "cpu" and weight.dtype in DTYPES and weight.dim() == 2
            and cpu_build.library() is not None)


def pack(weight: torch.Tensor) -> Packed:
    """Lay out a float32 or bfloat16 [N, K] CPU weight for `linear` (a copy; the weight is left as it is)."""
    weight = weight.detach().contiguous()
    n, k = weight.shape
    bf16 = weight.dtype == torch.bfloat16
    size = -(-n // PANEL) * PANEL * (-(-k // 2) if bf16 else k)
    buffer = torch.empty(size + _ALIGN, dtype=torch.int32 if bf16 else torch.float32)
    offset = (-(buffer.data_ptr() // 4)) % _ALIGN
    data = buffer[offset:offset + size]
    lib = cpu_build.library()
    (lib.rill_linear_pack_bf16 if bf16 else lib.rill_linear_pack_f32)(weight.data_ptr(), n, k, data.data_ptr())
    return Packed(data, n, k, weight.dtype)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] on the CPU, in the weight's dtype -> [..., N] (into out, contiguous with as many elements,
    if given; a bfloat16 layer may write a float32 out)."""
    k = packed.in_features
    if x.shape[-1] != k:
        raise ValueError(f"input has {x.shape[-1]} features, the layer takes {k}")
    rows = x.reshape(-1, k)
    if rows.dtype != packed.dtype:
        raise TypeError(f"the C linear layer over {packed.dtype} weights takes {packed.dtype}, not {rows.dtype}")
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if packed.dtype == torch.bfloat16:
        return _linear_bf16(x, rows, packed, bias, out)
    if out is None:
        out = torch.empty(rows.shape[0], packed.out_features, dtype=torch.float32)
    elif not (out.is_contiguous() and out.dtype == torch.float32 and out.numel() == rows.shape[0] * packed.out_features):
        raise ValueError(f"out must be a contiguous float32 tensor of {rows.shape[0]} x {packed.out_features}")
    if bias is not None:
        bias = bias.detach().contiguous()
    status = cpu_build.library().rill_linear_f32(
        rows.data_ptr(), rows.stride(0), packed.data.data_ptr(), None if bias is None else bias.data_ptr(),
        out.data_ptr(), rows.shape[0], packed.out_features, k, torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError(f"rill_linear_f32: no scratch for {rows.shape[0]} rows of {k}")
    return out.view(*x.shape[:-1], packed.out_features)


def _linear_bf16(x, rows, packed: Packed, bias, out) -> torch.Tensor:
    n = packed.out_features
    if out is None:
        out = torch.empty(rows.shape[0], n, dtype=torch.bfloat16)
    elif not (out.is_contiguous() and out.dtype in DTYPES and out.numel() == rows.shape[0] * n):
        raise ValueError(f"out must be a contiguous bfloat16 or float32 tensor of {rows.shape[0]} x {n}")
    if bias is not None:
        bias = bias.detach().to(torch.bfloat16).contiguous()
    status = cpu_build.library().rill_linear_bf16(
        rows.data_ptr(), rows.stride(0), packed.data.data_ptr(), None if bias is None else bias.data_ptr(),
        out.data_ptr(), int(out.dtype == torch.float32), rows.shape[0], n, packed.in_features,
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError(f"rill_linear_bf16: no scratch for {rows.shape[0]} rows of {packed.in_features}")
    return out.view(*x.shape[:-1], n)
