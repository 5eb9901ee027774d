"""GPU benchmark of the paged decode kernel against copy bandwidth and torch SDPA (flash).

    python3 kernels/bench.py [--out DIR] [--no-sweep]

Decode at batch 1/16/64 x context 1k/4k/16k, sliding window 4096, bf16, 32 query heads,
8 KV heads, head_dim 128, 16-token pages scattered at random over the cache. Bytes
counted: the KV a query needs (min(context, window) tokens) + q + out. SDPA (flash
backend) gets the same keys and values contiguous, the window's last tokens only.
Inputs are rotated when one set would sit in L2; times are triton.testing.do_bench
medians (host launch cost included) and CUDA-graph replay medians. A table is printed
last; full numbers go to DIR/bench.json (DIR: --out, else $OUT, else bench-results/).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

ROOT = Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, HEAD_DIM, PAGE, WINDOW = 32, 8, 128, 16, 4096
BATCHES, CONTEXTS = (1, 16, 64), (1024, 4096, 16384)


def import_triton_attn():
    """rill.kernels.triton_attn, mapping kernels/ by hand where rill is not installed."""
    try:
        from rill.kernels import triton_attn
    except ImportError:
        sys.path.insert(0, str(ROOT / "src"))
        spec = importlib.util.spec_from_file_location(
            "rill.kernels", ROOT / "kernels" / "__init__.py", submodule_search_locations=[str(ROOT / "kernels")]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["rill.kernels"] = module
        spec.loader.exec_module(module)
        from rill.kernels import triton_attn
    return triton_attn


def median_us(fn, graph: bool = False) -> float:
    if graph:
        return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def rotating(calls):
    counter = itertools.count()
    return lambda: calls[next(counter) % len(calls)]()


def copy_bandwidth_gbs() -> float:
    src = torch.randn(2**29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / median_us(lambda: dst.copy_(src)) / 1e3


class DecodeShape:
    """Paged inputs (several copies when small) and the same keys contiguous for SDPA."""

    def __init__(self, batch: int, context: int, copies: int):
        self.batch, self.context = batch, context
        self.visible = min(context, WINDOW)
        first_block = (context - self.visible) // PAGE
        blocks = context // PAGE - first_block
        total = copies * batch * blocks
        shape = (total + 1, PAGE, KV_HEADS, HEAD_DIM)
        self.k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        self.v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        freed = total  # blocks outside the window point here; NaN proves they are never read
        self.k_cache[freed] = self.v_cache[freed] = float("nan")
        ids = torch.randperm(total, device="cuda").to(torch.int32).view(copies, batch, blocks)
        self.tables = torch.full((copies, batch, context // PAGE), freed, dtype=torch.int32, device="cuda")
        self.tables[:, :, first_block:] = ids
        self.queries = torch.randn(copies, batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        self.starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        self.out = torch.empty_like(self.queries[0])
        self.scale = HEAD_DIM**-0.5

    def bytes_moved(self) -> int:
        kv = 2 * self.batch * self.visible * KV_HEADS * HEAD_DIM * 2
        return kv + 2 * self.queries[0].numel() * 2

    def triton_call(self, triton_attn, copy: int, num_splits=None):
        args = (self.queries[copy], self.k_cache, self.v_cache, self.tables[copy], self.seq_lens, self.starts,
                self.scale, WINDOW, self.out, 1)
        return lambda: triton_attn.paged_attention(*args, num_splits=num_splits)

    def contiguous_kv(self, copy: int):
        # [B, Hkv, visible, D]: the visible pages gathered in order.
        first_block = (self.context - self.visible) // PAGE
        ids = self.tables[copy, :, first_block:].long()
        k, v = (c[ids].flatten(1, 2).transpose(1, 2).contiguous() for c in (self.k_cache, self.v_cache))
        return k, v


def sdpa_call(q, k, v, scale, expand: bool):
    # q: [B, H, 1, D]; k, v: [B, Hkv, L, D]. expand: repeat KV heads, for a flash backend without GQA.
    if expand:
        k, v = (x.repeat_interleave(HEADS // KV_HEADS, dim=1) for x in (k, v))

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=not expand)

    return call


def sdpa_needs_expanded_kv() -> bool:
    q = torch.randn(1, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, KV_HEADS, 64, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    try:
        sdpa_call(q, k, k, 1.0, expand=False)()
        return False
    except RuntimeError:
        return True


def bench_shape(triton_attn, batch, context, l2_bytes, sweep):
    probe = DecodeShape(batch, context, 1)
    copies = max(1, min(32, -(-4 * l2_bytes // probe.bytes_moved())))
    del probe
    shape = DecodeShape(batch, context, copies)
    row = {"batch": batch, "context": context, "visible": shape.visible, "copies": copies,
           "bytes": shape.bytes_moved()}
    calls = [shape.triton_call(triton_attn, c) for c in range(copies)]
    calls[0]()
    assert shape.out.isfinite().all(), "non-finite decode output (a freed block was read?)"
    kv = [shape.contiguous_kv(c) for c in range(copies)]
    expand = sdpa_needs_expanded_kv()
    row["sdpa_kv"] = "expanded to all query heads" if expand else "gqa"
    sdpa = [sdpa_call(shape.queries[c].unsqueeze(2), *kv[c], shape.scale, expand) for c in range(copies)]
    want = sdpa[0]().squeeze(2).float()
    row["max_rel_err_vs_sdpa"] = float((shape.out.float() - want).norm() / want.norm())
    row["num_splits"] = triton_attn._num_splits(
        batch * KV_HEADS, triton_attn._max_visible_tokens(shape.tables[0], shape.k_cache, WINDOW), torch.device("cuda"))
    row["triton_us"] = median_us(rotating(calls))
    row["triton_graph_us"] = median_us(rotating(calls), graph=True)
    row["sdpa_us"] = median_us(rotating(sdpa))
    row["sdpa_graph_us"] = median_us(rotating(sdpa), graph=True)
    if sweep:
        row["splits_us"] = {
            n: median_us(rotating([shape.triton_call(triton_attn, c, n) for c in range(copies)]))
            for n in (1, 2, 4, 8, 16, 32, 64)
        }
    return row, shape


def sweep_configs(triton_attn, shape) -> dict:
    """Decode tile configurations on one shape (do_bench medians, us)."""
    saved, results = dict(triton_attn.DECODE_CONFIG), {}
    calls = [shape.triton_call(triton_attn, c) for c in range(shape.queries.shape[0])]
    for block_n, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3, 4)):
        triton_attn.DECODE_CONFIG.update(BLOCK_N=block_n, num_warps=warps, num_stages=stages)
        try:
            results[f"n{block_n}_w{warps}_s{stages}"] = median_us(rotating(calls))
        except Exception as exc:  # e.g. out of shared memory
            results[f"n{block_n}_w{warps}_s{stages}"] = repr(exc)[:80]
    triton_attn.DECODE_CONFIG.update(saved)
    return results


def sweep_prefill_configs(triton_attn, batch: int = 4, length: int = 4096) -> dict:
    """Prefill tile configurations on the 4 x 4096 prompt (do_bench medians, us): the prefill kernel
    ran at 0.72x flash attention on an H200 with the default tiles."""
    saved, results = dict(triton_attn.PREFILL_CONFIG), {}
    for block_m, block_n, warps, stages in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)):
        triton_attn.PREFILL_CONFIG.update(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
        try:
            results[f"m{block_m}_n{block_n}_w{warps}_s{stages}"] = bench_prefill(
                triton_attn, batch, length, time_sdpa=False)["triton_us"]
        except Exception as exc:  # e.g. out of shared memory
            results[f"m{block_m}_n{block_n}_w{warps}_s{stages}"] = repr(exc)[:80]
    triton_attn.PREFILL_CONFIG.update(saved)
    return results


def bench_prefill(triton_attn, batch: int = 4, length: int = 4096, time_sdpa: bool = True) -> dict:
    """One full-prompt prefill for scale: 4 x 4096 tokens, causal, window 4096 (flash SDPA checks the
    result, and is timed beside it unless time_sdpa is False)."""
    q = torch.randn(batch * length, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch * length, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    k_cache = k.view(-1, PAGE, KV_HEADS, HEAD_DIM)
    v_cache = v.view(-1, PAGE, KV_HEADS, HEAD_DIM)
    tables = torch.arange(batch * length // PAGE, dtype=torch.int32, device="cuda").view(batch, -1)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    starts = torch.arange(0, batch * length + 1, length, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    flops = 4 * batch * HEADS * HEAD_DIM * length * (length + 1) / 2
    t = median_us(lambda: triton_attn.paged_attention(
        q, k_cache, v_cache, tables, seq_lens, starts, HEAD_DIM**-0.5, WINDOW, out, length))
    qs, ks, vs = (x.view(batch, length, -1, HEAD_DIM).transpose(1, 2) for x in (q, k, v))

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)

    want = sdpa().transpose(1, 2).reshape(out.shape).float()
    row = {"batch": batch, "length": length, "triton_us": t, "triton_tflops": flops / t / 1e6,
           "rel_err_vs_sdpa": float((out.float() - want).norm() / want.norm())}
    if time_sdpa:
        sdpa_us = median_us(sdpa)
        row |= {"sdpa_us": sdpa_us, "sdpa_tflops": flops / sdpa_us / 1e6}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench-results")))
    parser.add_argument("--no-sweep", action="store_true", help="skip the split and tile sweeps")
    args = parser.parse_args()
    triton_attn = import_triton_attn()
    props = torch.cuda.get_device_properties(0)
    report = {"gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
              "torch": torch.__version__, "triton": triton.__version__, "decode_config": triton_attn.DECODE_CONFIG}
    report["copy_gbs"] = copy_bandwidth_gbs()
    rows, shapes = [], {}
    for batch, context in itertools.product(BATCHES, CONTEXTS):
        row, shapes[batch, context] = bench_shape(triton_attn, batch, context, props.L2_cache_size, not args.no_sweep)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if (batch, context) not in ((64, 4096), (1, 16384)):
            del shapes[batch, context]
    report["decode"] = rows
    if not args.no_sweep:
        report["config_sweep"] = {f"b{b}_ctx{c}": sweep_configs(triton_attn, s) for (b, c), s in shapes.items()}
    report["prefill"] = bench_prefill(triton_attn)
    if not args.no_sweep:
        report["prefill_sweep"] = sweep_prefill_configs(triton_attn)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench.json").write_text(json.dumps(report, indent=1))
    print_table(report)


def print_table(report) -> None:
    copy = report["copy_gbs"]
    print(f"\n{report['gpu']}  torch {report['torch']}  triton {report['triton']}  config {report['decode_config']}")
    print(f"device-to-device copy: {copy:.0f} GB/s (read + write)")
    if "config_sweep" in report:
        for name, res in report["config_sweep"].items():
            best = sorted((v, k) for k, v in res.items() if isinstance(v, float))[:5]
            print(f"config sweep {name}: " + ", ".join(f"{k} {v:.1f}us" for v, k in best))
    print(f"{'batch':>5} {'ctx':>6} {'splits':>6} {'triton us':>9} {'GB/s':>6} {'%copy':>6} {'graph us':>8} "
          f"{'%copy':>6} {'sdpa us':>8} {'sdpa graph':>10} {'vs sdpa':>7} {'best split':>10}")
    for r in report["decode"]:
        gbs, gbs_graph = r["bytes"] / r["triton_us"] / 1e3, r["bytes"] / r["triton_graph_us"] / 1e3
        best = min(r["splits_us"].items(), key=lambda kv: kv[1]) if "splits_us" in r else ("-", 0.0)
        print(f"{r['batch']:>5} {r['context']:>6} {r['num_splits']:>6} {r['triton_us']:>9.1f} {gbs:>6.0f} "
              f"{100 * gbs / copy:>5.1f}% {r['triton_graph_us']:>8.1f} {100 * gbs_graph / copy:>5.1f}% "
              f"{r['sdpa_us']:>8.1f} {r['sdpa_graph_us']:>10.1f} {r['sdpa_us'] / r['triton_us']:>6.2f}x "
              f"{best[0]!s:>4}:{best[1]:.1f}")
    if "prefill_sweep" in report:
        best = sorted((v, k) for k, v in report["prefill_sweep"].items() if isinstance(v, float))[:5]
        print("prefill config sweep: " + ", ".join(f"{k} {v:.0f}us" for v, k in best))
    p = report["prefill"]
    print(f"prefill {p['batch']}x{p['length']} causal: triton {p['triton_us']:.0f} us ({p['triton_tflops']:.0f} TFLOP/s)"
          f", sdpa flash {p['sdpa_us']:.0f} us ({p['sdpa_tflops']:.0f} TFLOP/s), rel err {p['rel_err_vs_sdpa']:.1e}")


if __name__ == "__main__":
    main()
