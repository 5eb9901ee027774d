"""nn.Linear with faster CPU paths: rill's C kernel or oneDNN over weights packed once, or a swapped
product for few rows.

Packed in C (pack_for_cpu, which ModelRunner calls on its model, when rill's CPU kernels are built:
kernels/cpu_build.py): a bfloat16 CPU Linear holds its weight in pairs of features in 16-column panels
(kernels/cpu_linear_bf16.c: AVX-512 BF16 dot products, or widened to float32 for AVX2 FMAs); a float32 CPU Linear holds its weight laid out in 16-column panels and
multiplies with kernels/cpu_linear.c. Measured on a 2-core AVX2 EPYC, two threads, weights cold, against
oneDNN's packed GEMM below (`rill bench cpu-linear`): 1.29-1.53x faster at 1 and 8 rows (a decode step:
the time to stream the weights), 1.08-1.30x at 64, 0.97-1.12x at 2,048 (prefill). With AVX-512 (a 2-core
Zen 4, where oneDNN uses AVX-512 too) the kernel's wider tiles: 1.10-1.34x oneDNN at 8 rows, 0.91-1.04x at
64, 0.89-0.98x at 2,048. Every output is one chain of FMAs over the input features in order, so a row's
result does not depend on the other rows, their number, the thread count or the machine's vector width.

Packed for oneDNN (no C compiler, or RILL_CPU_KERNELS=0): the weight is reordered once into
oneDNN's blocked layout and multiplied with oneDNN's GEMM (`torch.ops.mkldnn._linear_pointwise`, the
op torch.compile's CPU freezing uses). Measured on the same machine, one thread, weights cold: at 8
rows the [32000, 768] LM head 13.7 ms against F.linear's 26.7, [4096, 768] 2.05 against 2.97; at
prefill sizes (2,048 rows) about F.linear's speed. A oneDNN-packed layer's rows do not depend on how
many rows are computed together either (checked from 1 to 39 rows against 300).

Either way the plain weight is then freed unless another module shares it (a tied LM head keeps the
embedding's, so it costs one more copy of that matrix), and a layer built with `pack=False` stays
unpacked. Both keep what chunked prefill relies on (below).

Unpacked (neither the C kernel nor oneDNN, another device or dtype, or pack=False), the few-rows path below.

y = x W^T with x [M, K] and M of 2-11 (a decode step at batch 2-11) is a skinny GEMM. torch on
the CPU hands it to MKL as C[N, M] = W^T(T) x, and MKL's kernel for that shape is slow on AVX2
(measured on a 2-core EPYC, float32, W read cold from memory: [32000, 768] at M = 8 in 28-39 ms,
where the same product posed as C[M, N] = (W x^T)^T takes 19-20 ms; [4096, 768] 3.3 vs 2.6 ms).
From 12 rows MKL runs both forms through one kernel (bitwise equal results, same speed), and at
one row both are the same GEMV, so only 2-11 rows take the swapped form.

The swapped form rounds differently in the last bits. F.linear's rows do not depend on how many
rows are computed together from 4 rows up, and chunked prefill relies on it (a prompt sent in
pieces of 9 tokens computes what the whole prompt computes, bit for bit), so the swapped form is
used only inside `decode_step(True)`, which ModelRunner enters for steps whose every sequence
adds one token: prefill and mixed steps compute exactly what they computed before.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rill.kernels import cpu_linear

FEW_ROWS = range(2, 12)  # the row counts where the swapped form is another (faster) kernel

_step = threading.local()  # per thread: the engine's worker runs the model; other threads are unaffected


@contextmanager
def decode_step(on: bool) -> Iterator[None]:
    """Within it (on this thread), Linear layers take the few-rows path when `on`."""
    before = getattr(_step, "decode", False)
    _step.decode = on
    try:
        yield
    finally:
        _step.decode = before


PACK_ROWS = 8  # the row count oneDNN lays the packed weight out for (a decode batch); any count works


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) with the CPU paths above."""

    packed: torch.Tensor | None = None  # oneDNN's reordered weight, set by pack_for_cpu
    c_packed: cpu_linear.Packed | None = None  # the C kernel's panels, set by pack_for_cpu (preferred)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, pack: bool = True, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.pack = pack  # whether pack_for_cpu packs this layer

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """out: where the C kernel may write the result (its other paths return a new tensor): use the
        return value."""
        if self.c_packed is not None:
            return cpu_linear.linear(x, self.c_packed, self.bias, out)
        if self.packed is not None:
            rows = x.reshape(-1, x.shape[-1])  # [T, in]
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
            return out.view(*x.shape[:-1], out.shape[-1])
        if not (getattr(_step, "decode", False) and _few_cpu_rows(x)):
            return super().forward(x)
        xt = x.t()  # [K, M], a view
        out = torch.mm(self.weight, xt) if self.bias is None else torch.addmm(self.bias[:, None], self.weight, xt)
        return out.t().contiguous()  # [M, N]: callers view it by heads


def _few_cpu_rows(x: torch.Tensor) -> bool:
    return x.dim() == 2 and x.shape[0] in FEW_ROWS and x.device.type == "cpu" and x.dtype == torch.float32


def pack_for_cpu(model: nn.Module) -> int:
    """Pack the weight of every float32 or bfloat16 CPU Linear in `model` for rill's C kernel (bfloat16:
    kernels/cpu_linear_bf16.c), or a float32 one for oneDNN where the kernel is not built (see the module's docstring), and free the plain weight where no other
    module shares it. Returns the number of layers packed: 0 where neither is available."""
    if not isinstance(model, nn.Module):  # a tensor-parallel driver's handle: its ranks hold the layers
        return 0
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))  # a tied weight: 2
    num_packed = 0
    for layer in model.modules():
        if not isinstance(layer, Linear) or not layer.pack or layer.packed is not None or layer.c_packed is not None:
            continue
        weight = layer.weight
        if weight.device.type != "cpu" or weight.dtype not in cpu_linear.DTYPES:
            continue
        with torch.no_grad():
            if cpu_linear.supports(weight):
                layer.c_packed = cpu_linear.pack(weight)
            elif onednn and weight.dtype == torch.float32:
                layer.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
            else:
                continue
            if uses[id(weight)] == 1:
                weight.data = torch.empty(0, dtype=weight.dtype)  # the packed copy replaces it
        num_packed += 1
    return num_packed
