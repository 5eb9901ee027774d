"""`rill bench cpu-attention`: one layer's decode attention on the CPU, rill's C kernel
(kernels/cpu_attn.c) against the torch reference it replaced (kernels/reference.py), side by side.

Each case is a batch of sequences of one context length over a paged float32 cache whose blocks are
shuffled, as a running server's are. The two sides alternate call by call; each figure is the median
of --repeats calls. For scale, each case also times reading its keys and values once (a sum over a
buffer of the same bytes): no attention can take less. The shape is random-qwen2-100m's (12 query
heads, 4 KV heads, head dim 64) unless --heads, --kv-heads and --head-dim say otherwise.
"""

from __future__ import annotations

import statistics
import time

from rill.bench.common import add_common_args, progress, save_plot

NAME = "cpu-attention"


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64], help="sequences per call (default 1 8 64)")
    p.add_argument("--contexts", type=int, nargs="+", default=[320, 1024, 4096],
                   help="tokens of context per sequence (default 320 1024 4096)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=30, help="calls per side and case (default 30)")


def _case(batch: int, context: int, args, gen):
    import torch

    per_seq = (context + args.block_size - 1) // args.block_size
    num_blocks = batch * per_seq
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(batch, per_seq).contiguous()
    query = torch.randn(batch, args.heads, args.head_dim, generator=gen)
    lens = torch.full((batch,), context, dtype=torch.int32)
    starts = torch.arange(batch + 1, dtype=torch.int32)
    return query, k_cache, v_cache, tables, lens, starts


def run(args) -> dict:
    import torch

    from rill.kernels import cpu_attn, cpu_build, reference

    if cpu_build.library() is None:
        raise SystemExit(f"rill bench cpu-attention: the C kernel is unavailable ({cpu_build.unavailable_reason()})")
    gen = torch.Generator().manual_seed(args.seed)
    scale = args.head_dim ** -0.5
    rows = []
    cases = [(b, c) for b in args.batches for c in args.contexts]
    for batch, context in progress(cases, desc="cases", disable=args.no_progress):
        case = _case(batch, context, args, gen)
        kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * 4
        floor_buf = torch.empty(kv_bytes // 4)
        floor_buf.fill_(1.0)
        sides = {"reference": lambda: reference.paged_attention(*case, scale),
                 "c": lambda: cpu_attn.paged_attention(*case, scale),
                 "read_floor": lambda: floor_buf.sum()}
        times = {name: [] for name in sides}
        for fn in sides.values():
            fn()  # warm: buffers, plans, pages
        for _ in range(args.repeats):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        ms = {name: statistics.median(ts) * 1000 for name, ts in times.items()}
        rows.append({"batch": batch, "context": context, "kv_bytes": kv_bytes, "reference_ms": ms["reference"],
                     "c_ms": ms["c"], "read_floor_ms": ms["read_floor"], "speedup": ms["reference"] / ms["c"],
                     "c_over_floor": ms["c"] / ms["read_floor"]})
        del case, floor_buf
    return {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
            "block_size": args.block_size, "repeats": args.repeats, "dtype": "float32", "rows": rows}


def summary(result: dict) -> str:
    lines = [f"rill bench cpu-attention: one layer's decode attention, {result['heads']} heads / "
             f"{result['kv_heads']} KV heads / dim {result['head_dim']}, float32, median of {result['repeats']}"]
    for r in result["rows"]:
        lines.append(f"  batch {r['batch']:>3} x {r['context']:>5} tokens ({r['kv_bytes'] / 2**20:7.1f} MiB of KV): "
                     f"reference {r['reference_ms']:8.2f} ms, C {r['c_ms']:7.2f} ms = {r['speedup']:.2f}x; "
                     f"reading the KV once {r['read_floor_ms']:6.2f} ms (C at {r['c_over_floor']:.1f}x of it)")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    def draw(axes) -> None:
        (ax,) = axes
        rows = result["rows"]
        labels = [f"{r['batch']}x{r['context']}" for r in rows]
        xs = range(len(rows))
        width = 0.28
        for i, (key, label) in enumerate((("reference_ms", "torch reference"), ("c_ms", "rill C kernel"),
                                          ("read_floor_ms", "read the KV once"))):
            ax.bar([x + (i - 1) * width for x in xs], [r[key] for r in rows], width, label=label)
        ax.set_yscale("log")
        ax.set_xticks(list(xs), labels, rotation=30, fontsize=8)
        ax.set_xlabel("batch x context tokens")
        ax.set_ylabel("ms per layer (log)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)

    save_plot(path, draw, title="CPU decode attention, one layer")
