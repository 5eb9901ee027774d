"""`rill bench roofline`: rill's engine steps against the device's own limits (issue 55, item 1).

First the two ceilings, measured on the device given: the copy bandwidth (a large device-to-device copy,
bytes read + written, best of --repeats) and the matrix rate at the model's dtype (a square product on
random data). Then the engine's decode step (ModelRunner.execute: inputs prepared, decoder over the paged
KV cache, greedy sampling to the host) at each --batch-sizes x --contexts cell, each sequence on blocks of
its own, against its floor: (weight bytes + the batch's KV bytes, each read once) / copy bandwidth, or the
step's FLOPs / matrix rate where that is larger (a CPU at batch 64; the JSON keeps both). And one
sequence's prefill of each --prefill-tokens against its FLOP floor: (2 x matrix parameters x tokens +
causal attention's FLOPs) / matrix rate. "% of floor" is floor / measured time: 100% is the limit.

Targets (issue 55): decode at 70% of the bandwidth floor or better at batch 64 and up; prefill at 60% of
the FLOP floor. Cells that miss get a torch.profiler split of the step (--profile-cells of them, the worst
first): kernel time against host work and launch gaps, and the top kernels.

On the CPU it runs too, at small shapes: there the floor is the memory's read bandwidth (issue 53, item 2).
"""

from __future__ import annotations

import random

from rill.bench.common import RANDOM_MODELS, add_common_args, progress, resolve_model, save_plot

NAME = "roofline"
DECODE_TARGET, PREFILL_TARGET, TARGET_BATCH = 70.0, 60.0, 64


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--model", default="random-qwen2-0.5b",
                   help=f"a model directory or a random shape: {', '.join(RANDOM_MODELS)} (default %(default)s)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 64, 256], help="decode batches (default 1,64,256)")
    p.add_argument("--contexts", type=_ints, default=[1024, 2048, 4096, 8192],
                   help="tokens per sequence (default 1024,2048,4096,8192)")
    p.add_argument("--prefill-tokens", type=_ints, default=[1024, 4096, 8192],
                   help="one sequence's prefill lengths (default 1024,4096,8192; empty: none)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per cell (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--repeats", type=int, default=10, help="tries of the copy and the matmul (default 10)")
    p.add_argument("--copy-mb", type=int, default=None, help="copy size (default 4096 on CUDA, 512 on the CPU)")
    p.add_argument("--matmul-size", type=int, default=None, help="square product side (default 8192 / 1024)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--cuda-graphs", action="store_true", help="decode through captured CUDA graphs, as serving does")
    p.add_argument("--profile-cells", type=int, default=3, help="cells that miss the target to profile (default 3)")


def run(args) -> dict:
    import torch

    from rill.bench import roofline_parts as parts
    from rill.engine.model_runner import ModelRunner
    from rill.engine.sampler import Sampler
    from rill.models.loader import load

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    dtype_name = args.dtype or ("bfloat16" if cuda else "float32")
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(args.seed)
    copy = parts.copy_bandwidth(device, args.copy_mb or (4096 if cuda else 512), args.repeats)
    matmul = parts.matmul_rate(device, dtype, args.matmul_size or (8192 if cuda else 1024), args.repeats)
    if not cuda and dtype != torch.float32:
        # torch's bfloat16 product on a CPU without AMX runs far below the float32 one that rill's bfloat16
        # C kernels reach (they widen to float32): the faster of the two is the machine's ceiling
        f32 = parts.matmul_rate(device, torch.float32, matmul["size"], args.repeats)
        matmul = max(matmul, f32, key=lambda m: m["flop_per_s"]) | {"at_" + matmul["dtype"]: matmul["flop_per_s"]}
    bw, rate = copy["bytes_per_s"], matmul["flop_per_s"]

    _, cfg, _, model = load(resolve_model(args.model, args.cache_dir, args.seed), dtype=dtype_name,
                            device=str(device))
    counts = parts.model_counts(model)  # before ModelRunner packs the CPU linears
    bs = args.block_size
    per_seq = max([-(-c // bs) for c in args.contexts] + [0])
    num_blocks = max([b * per_seq for b in args.batch_sizes] + [-(-t // bs) for t in args.prefill_tokens]) + 1
    runner = ModelRunner(model, num_blocks, bs, Sampler((), cfg.vocab_size))
    for cache in {id(t): t for pair in runner.kv_caches for t in pair}.values():
        cache.normal_()  # never zeros: a kernel can run faster on them than on real data
    if args.cuda_graphs:
        runner.capture_decode_graphs(max(args.batch_sizes), per_seq)
    rng = random.Random(args.seed)

    decode, steps = [], {}
    cells = [(b, c) for b in args.batch_sizes for c in args.contexts]
    for b, c in progress(cells, desc="decode", disable=args.no_progress):
        batch, seqs = parts.decode_batch(runner, b, c, cfg.vocab_size, rng)
        steps[("decode", b, c)] = step = lambda batch=batch, seqs=seqs: runner.execute(batch, seqs)
        t = parts.time_steps(step, device, args.warmup, args.steps)
        w, kv, flops = parts.weight_bytes(counts, b), b * parts.kv_bytes(cfg, c), parts.decode_flops(counts, cfg, b, c)
        # the larger of the two is the floor: bytes on a GPU; a CPU's matmul rate can bind first at batch 64
        floor = max((w + kv) / bw, flops / rate)
        decode.append({"batch": b, "context": c, **t, "weight_bytes": w, "kv_bytes": kv, "flops": flops,
                       "bandwidth_floor_s": (w + kv) / bw, "flop_floor_s": flops / rate, "floor_s": floor,
                       "bound": "bytes" if (w + kv) / bw >= flops / rate else "flops",
                       "pct_of_floor": 100 * floor / t["median_s"],
                       "pct_of_bandwidth_floor": 100 * (w + kv) / bw / t["median_s"],
                       "tokens_per_s": b / t["median_s"]})
    prefill = []
    for n in progress(args.prefill_tokens, desc="prefill", disable=args.no_progress):
        batch, seqs = parts.prefill_batch(runner, n, cfg.vocab_size, rng)
        steps[("prefill", n)] = step = lambda batch=batch, seqs=seqs: runner.execute(batch, seqs)
        t = parts.time_steps(step, device, min(args.warmup, 2), max(3, args.steps // 4))
        flops = parts.prefill_flops(counts, cfg, n)
        floor = flops["total"] / rate
        prefill.append({"tokens": n, **t, "flops": flops, "floor_s": floor,
                        "pct_of_floor": 100 * floor / t["median_s"], "tokens_per_s": n / t["median_s"]})

    misses = [("decode", r["batch"], r["context"]) for r in decode if r["pct_of_floor"] < DECODE_TARGET] \
        + [("prefill", r["tokens"]) for r in prefill if r["pct_of_floor"] < PREFILL_TARGET]
    pct = {("decode", r["batch"], r["context"]): r["pct_of_floor"] for r in decode}
    pct.update({("prefill", r["tokens"]): r["pct_of_floor"] for r in prefill})
    # decode at the target's batches first, then prefill, then the rest; the worst first within each
    misses.sort(key=lambda k: (0 if k[0] == "decode" and k[1] >= TARGET_BATCH else 1 if k[0] == "prefill" else 2,
                               pct[k]))
    profiles = [{"cell": list(k), **parts.profile_split(steps[k], device)} for k in misses[: args.profile_cells]]

    return {
        "benchmark": NAME, "model": args.model, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": dtype_name, "cuda_graphs": args.cuda_graphs, "block_size": bs,
        "params": counts["params"],
        "copy": copy, "matmul": matmul, "decode": decode, "prefill": prefill, "profiles": profiles,
        "targets": _targets(decode, prefill),
    }


def _targets(decode: list[dict], prefill: list[dict]) -> dict:
    big = [r["pct_of_floor"] for r in decode if r["batch"] >= TARGET_BATCH]
    pre = [r["pct_of_floor"] for r in prefill]
    return {
        "decode": {"target_pct": DECODE_TARGET, "at_batch_from": TARGET_BATCH, "worst_pct": min(big, default=None),
                   "met": min(big) >= DECODE_TARGET if big else None},
        "prefill": {"target_pct": PREFILL_TARGET, "worst_pct": min(pre, default=None),
                    "met": min(pre) >= PREFILL_TARGET if pre else None},
    }


def _verdict(t: dict) -> str:
    if t["met"] is None:
        return "not measured"
    return f"{'met' if t['met'] else 'missed'} (worst {t['worst_pct']:.0f}%, target {t['target_pct']:.0f}%)"


def summary(r: dict) -> str:
    lines = [f"rill bench roofline: {r['model']} ({r['params'] / 1e6:.0f}M parameters) on {r['device_name']}, "
             f"{r['dtype']}{', CUDA graphs' if r['cuda_graphs'] else ''}",
             f"  copy bandwidth {r['copy']['bytes_per_s'] / 1e9:.1f} GB/s (read + written); "
             f"matmul {r['matmul']['flop_per_s'] / 1e12:.2f} TFLOP/s at {r['matmul']['dtype']}",
             f"  {'batch':>5} {'context':>7} {'step ms':>9} {'floor ms':>9} {'% floor':>8} {'tok/s':>10} {'bound':>6}"]
    for d in r["decode"]:
        lines.append(f"  {d['batch']:>5} {d['context']:>7} {d['median_s'] * 1e3:>9.3f} {d['floor_s'] * 1e3:>9.3f} "
                     f"{d['pct_of_floor']:>7.1f}% {d['tokens_per_s']:>10.0f} {d['bound']:>6}")
    for p in r["prefill"]:
        lines.append(f"  prefill {p['tokens']:>6} tokens {p['median_s'] * 1e3:>9.2f} ms, floor "
                     f"{p['floor_s'] * 1e3:.2f} ms: {p['pct_of_floor']:.1f}% of the FLOP floor")
    for prof in r["profiles"]:
        busy = prof.get("kernel_s", prof.get("torch_ops_s"))
        top = ", ".join(f"{k['name'][:40]} {100 * k['share']:.0f}%" for k in prof["top"][:3])
        lines.append(f"  profile {'/'.join(map(str, prof['cell']))}: step {prof['wall_s'] * 1e3:.2f} ms, "
                     f"{'kernels' if 'kernel_s' in prof else 'torch ops'} {busy * 1e3:.2f} ms, gaps "
                     f"{100 * prof['gap_share']:.0f}%; top: {top}")
    lines.append(f"  decode target (batch >= {TARGET_BATCH}): {_verdict(r['targets']['decode'])}; "
                 f"prefill target: {_verdict(r['targets']['prefill'])}")
    return "\n".join(lines)


def plot(r: dict, path) -> None:
    batches = sorted({d["batch"] for d in r["decode"]})
    contexts = sorted({d["context"] for d in r["decode"]})
    grid = [[next(d["pct_of_floor"] for d in r["decode"] if d["batch"] == b and d["context"] == c)
             for c in contexts] for b in batches]

    def draw(axes):
        ax = axes[0]
        im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto", origin="lower")
        ax.set_xticks(range(len(contexts)), [str(c) for c in contexts])
        ax.set_yticks(range(len(batches)), [str(b) for b in batches])
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.0f}%", ha="center", va="center", color="white" if v < 60 else "black")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("batch")
        ax.set_title(f"decode: % of the floor, bytes or FLOPs (target {DECODE_TARGET:.0f}%)")
        ax.figure.colorbar(im, ax=ax)
        ax = axes[1]
        tokens = [p["tokens"] for p in r["prefill"]]
        ax.bar([str(t) for t in tokens], [p["pct_of_floor"] for p in r["prefill"]])
        ax.axhline(PREFILL_TARGET, color="red", linestyle="--", label=f"target {PREFILL_TARGET:.0f}%")
        ax.set_xlabel("prefill tokens (one sequence)")
        ax.set_ylabel("% of the FLOP floor")
        ax.set_ylim(0, 100)
        ax.legend()
        ax.set_title("prefill")

    save_plot(path, draw, ncols=2, title=f"rill roofline: {r['model']}, {r['dtype']} on {r['device_name']}")
