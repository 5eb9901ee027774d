"""nn.Linear with a faster CPU path for the few rows of a decode step.

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
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

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


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) with the few-rows CPU path above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (getattr(_step, "decode", False) and _few_cpu_rows(x)):
            return super().forward(x)
        xt = x.t()  # [K, M], a view
        out = torch.mm(self.weight, xt) if self.bias is None else torch.addmm(self.bias[:, None], self.weight, xt)
        return out.t().contiguous()  # [M, N]: callers view it by heads


def _few_cpu_rows(x: torch.Tensor) -> bool:
    return x.dim() == 2 and x.shape[0] in FEW_ROWS and x.device.type == "cpu" and x.dtype == torch.float32
