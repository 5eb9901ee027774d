"""`rill bench kv-memory`: the KV bytes one long sequence holds with per-layer windows, against a
full-attention model of the same shape.

No model runs and no weights are needed: the engine's own Scheduler and BlockManager are driven
with a model's shape (its layers' windows, KV heads, head dim, dtype). One request of --length
prompt tokens is prefilled in chunks of --chunk tokens, as the engine schedules it, and after
each step the bench records the block ids in use times the bytes of one block id
(KVLayout.page_bytes); the peak is read after the step's blocks are taken and before the window
frees any (a prefill chunk is held whole while it is computed). The same request then runs
against the same shape with every layer full attention.

Shapes are those of google/gemma-3's text configs: every 6th layer global, the others sliding
(window 1024, 512 for gemma-3-1b), bfloat16 KV.
"""

from __future__ import annotations

from rill.bench.common import add_common_args, save_plot

NAME = "kv-memory"
# google/gemma-3-*: num_hidden_layers, num_key_value_heads, head_dim, sliding_window (pattern 6)
SHAPES = {
    "gemma-3-1b": dict(num_layers=26, num_kv_heads=1, head_dim=256, window=512),
    "gemma-3-4b": dict(num_layers=34, num_kv_heads=4, head_dim=256, window=1024),
    "gemma-3-12b": dict(num_layers=48, num_kv_heads=8, head_dim=256, window=1024),
    "gemma-3-27b": dict(num_layers=62, num_kv_heads=16, head_dim=128, window=1024),
}
GLOBAL_EVERY = 6
BF16_BYTES = 2


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["gemma-3-4b", "gemma-3-27b"],
                   help="model shapes to measure (default gemma-3-4b gemma-3-27b)")
    p.add_argument("--length", type=int, default=32768, help="prompt tokens of the one request (default 32768)")
    p.add_argument("--chunk", type=int, default=2048, help="prefill tokens per step, max_num_batched_tokens (default 2048)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")


def layer_windows(shape: dict) -> list[int | None]:
    return [None if (i + 1) % GLOBAL_EVERY == 0 else shape["window"] for i in range(shape["num_layers"])]


def measure(windows: list[int | None], shape: dict, length: int, chunk: int, block_size: int) -> dict:
    """Prefill one request of `length` tokens through the real scheduler; KV bytes per step."""
    from rill.engine.block_manager import BlockManager
    from rill.engine.kv_layout import KVLayout
    from rill.engine.scheduler import Scheduler
    from rill.engine.sequence import Sequence

    layout = KVLayout.for_windows(windows)
    page = layout.page_bytes(block_size, shape["num_kv_heads"], shape["head_dim"], BF16_BYTES)
    bm = BlockManager(layout.max_blocks(length, block_size, chunk), block_size, group_windows=layout.group_windows)
    scheduler = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=chunk)
    seq = Sequence("kv", 0, list(range(length)), params=None, block_size=block_size, max_tokens=1,
                   num_kv_groups=layout.num_groups)
    scheduler.add(seq)
    points, peak = [], 0
    while seq.num_computed_tokens < length:
        batch = scheduler.schedule()
        assert batch.seqs, "the request must fit the blocks sized for it"
        peak = max(peak, bm.num_used_blocks)
        for s, n, before in zip(batch.seqs, batch.num_new_tokens, batch.num_computed):
            s.num_computed_tokens = before + n
            bm.on_computed(s, before)
        points.append([seq.num_computed_tokens, bm.num_used_blocks * page])
    held = bm.num_used_blocks * page
    scheduler.remove(seq)
    assert bm.num_free_blocks == bm.num_blocks
    return {"groups": list(layout.group_windows), "layers_per_group": layout.layers_per_group,
            "padded_slots": layout.num_padded_slots, "page_bytes": page, "points": points,
            "held_bytes": held, "peak_bytes": peak * page}


def run(args) -> dict:
    rows = []
    for name in args.shapes:
        shape = SHAPES[name]
        windows = layer_windows(shape)
        hybrid = measure(windows, shape, args.length, args.chunk, args.block_size)
        full = measure([None] * len(windows), shape, args.length, args.chunk, args.block_size)
        num_global = windows.count(None)
        rows.append({
            "shape": name, **shape, "global_every": GLOBAL_EVERY, "num_global_layers": num_global,
            "per_layer_windows": hybrid, "full_attention": full,
            "ratio": hybrid["held_bytes"] / full["held_bytes"],
            # what the layers need with no block rounding: global layers keep every token, local ones a window
            "ideal_ratio": (num_global * args.length + (len(windows) - num_global) * min(shape["window"], args.length))
            / (len(windows) * args.length),
        })
    return {"length": args.length, "chunk": args.chunk, "block_size": args.block_size, "dtype": "bfloat16",
            "rows": rows}


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB"


def summary(result: dict) -> str:
    lines = [f"rill bench kv-memory: KV one {result['length']}-token sequence holds after prefill "
             f"(block {result['block_size']}, chunks of {result['chunk']}, bfloat16)"]
    for row in result["rows"]:
        hybrid, full = row["per_layer_windows"], row["full_attention"]
        lines.append(
            f"  {row['shape']} ({row['num_layers']} layers, {row['num_global_layers']} global, window {row['window']}): "
            f"per-layer windows {_gib(hybrid['held_bytes'])} vs full attention {_gib(full['held_bytes'])} "
            f"= {row['ratio']:.3f}x (1/{1 / row['ratio']:.1f}; ideal {row['ideal_ratio']:.3f}x); "
            f"peak during prefill {_gib(hybrid['peak_bytes'])}; {len(hybrid['groups'])} KV groups of "
            f"{hybrid['layers_per_group']} layers, {hybrid['padded_slots']} padded")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    def draw(axes) -> None:
        (ax,) = axes
        for i, row in enumerate(result["rows"]):
            color = f"C{i}"
            for key, style, label in (("per_layer_windows", "-", "per-layer windows"), ("full_attention", "--", "full attention")):
                pts = row[key]["points"]
                ax.plot([p[0] for p in pts], [p[1] / 2**30 for p in pts], style, color=color, marker=".",
                        label=f"{row['shape']}: {label}")
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("KV held (GiB, bfloat16)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    save_plot(path, draw, title="KV bytes of one sequence, from rill's block manager")
