"""`rill bench cpu-linear`: float32 linear layers on the CPU, rill's C kernel (kernels/cpu_linear.c)
against oneDNN's pre-packed GEMM it replaced (`torch.ops.mkldnn._linear_pointwise`), side by side.

The shapes are random-qwen2-100m's (hidden 768, intermediate 2048, 12 heads / 4 KV heads of 64, 32k
vocabulary): the fused qkv projection, the output projection, the fused gate/up projection, the down
projection and the LM head; the rows are a decode step's (one per sequence) and a prefill chunk's. Each
weight is held in enough copies (--copies-mb, 128 MB in all) that every call reads its weight from memory, as
a model's twelve layers do. The sides alternate call by call, each figure the median of --repeats
calls over the copies; "read once" is the time to sum a buffer of the weight's bytes: at a few rows no
layer can take less.
"""

from __future__ import annotations

import statistics
import time

from rill.bench.common import add_common_args, progress, save_plot

NAME = "cpu-linear"
SHAPES = {"qkv": (1280, 768), "o": (768, 768), "gate_up": (4096, 768), "down": (768, 2048), "lm_head": (32000, 768)}
COPIES_BYTES = 128 << 20


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 2048],
                   help="rows per call: a decode batch or a prefill chunk (default 1 8 64 2048; the LM head "
                        "stops at 64, since a step computes logits for its last tokens only)")
    p.add_argument("--layers", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--repeats", type=int, default=5, help="passes over the copies per side and case (default 5)")
    p.add_argument("--copies-mb", type=int, default=COPIES_BYTES >> 20,
                   help="MB of copies of each weight, so that calls read it from memory (default %(default)s)")


def run(args) -> dict:
    import torch

    from rill.kernels import cpu_build, cpu_linear

    if cpu_build.library() is None:
        raise SystemExit(f"rill bench cpu-linear: the C kernel is unavailable ({cpu_build.unavailable_reason()})")
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        raise SystemExit("rill bench cpu-linear: this torch has no oneDNN to compare with")
    gen = torch.Generator().manual_seed(args.seed)
    cases = [(layer, m) for layer in args.layers for m in args.rows if not (layer == "lm_head" and m > 64)]
    rows, packed = [], {}
    for layer, m in progress(cases, desc="cases", disable=args.no_progress):
        n, k = SHAPES[layer]
        if layer not in packed:
            packed.clear()  # one layer's copies at a time
            copies = max(1, (args.copies_mb << 20) // (n * k * 4))
            weights = [torch.randn(n, k, generator=gen) / k**0.5 for _ in range(copies)]
            packed[layer] = ([cpu_linear.pack(w) for w in weights],
                             [torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in weights])
            del weights
        ours, onednn = packed[layer]
        x = torch.randn(m, k, generator=gen)
        floors = [torch.ones(n * k) for _ in ours]  # as many buffers as copies: read from memory too
        # Each output is dropped at once, as a model's layers drop theirs: holding every copy's output made a
        # pass at 2,048 rows map hundreds of MB of fresh pages, and the page faults weighed on both sides.
        def c_side():
            for p in ours:
                cpu_linear.linear(x, p)

        def onednn_side():
            for p in onednn:
                torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")

        def read_floor():
            for f in floors:
                f.sum()

        sides = {"c": c_side, "onednn": onednn_side, "read_floor": read_floor}
        times = {name: [] for name in sides}
        for fn in sides.values():
            fn()
        for _ in range(args.repeats):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) / len(ours))
        ms = {name: statistics.median(ts) * 1000 for name, ts in times.items()}
        flops = 2 * m * n * k
        rows.append({"layer": layer, "out_features": n, "in_features": k, "rows": m, "copies": len(ours),
                     "c_ms": ms["c"], "onednn_ms": ms["onednn"], "read_floor_ms": ms["read_floor"],
                     "speedup": ms["onednn"] / ms["c"], "c_gflops": flops / ms["c"] / 1e6,
                     "onednn_gflops": flops / ms["onednn"] / 1e6, "c_weight_gbps": n * k * 4 / ms["c"] / 1e6})
    return {"threads": torch.get_num_threads(), "repeats": args.repeats, "dtype": "float32", "rows": rows}


def summary(result: dict) -> str:
    lines = [f"rill bench cpu-linear: float32 linear layers of random-qwen2-100m, {result['threads']} threads, "
             f"weights read from memory, median of {result['repeats']} passes"]
    for r in result["rows"]:
        lines.append(f"  {r['layer']:>8} [{r['out_features']:>5} x {r['in_features']:>4}] x {r['rows']:>4} rows: "
                     f"oneDNN {r['onednn_ms']:8.3f} ms, C {r['c_ms']:8.3f} ms = {r['speedup']:.2f}x "
                     f"({r['c_gflops']:5.1f} GFLOP/s, weights at {r['c_weight_gbps']:4.1f} GB/s; "
                     f"reading them once {r['read_floor_ms']:.3f} ms)")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    def draw(axes) -> None:
        (ax,) = axes
        rows = result["rows"]
        labels = [f"{r['layer']}\n{r['rows']} rows" for r in rows]
        xs = range(len(rows))
        ax.bar(xs, [r["speedup"] for r in rows], color=["tab:green" if r["speedup"] >= 1 else "tab:red" for r in rows])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(xs), labels, rotation=60, fontsize=7)
        ax.set_ylabel("oneDNN time / C time")
        ax.grid(alpha=0.3, axis="y")

    save_plot(path, draw, title="CPU linear layers: rill's C kernel against oneDNN")
