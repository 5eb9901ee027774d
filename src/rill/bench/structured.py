"""`rill bench structured`: the engine's step time with and without a JSON schema constraint.

rill-tiny decodes --batch-sizes requests at once (all sampling at temperature 1, seeded, so both runs
take the sampler's full path and differ only by the grammar): once unconstrained, once with every
request held to a JSON schema (a list of people, at least --min-items long, so that no request
finishes inside the timed steps). Each timed step is EngineCore.step() at steady state, every
request decoding one token: the model, the sampler, the batch's bitmask fill (one llguidance call),
the mask on the logits and each matcher's advance.

Target (from the issue): at most 10% step-time overhead at batch 64.
"""

from __future__ import annotations

import time

import msgspec

from rill.bench.common import add_common_args, progress, save_plot, summarize_ms

NAME = "structured"
TARGET_OVERHEAD = 0.10
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"enum": ["Paris", "Tokyo", "Lima", "Oslo"]}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "city"], "additionalProperties": False}


def schema(min_items: int) -> dict:
    return {"type": "object", "properties": {"people": {"type": "array", "items": PERSON, "minItems": min_items}},
            "required": ["people"], "additionalProperties": False}


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="requests decoding at once")
    p.add_argument("--steps", type=int, default=100, help="timed decode steps per run (default 100)")
    p.add_argument("--min-items", type=int, default=1000, help="the schema's minItems: keeps every output going")


def _steady_steps(core, prompt: list[int], params, num_seqs: int, steps: int, no_progress: bool) -> list[float]:
    """Seconds per EngineCore.step() while all num_seqs requests decode."""
    for i in range(num_seqs):  # each its own seed, so that the outputs (and the grammars' states) differ
        core.add_request(f"r{i}", prompt, msgspec.structs.replace(params, seed=params.seed + i))
    while any(seq.num_output_tokens == 0 for seqs in core.requests.values() for seq in seqs):
        core.step()  # prefill and first tokens
    times = []
    for _ in progress(range(steps), desc=f"batch {num_seqs}", disable=no_progress):
        t0 = time.perf_counter()
        deltas = core.step()
        times.append(time.perf_counter() - t0)
        if len(deltas) != num_seqs or any(d.finish_reason for d in deltas):
            raise RuntimeError("a request finished inside the timed steps: raise --min-items or lower --steps")
    for request_id in list(core.requests):
        core.abort(request_id)
    return times


def run(args) -> dict:
    from rill.assets import RILL_TINY_DIR
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore
    from rill.sampling_params import SamplingParams
    from rill.structured import GrammarCompiler, specs

    max_tokens = args.steps + 64
    num_seqs = max(args.batch_sizes)
    core = EngineCore(EngineConfig(model=str(RILL_TINY_DIR), max_num_seqs=num_seqs, seed=args.seed,
                                   num_kv_blocks=num_seqs * (max_tokens // 16 + 4)))
    compiler = GrammarCompiler(core.tokenizer, core.model_config.vocab_size, core.eos_token_ids)
    t0 = time.perf_counter()
    grammar = compiler.compile(specs.json_schema(schema(args.min_items), "schema"), "schema")
    compile_ms = (time.perf_counter() - t0) * 1e3
    prompt = core.tokenizer.encode_chat([{"role": "user", "content": "List some people as JSON."}])
    rows = []
    for batch in args.batch_sizes:
        row = {"batch": batch}
        for label, constraint in (("plain", None), ("schema", grammar)):
            params = SamplingParams(temperature=1.0, seed=args.seed, max_tokens=max_tokens, grammar=constraint,
                                    ignore_eos=True)  # the unconstrained run must not end either
            row[label] = summarize_ms(_steady_steps(core, prompt, params, batch, args.steps, args.no_progress))
        row["overhead"] = row["schema"]["p50_ms"] / row["plain"]["p50_ms"] - 1
        rows.append(row)
    at_largest = rows[-1]["overhead"]
    return {
        "benchmark": NAME,
        "config": {"model": "rill-tiny", "batch_sizes": args.batch_sizes, "steps": args.steps,
                   "min_items": args.min_items, "seed": args.seed},
        "grammar_engine": "llguidance " + _version("llguidance"),
        "compile_ms": compile_ms,
        "target_overhead": TARGET_OVERHEAD,
        "rows": rows,
        "met_target": at_largest <= TARGET_OVERHEAD,
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def summary(result: dict) -> str:
    lines = [f"rill bench structured ({result['grammar_engine']}, rill-tiny, p50 ms per engine step; "
             f"schema compiled in {result['compile_ms']:.2f} ms)"]
    for row in result["rows"]:
        lines.append(f"  batch {row['batch']:>3}: plain {row['plain']['p50_ms']:.2f} ms, "
                     f"schema {row['schema']['p50_ms']:.2f} ms, overhead {row['overhead']:+.1%}")
    verdict = "met" if result["met_target"] else "MISSED"
    lines.append(f"  target: at most {result['target_overhead']:.0%} at batch {result['rows'][-1]['batch']}: {verdict}")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    rows = result["rows"]

    def draw(axes) -> None:
        (ax,) = axes
        batches = [str(r["batch"]) for r in rows]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["plain"]["p50_ms"] for r in rows], 0.4, label="unconstrained")
        ax.bar([x + 0.2 for x in xs], [r["schema"]["p50_ms"] for r in rows], 0.4, label="JSON schema")
        for x, r in zip(xs, rows):
            ax.annotate(f"{r['overhead']:+.0%}", (x + 0.2, r["schema"]["p50_ms"]), ha="center", va="bottom")
        ax.set_xticks(list(xs), batches)
        ax.set_xlabel("requests decoding at once")
        ax.set_ylabel("p50 engine step (ms)")
        ax.legend()

    save_plot(path, draw, title=f"rill-tiny step time with a JSON schema ({result['grammar_engine']})")
