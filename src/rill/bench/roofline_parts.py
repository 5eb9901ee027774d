"""The pieces of `rill bench roofline` (bench/roofline.py): the device's two ceilings, the bytes and FLOPs
a step cannot do without, engine-shaped decode and prefill batches, and the profiler's split of a step.

Ceilings as /work's METHOD says: a large device-to-device copy counting bytes read plus bytes written, and
a square matrix product on random data (never zeros: a product of zeros ran 13% faster on an H200), each
the best of a few after a warm-up.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict

import torch

from rill.engine.scheduler import ScheduledBatch
from rill.engine.sequence import Sequence
from rill.sampling_params import SamplingParams


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up: handles, allocation, first-call compilation
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth(device: torch.device, megabytes: int, repeats: int) -> dict:
    """Bytes/s of dst.copy_(src), counting the bytes read and the bytes written."""
    n = (megabytes << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = best_seconds(lambda: dst.copy_(src), device, repeats)
    return {"bytes": 2 * n * 4, "seconds": seconds, "bytes_per_s": 2 * n * 4 / seconds}


def matmul_rate(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> dict:
    """FLOP/s of a size x size x size product at dtype on random data."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    seconds = best_seconds(lambda: a @ b, device, repeats)
    return {"size": size, "dtype": str(dtype).removeprefix("torch."), "seconds": seconds,
            "flop_per_s": 2 * size**3 / seconds}


# -- what a step must move or compute --------------------------------------------------------------


def model_counts(model) -> dict:
    """The sizes the floors need, read before ModelRunner packs the CPU linears (packing empties the plain
    weights): bytes of every parameter once (a tied LM head shares the embedding's storage), the untied
    embedding's bytes and one row's, the matrices' parameters but the embedding and the LM head."""
    seen, total = set(), 0
    embed = model.embed_tokens.weight
    head = model.lm_head.weight
    tied = head.data_ptr() == embed.data_ptr()
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    # every matrix but the embedding (a lookup): an MoE model's experts all count (its floor is overstated)
    matrix = sum(p.numel() for p in model.parameters()
                 if p.dim() == 2 and p.data_ptr() not in (embed.data_ptr(), head.data_ptr()))
    return {"params": sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values()),
            "param_bytes": total, "untied_embedding_bytes": 0 if tied else embed.numel() * embed.element_size(),
            "embedding_row_bytes": embed.shape[1] * embed.element_size(), "matrix_params": matrix,
            "lm_head_params": head.numel()}


def weight_bytes(counts: dict, batch: int) -> int:
    """Bytes a decode step reads of the weights: every parameter once, except an untied embedding, of
    which only the batch's rows are read."""
    total = counts["param_bytes"]
    if counts["untied_embedding_bytes"]:
        total += batch * counts["embedding_row_bytes"] - counts["untied_embedding_bytes"]
    return total


def kv_bytes(cfg, context: int) -> int:
    """KV bytes one sequence's decode step reads at `context` tokens (a sliding layer reads its window)."""
    per_token_layer = 2 * cfg.num_kv_heads * cfg.head_dim * cfg.dtype.itemsize
    return sum(min(context, w) if w else context for w in cfg.layer_windows) * per_token_layer


def decode_flops(counts: dict, cfg, batch: int, context: int) -> int:
    """FLOPs of a decode step: each sequence's new token through every matrix and the LM head, and its
    query against `context` keys (a sliding layer's window)."""
    keys = sum(min(context, w) if w else context for w in cfg.layer_windows)
    return batch * (2 * (counts["matrix_params"] + counts["lm_head_params"]) + 4 * cfg.num_heads * cfg.head_dim * keys)


def prefill_flops(counts: dict, cfg, tokens: int) -> dict:
    """FLOPs of one sequence's prefill of `tokens`: 2 x the matrix parameters x tokens (the LM head for
    the last row only, as the engine computes logits for it alone), plus causal attention (QK^T and PV
    over the lower triangle, a sliding layer's over its window)."""
    linear = 2 * counts["matrix_params"] * tokens
    logits = 2 * counts["lm_head_params"]
    pairs = 0  # query-key pairs over all layers
    for w in cfg.layer_windows:
        pairs += w * (w + 1) // 2 + (tokens - w) * w if w and w < tokens else tokens * (tokens + 1) // 2
    attention = 4 * cfg.num_heads * cfg.head_dim * pairs
    return {"linear": linear, "lm_head": logits, "attention": attention, "total": linear + logits + attention}


# -- engine-shaped batches ---------------------------------------------------------------------------


def _sequence(runner, name: str, index: int, ids: list[int], first_block: int) -> Sequence:
    bs = runner.block_size
    seq = Sequence(name, index, ids, SamplingParams(max_tokens=1, temperature=0.0), block_size=bs, max_tokens=1,
                   num_kv_groups=runner.layout.num_groups)
    for table in seq.block_tables:
        table.extend(range(first_block, first_block + -(-len(ids) // bs)))
    return seq


def decode_batch(runner, batch: int, context: int, vocab: int, rng: random.Random) -> tuple[ScheduledBatch, list]:
    """`batch` sequences of `context` tokens on blocks of their own, each adding its last token: the
    step the engine runs when every sequence decodes. Rerunning it rewrites the same slots. Only the
    last token is read (the earlier ones are the random KV already in the cache): the rest repeat it,
    which keeps 256 x 8192-token batches quick to make."""
    per = -(-context // runner.block_size)
    out = ScheduledBatch()
    seqs = []
    for i in range(batch):
        seq = _sequence(runner, f"roofline-{i}", i, [rng.randrange(3, vocab)] * context, i * per)
        seq.num_computed_tokens = context - 1
        out.add(seq, 1)
        seqs.append(seq)
    return out, seqs


def prefill_batch(runner, tokens: int, vocab: int, rng: random.Random) -> tuple[ScheduledBatch, list]:
    seq = _sequence(runner, "roofline-prefill", 0, [rng.randrange(3, vocab) for _ in range(tokens)], 0)
    out = ScheduledBatch()
    out.add(seq, tokens)
    return out, [seq]


def time_steps(step, device: torch.device, warmup: int, steps: int) -> dict:
    """Median and best wall time of `step()` (an engine step: it ends reading the sampled tokens)."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "n": len(times)}


# -- where the time goes ------------------------------------------------------------------------------


def profile_split(step, device: torch.device, steps: int = 5, top: int = 8) -> dict:
    """torch.profiler over `steps` steps: per step, the device's kernel time against the wall time
    (the rest is host work and launch gaps), and the top kernels. On the CPU the split is torch's
    operators against the rest: Python, and rill's C kernels, which run through ctypes outside them."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step()
    sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        wall = (time.perf_counter() - t0) / steps
    by_name: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if device.type == "cuda":
            if e.device_type == DeviceType.CUDA:
                by_name[e.name] += e.device_time_total / 1e6 / steps
        elif e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
            by_name[e.name] += e.self_cpu_time_total / 1e6 / steps
    busy = sum(by_name.values())
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {"wall_s": wall, "kernel_s" if device.type == "cuda" else "torch_ops_s": busy,
            "gap_s": max(0.0, wall - busy), "gap_share": max(0.0, wall - busy) / wall,
            "top": [{"name": n[:120], "s": s, "share": s / wall} for n, s in ranked]}
