"""Prefill attention: rill's Triton kernel against torch's flash SDPA at the roofline's shapes (issue 55, item 2).

    python3 benchmarks/prefill-attention.py [--out DIR]

kernels/bench.py compares one prefill shape (4 x 4096 tokens, 32 heads of 128, 8 KV heads: 0.72x flash on an
H200 with the default tiles). This one runs the shapes of `rill bench roofline`'s prefill cells: Qwen2-0.5B's
attention (14 heads of 64, 2 KV heads, no window) and the kernel bench's (32 of 128, 8 KV heads), one sequence
and four, 1024 / 4096 / 8192 tokens, causal, bfloat16, 16-token pages laid out in order. Each side's time is a
triton.testing.do_bench median; the ratio is flash's time over ours (1.0 or more: level or ahead). The outputs
are compared first (relative L2 error against flash).

On the CPU (no CUDA; run with TRITON_INTERPRET=1) it checks itself at tiny shapes (RILL_PREFILL_TINY=1 sets
them), timing the interpreter against SDPA's math backend: the numbers mean nothing, the code path is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
PAGE = 16
# (name, query heads, KV heads, head_dim)
SHAPES = [("qwen2-0.5b", 14, 2, 64), ("bench-32x128", 32, 8, 128)]
CASES = [(1, 1024), (1, 4096), (1, 8192), (4, 4096)]
TINY_SHAPES, TINY_CASES = [("tiny", 4, 2, 16)], [(1, 32), (2, 48)]


def import_triton_attn():
    try:
        from rill.kernels import triton_attn
    except ImportError:  # rill not installed: kernels/ by hand, as kernels/bench.py does
        sys.path.insert(0, str(ROOT / "kernels"))
        import triton_attn
    return triton_attn


def median_us(fn, cuda: bool) -> float:
    if cuda:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[1] * 1e6


def one_case(triton_attn, heads: int, kv_heads: int, dim: int, batch: int, length: int, device: str) -> dict:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(batch * length, heads, dim, device=device, dtype=dtype)
    k, v = (torch.randn(batch * length, kv_heads, dim, device=device, dtype=dtype) for _ in "kv")
    tables = torch.arange(batch * length // PAGE, dtype=torch.int32, device=device).view(batch, -1)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    starts = torch.arange(0, batch * length + 1, length, dtype=torch.int32, device=device)
    out = torch.full_like(q, float("nan"))  # every element must be written
    k_cache, v_cache = k.view(-1, PAGE, kv_heads, dim), v.view(-1, PAGE, kv_heads, dim)

    def ours():
        return triton_attn.paged_attention(q, k_cache, v_cache, tables, seq_lens, starts, dim**-0.5, None, out, length)

    qs, ks, vs = (x.view(batch, length, -1, dim).transpose(1, 2) for x in (q, k, v))

    def flash():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.FLASH_ATTENTION if device == "cuda" else SDPBackend.MATH
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

    ours()
    want = flash().transpose(1, 2).reshape(out.shape).float()
    flops = 4 * batch * heads * dim * length * (length + 1) / 2
    row = {"batch": batch, "length": length, "heads": heads, "kv_heads": kv_heads, "head_dim": dim,
           "rel_err_vs_flash": float((out.float() - want).norm() / want.norm())}
    cuda = device == "cuda"
    row["triton_us"], row["flash_us"] = median_us(ours, cuda), median_us(flash, cuda)
    row |= {"triton_tflops": flops / row["triton_us"] / 1e6, "flash_tflops": flops / row["flash_us"] / 1e6,
            "flash_over_triton": row["flash_us"] / row["triton_us"]}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench-results")))
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tiny = device == "cpu" or os.environ.get("RILL_PREFILL_TINY") == "1"
    triton_attn = import_triton_attn()
    rows = []
    for name, heads, kv_heads, dim in TINY_SHAPES if tiny else SHAPES:
        for batch, length in TINY_CASES if tiny else CASES:
            row = {"shape": name, **one_case(triton_attn, heads, kv_heads, dim, batch, length, device)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            assert row["rel_err_vs_flash"] < 1e-2, row  # bfloat16 operands: 1e-3 to 1e-2; NaN fails too
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "prefill-attention.json").write_text(json.dumps(report, indent=1))
    print(f"\n{'shape':>13} {'batch':>5} {'length':>6} {'triton us':>10} {'flash us':>9} {'TFLOP/s':>8} "
          f"{'flash/ours':>10}")
    for r in rows:
        print(f"{r['shape']:>13} {r['batch']:>5} {r['length']:>6} {r['triton_us']:>10.0f} {r['flash_us']:>9.0f} "
              f"{r['triton_tflops']:>8.0f} {r['flash_over_triton']:>9.2f}x")


if __name__ == "__main__":
    main()
