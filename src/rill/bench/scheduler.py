"""`rill bench scheduler`: the engine's per-step overhead without the model.

A no-op model runner stands in for the model, so a step's time is the scheduler, the block
manager, sequence bookkeeping, detokenization and (for the bridge) delivery to trio. Measured
at steady state, with every one of --num-seqs requests decoding one token per step:

(a) core:   EngineCore.step() called in a loop; the time of each call.
(b) bridge: the real trio bridge (open_engine, runner swapped), --num-seqs concurrent requests
            each consuming its own channel; the wall time from one engine step's start to the
            next's, which includes delivering each step's output to trio and waking every
            consumer task (worker and trio share the GIL), each step's latency from its start to
            its delivery into the channels, and the delivery's own time in trio (the one
            cross-thread call per step at most: steps that pile up while trio is busy arrive
            in one call, and its time is shared among them). Engine overhead = core step +
            delivery per step; the interval adds what 256 consumer tasks cost the interpreter.

Target (from the issue): at most 1 ms per step at 256 running requests.
"""

from __future__ import annotations

import random
import time

from rill.bench.common import (
    add_common_args, progress, random_token_ids, resolve_model, save_plot, summarize_ms,
)

NAME = "scheduler"
TARGET_MS_PER_STEP = 1.0
TARGET_LATENCY_P99_MS = 20.0  # a step's start to its deltas in trio (issue 33)


class NoOpRunner:
    """Fault-injection-style fake model runner: it runs no model and returns one token per
    sampling row, cycling through ordinary token ids, so that only the engine's own work
    (scheduling, KV bookkeeping, detokenizing, delivering) is timed."""

    def __init__(self, vocab_size: int, first_id: int = 3):
        from rill.engine.sampler import SampledToken

        # Made once: building the tokens is the sampler's work, which a model step includes.
        self._tokens = [SampledToken(i) for i in range(first_id, vocab_size)]
        self._next = 0

    def execute(self, batch, sampling):
        n, tokens = len(sampling), self._tokens
        out = []
        while len(out) < n:
            take = tokens[self._next : self._next + n - len(out)]
            out += take
            self._next = (self._next + len(take)) % len(tokens)
        return out


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--num-seqs", type=int, default=256, help="concurrent requests, all decoding (default 256)")
    p.add_argument("--steps", type=int, default=200, help="timed decode steps (default 200)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prompt length per request (default 64)")
    p.add_argument("--model", default="random-small",
                   help="model directory the engine loads (its weights are never run; default random-small)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up on the bridge run after this many seconds")
    p.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                   help="leave the startup heap in the garbage collector's walks (rill serve freezes it: rill.gc_heap)")
    p.add_argument("--max-steps-ahead", type=int, default=4,
                   help="steps the worker may run ahead of trio's deliveries before it waits (rill serve's "
                        "--max-steps-ahead; 0: never waits; default 4, as on the CPU)")


def _config(args, model: str):
    from rill.config import EngineConfig

    # Room for every request's prompt and all its outputs, so nothing is ever preempted.
    max_len = args.prompt_tokens + _max_tokens(args) + 16
    blocks = args.num_seqs * (max_len // 16 + 2)
    return EngineConfig(model=model, dtype="float32", num_kv_blocks=blocks, max_num_seqs=max(256, args.num_seqs),
                        seed=args.seed, max_steps_ahead=args.max_steps_ahead)


def _max_tokens(args) -> int:
    # Outputs must outlast the warm-up plus the timed steps. While the prompts prefill, the requests
    # already decoding take one token each of a step's 2,048, so the prefill takes up to
    # num_seqs * prompt / (2048 - num_seqs) steps (32 at 256 x 64, 64 at 1,024 x 64).
    budget = max(2048 - args.num_seqs, 64)
    return args.steps + -(-args.num_seqs * args.prompt_tokens // budget) + 8


def _requests(args, vocab_size: int):
    from rill.sampling_params import SamplingParams

    rng = random.Random(args.seed)
    params = SamplingParams(temperature=0, max_tokens=_max_tokens(args), ignore_eos=True)
    return [(f"s{i}", random_token_ids(rng, args.prompt_tokens, vocab_size), params) for i in range(args.num_seqs)]


def _startup_done(args) -> None:
    """What `rill serve` does once its engines have loaded."""
    if args.gc_freeze:
        from rill.gc_heap import freeze_startup_heap

        freeze_startup_heap()


def _vocab(core) -> int:
    """Ids both the tokenizer and the model know."""
    return min(core.tokenizer.vocab_size, core.model_config.vocab_size)


def bench_core(args, model: str) -> list[float]:
    """(a) Seconds per EngineCore.step() once every request is decoding."""
    from rill.engine.core import EngineCore

    core = EngineCore(_config(args, model))
    core.runner = NoOpRunner(_vocab(core))
    _startup_done(args)
    for rid, ids, params in _requests(args, _vocab(core)):
        core.add_request(rid, ids, params)
    for _ in range(_max_tokens(args)):  # warm up: until every request has produced a token
        core.step()
        if all(seq.num_output_tokens > 0 for seqs in core.requests.values() for seq in seqs):
            break
    times = []
    for _ in progress(range(args.steps), desc="core steps", disable=args.no_progress):
        t0 = time.perf_counter()
        deltas = core.step()
        times.append(time.perf_counter() - t0)
        if len(deltas) != args.num_seqs:
            raise RuntimeError(f"a timed step returned {len(deltas)} deltas for {args.num_seqs} running requests")
    return times


async def bench_bridge(args, model: str) -> dict:
    """(b) Through the trio bridge, at steady state (steps that carry a token for every request):
    the wall time from one step's start to the next (the worker's step plus the GIL time trio
    spends delivering and waking the consumers), and each step's latency from its start in the
    worker to its delivery into the channels in trio."""
    import trio

    from rill.engine.async_engine import open_engine

    steps: list[tuple[float, int]] = []  # (worker start time, number of deltas) per step
    delivered: list[float] = []  # trio time each step's delivery finished, in step order
    deliveries: list[tuple[int, int, float]] = []  # (first step, steps carried, trio seconds) per delivery
    tokens = 0

    async def consume(recv) -> None:
        nonlocal tokens
        async with recv:
            async for delta in recv:
                if delta.error is not None:
                    raise RuntimeError(f"{delta.request_id} failed: {delta.error}")
                tokens += len(delta.token_ids)

    async with open_engine(_config(args, model)) as engine:
        core = engine.core
        core.runner = NoOpRunner(_vocab(core))  # the worker is idle: nothing submitted yet
        _startup_done(args)
        core_step, deliver = core.step, engine._deliver

        def timed_step():
            t0 = time.perf_counter()
            deltas = core_step()
            steps.append((t0, len(deltas)))
            return deltas

        def timed_deliver(deltas, stats):
            # A delivery carries every step posted since the last one (more than one when trio
            # fell behind); engine.num_delivered_steps says how many steps that makes so far.
            # Its work is the trio thread's CPU time (time.thread_time): wall time would also
            # count the stretches in which the worker holds the GIL mid-delivery.
            c0 = time.thread_time()
            deliver(deltas, stats)
            t1, work = time.perf_counter(), time.thread_time() - c0
            carried = engine.num_delivered_steps - len(delivered)
            if carried:
                deliveries.append((len(delivered), carried, work))
                delivered.extend([t1] * carried)

        core.step, engine._deliver = timed_step, timed_deliver
        bar = progress(desc="bridge steps", disable=args.no_progress)
        with trio.fail_after(args.timeout):
            async with trio.open_nursery() as nursery:
                for rid, ids, params in _requests(args, _vocab(core)):
                    nursery.start_soon(consume, engine.submit(rid, ids, params))
                while nursery.child_tasks:
                    await trio.sleep(0.05)
                    bar.n = len(steps)
                    bar.refresh()
        bar.close()
    full = [i for i, (_, n) in enumerate(steps) if n == args.num_seqs]
    intervals = [steps[i + 1][0] - steps[i][0] for i in full if i + 1 < len(steps) and steps[i + 1][1] == args.num_seqs]
    latencies = [delivered[i] - steps[i][0] for i in full if i < len(delivered)]
    # Trio's delivery time per step carried, over deliveries of steady-state steps only.
    delivering = [seconds / carried for first, carried, seconds in deliveries
                  if all(steps[i][1] == args.num_seqs for i in range(first, first + carried))]
    return {"intervals": intervals, "latencies": latencies, "delivering": delivering, "tokens": tokens,
            "steps": len(steps), "deliveries": len(deliveries)}


def run(args) -> dict:
    import trio

    model = resolve_model(args.model, args.cache_dir, args.seed)
    try:
        core_times = bench_core(args, model)
        bridge = trio.run(bench_bridge, args, model)
    finally:
        if args.gc_freeze:
            from rill.gc_heap import thaw_heap

            thaw_heap()
    return {
        "benchmark": NAME,
        "config": {"num_seqs": args.num_seqs, "steps": args.steps, "prompt_tokens": args.prompt_tokens,
                   "model": args.model, "seed": args.seed, "gc_freeze": args.gc_freeze,
                   "max_steps_ahead": args.max_steps_ahead},
        "target_ms_per_step": TARGET_MS_PER_STEP,
        "target_latency_p99_ms": TARGET_LATENCY_P99_MS,
        "core": summarize_ms(core_times),
        "bridge": {
            **summarize_ms(bridge["intervals"]),
            "engine_steps": bridge["steps"],
            "deliveries": bridge["deliveries"],
            "tokens_delivered": bridge["tokens"],
            "delivery_latency": summarize_ms(bridge["latencies"]),
            "delivery_work": summarize_ms(bridge["delivering"]),
        },
        "series_ms": {"core": [t * 1000 for t in core_times], "bridge": [t * 1000 for t in bridge["intervals"]]},
    }


def summary(result: dict) -> str:
    core, bridge = result["core"], result["bridge"]
    n = result["config"]["num_seqs"]
    lines = [f"scheduler overhead per step, {n} running requests, no-op model (target <= {TARGET_MS_PER_STEP} ms):"]
    for name, s in (("EngineCore.step()", core), ("trio bridge", bridge)):
        if s["n"]:
            lines.append(f"  {name:<18} mean {s['mean_ms']:.3f} ms  p50 {s['p50_ms']:.3f} ms  "
                         f"p99 {s['p99_ms']:.3f} ms  ({s['n']} steps)")
        else:
            lines.append(f"  {name:<18} no steady-state steps measured")
    work = bridge["delivery_work"]
    if work["n"]:
        per_call = bridge["engine_steps"] / max(1, bridge["deliveries"])
        lines.append(f"  delivery in trio per step ({n} channels, {per_call:.1f} steps a call): mean {work['mean_ms']:.3f} ms  "
                     f"p50 {work['p50_ms']:.3f} ms  -> engine overhead (core p50 + delivery p50) "
                     f"{core['p50_ms'] + work['p50_ms']:.3f} ms")
    latency = bridge["delivery_latency"]
    if latency["n"]:
        lines.append(f"  step start -> delivered in trio: mean {latency['mean_ms']:.3f} ms  p99 {latency['p99_ms']:.3f} ms "
                     f"(target p99 < {TARGET_LATENCY_P99_MS:.0f} ms; worker at most "
                     f"{result['config']['max_steps_ahead'] or 'any number of'} steps ahead)")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    series = result["series_ms"]

    def draw(axes):
        ax = axes[0]
        for name, values in series.items():
            ax.plot(range(len(values)), values, label=name, linewidth=0.8)
        ax.axhline(result["target_ms_per_step"], color="red", linestyle="--", label="target")
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.set_ylabel("ms per step (log)")
        ax.set_title(f"per-step overhead, {result['config']['num_seqs']} requests, no-op model")
        ax.legend()

    save_plot(path, draw)
