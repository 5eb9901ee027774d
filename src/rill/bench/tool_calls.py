"""`rill bench tool-calls`: what holding tool calls to the declared tools costs, and what it buys.

rill-tiny answers questions with the OpenAI Agents SDK's two tools (get_weather, get_time; the
`@function_tool` schemas, not strict) in its prompt, at temperature 1.0 with no top_p or top_k cut
(the Agents SDK sends no sampling fields), each request seeded: once as a plain request, once under
tool_choice "auto"'s grammar (rill.openai.constraints.auto_tools_constraint: text until the model
writes `<tool_call>`, then a declared name and arguments valid against its parameters). Most
questions ask for the weather or the time (rill-tiny calls a tool), one in four is arithmetic (it
answers in text), so both of the grammar's states are timed.

Cost: decode tokens/s at --batch-sizes requests decoding at once, from the median of --steps
engine steps while none ends (min_tokens bans eos: the grammar side writes text, or call after call),
the two sides alternating over --repeats rounds, the better round of each kept (on a shared machine
the slower rounds measure the neighbours). Benefit: of the calls each side opened,
how many name an undeclared tool, have arguments whose keys or types are not the schema's, or do
not parse as a call at all (the client then gets the raw text). And, apart from the model (steadier
on a busy machine), what the grammar adds to the sampler's step in each of its states (free text, a
call's name, its arguments).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter

import msgspec

from rill.bench.common import add_common_args, progress

NAME = "tool-calls"
SIDES = ("plain", "auto_grammar")
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Reykjavik", "San Francisco", "Nairobi"]
ZONES = ["Asia/Tokyo", "Europe/Oslo", "America/Lima", "Africa/Cairo"]


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="requests decoding at once")
    p.add_argument("--repeats", type=int, default=3, help="rounds of both sides per batch size (default 3)")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps per round (default 64)")
    p.add_argument("--requests", type=int, default=256,
                   help="answers per side whose calls are checked, in waves of the largest batch (default 256)")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens per checked answer at most (default 96)")


def agents_sdk_tools() -> list[dict]:
    from rill.tiny.evaluate import framework_tool

    tools = [framework_tool("openai_agents", kind) for kind in ("weather", "time")]
    for tool in tools:
        tool["function"].pop("strict")  # most frameworks send none; the realtime protocol has no such field
    return tools


def questions(n: int) -> list[str]:
    """n questions: weather, time, weather, arithmetic, ... over a few cities and zones."""
    shapes = [lambda i: f"What's the weather in {CITIES[i % len(CITIES)]}?",
              lambda i: f"What time is it in {ZONES[i % len(ZONES)]}?",
              lambda i: f"Is it raining in {CITIES[(i + 3) % len(CITIES)]}?",
              lambda i: f"What is {12 + i} + {30 + 7 * i}?"]
    return [shapes[i % len(shapes)](i // len(shapes)) for i in range(n)]


def _run_waves(core, prompts: list[list[int]], batch: int, params, seed: int) -> list[str]:
    """The prompts to their end, in waves of `batch`: the answers."""
    texts: list[str] = []
    for start in range(0, len(prompts), batch):
        wave = prompts[start:start + batch]
        for i, prompt in enumerate(wave):
            core.add_request(f"r{i}", prompt, msgspec.structs.replace(params, seed=seed + start + i))
        answers = [""] * len(wave)
        while core.has_work:
            for delta in core.step():
                answers[int(delta.request_id[1:])] += delta.text
        texts += answers
    return texts


def _steady_steps(core, prompts: list[list[int]], params, seed: int, steps: int) -> list[float]:
    """Seconds per EngineCore.step() while every prompt decodes (min_tokens bans eos, so none ends: the
    grammar side goes on writing text, or call after call, as its grammar allows)."""
    for i, prompt in enumerate(prompts):
        core.add_request(f"r{i}", prompt, msgspec.structs.replace(params, seed=seed + i))
    while any(seq.num_output_tokens == 0 for seqs in core.requests.values() for seq in seqs):
        core.step()  # prefill and first tokens
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        deltas = core.step()
        times.append(time.perf_counter() - t0)
        if len(deltas) != len(prompts) or any(d.finish_reason for d in deltas):
            raise RuntimeError("a request finished inside the timed steps")
    for request_id in list(core.requests):
        core.abort(request_id)
    return times


def call_faults(texts: list[str], tools: list[dict]) -> Counter:
    """Per answer: the calls it opened and what was wrong with them."""
    from rill.openai.tool_parser import TOOL_CALL_START, parse_tool_calls

    declared = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    counts = Counter(answers=len(texts))
    for text in texts:
        content, calls = parse_tool_calls(text)
        counts["opened"] += text.count(TOOL_CALL_START)
        counts["unparsed"] += content.count(TOOL_CALL_START)
        for call in calls:
            counts["calls"] += 1
            if call.name not in declared:
                counts["undeclared_name"] += 1
            elif not _fits(call.arguments, declared[call.name]):
                counts["bad_arguments"] += 1
    return counts


def _fits(arguments: str, schema: dict) -> bool:
    """The arguments hold exactly the schema's properties, each of its type (the Agents SDK's schemas
    are flat, strings only, additionalProperties false)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return False
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    properties = schema["properties"]
    return (isinstance(value, dict) and set(value) == set(properties)
            and all(isinstance(value[k], types.get(p.get("type"), object)) for k, p in properties.items()))


# The grammar's states, as the text that leads to each (sampler_us times each).
MASK_STATES = {"text": "Let me think about",
               "name": '<tool_call>\n{"name": "get_',
               "arguments": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "San Fr'}


def sampler_us(core, grammar, batch: int, state: str, num_calls: int = 300) -> dict[str, float]:
    """Median microseconds of the engine's sampler over `batch` rows of random logits at temperature 1.0,
    without a grammar and with every row's matcher in `state` (MASK_STATES), the two calls interleaved
    so that a busy machine slows both alike: the constraint's cost per step, apart from the model."""
    import statistics

    import torch

    from rill.engine.sampler import SamplingRow
    from rill.sampling_params import SamplingParams

    def rows(with_grammar: bool) -> list[SamplingRow]:
        out = []
        for i in range(batch):
            matcher = grammar.new_matcher() if with_grammar else None
            for token_id in core.tokenizer.encode(MASK_STATES[state], add_special_tokens=False) if matcher else ():
                assert matcher.consume_token(token_id), (state, token_id)
            params = SamplingParams(temperature=1.0, seed=i, grammar=grammar if with_grammar else None)
            out.append(SamplingRow(params, [], [], torch.Generator().manual_seed(i), matcher))
        return out

    sampler, sides = core.runner.sampler, {"plain": rows(False), "auto_grammar": rows(True)}
    logits = torch.randn(batch, core.model_config.vocab_size)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(num_calls):
        for side, side_rows in sides.items():
            t0 = time.perf_counter()
            sampler(logits, side_rows)
            times[side].append(time.perf_counter() - t0)
    return {side: statistics.median(ts) * 1e6 for side, ts in times.items()}


def run(args) -> dict:
    from rill.assets import RILL_TINY_DIR
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore
    from rill.openai.constraints import auto_tools_constraint
    from rill.openai.requests import Tool
    from rill.sampling_params import SamplingParams
    from rill.structured import GrammarCompiler

    num_seqs = max(args.batch_sizes)
    core = EngineCore(EngineConfig(model=str(RILL_TINY_DIR), max_num_seqs=num_seqs, seed=args.seed,
                                   num_kv_blocks=num_seqs * ((512 + args.max_tokens) // 16 + 4)))
    tools = agents_sdk_tools()
    compiler = GrammarCompiler(core.tokenizer, core.model_config.vocab_size, core.eos_token_ids)
    t0 = time.perf_counter()
    spec, param = auto_tools_constraint([msgspec.convert(t, Tool) for t in tools], True, compiler.special_tags)
    grammar = compiler.compile(spec, param)
    compile_ms = (time.perf_counter() - t0) * 1e3
    grammars = {"plain": None, "auto_grammar": grammar}
    rows = []
    for batch in args.batch_sizes:
        prompts = [core.tokenizer.encode_chat([{"role": "user", "content": q}], tools=tools) for q in questions(batch)]
        best: dict[str, float] = {}
        for repeat in progress(range(args.repeats), desc=f"batch {batch}", disable=args.no_progress):
            for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:  # alternate who goes first
                params = SamplingParams(temperature=1.0, max_tokens=args.steps + 16, min_tokens=args.steps + 16,
                                        grammar=grammars[side])
                step_s = statistics.median(_steady_steps(core, prompts, params, args.seed + 1000 * repeat, args.steps))
                best[side] = min(best.get(side, step_s), step_s)
        row = {"batch": batch, "step_ms": {side: best[side] * 1e3 for side in SIDES},
               "tokens_per_s": {side: batch / best[side] for side in SIDES},
               "us_per_token": {side: best[side] / batch * 1e6 for side in SIDES},
               "overhead": best["auto_grammar"] / best["plain"] - 1,
               "sampler_us": {state: sampler_us(core, grammar, batch, state) for state in MASK_STATES}}
        rows.append(row)
    prompts = [core.tokenizer.encode_chat([{"role": "user", "content": q}], tools=tools)
               for q in questions(args.requests)]
    faults = {}
    for side in SIDES:
        params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, grammar=grammars[side])
        faults[side] = call_faults(_run_waves(core, prompts, num_seqs, params, args.seed), tools)
    return {
        "benchmark": NAME,
        "config": {"model": "rill-tiny", "tools": "openai_agents get_weather + get_time, not strict",
                   "temperature": 1.0, "batch_sizes": args.batch_sizes, "repeats": args.repeats,
                   "steps": args.steps, "requests": args.requests, "max_tokens": args.max_tokens, "seed": args.seed},
        "compile_ms": compile_ms,
        "rows": rows,
        "calls": {side: dict(faults[side]) for side in SIDES},
    }


def summary(result: dict) -> str:
    lines = [f"rill bench tool-calls (rill-tiny, temperature 1.0, the Agents SDK's tools; auto grammar compiled "
             f"in {result['compile_ms']:.1f} ms); decode tokens/s at full batch, the better median step of "
             f"{result['config']['repeats']} rounds"]
    for row in result["rows"]:
        plain, held = row["tokens_per_s"]["plain"], row["tokens_per_s"]["auto_grammar"]
        extra_us = row["us_per_token"]["auto_grammar"] - row["us_per_token"]["plain"]
        lines.append(f"  batch {row['batch']:>3}: plain {plain:,.0f} tok/s, auto grammar {held:,.0f} tok/s "
                     f"({row['overhead']:+.1%} time per token, {extra_us:+.0f} us)")
    for row in result["rows"]:
        extra = ", ".join(f"{state} {us['auto_grammar'] - us['plain']:+.0f} us"
                          for state, us in row["sampler_us"].items())
        lines.append(f"  sampler alone, batch {row['batch']:>3}: the grammar adds per step {extra} "
                     f"(plain {row['sampler_us']['text']['plain']:.0f} us)")
    for side in SIDES:
        c = result["calls"][side]
        lines.append(f"  {side}: {c.get('opened', 0)} calls opened in {c['answers']} answers; "
                     f"{c.get('undeclared_name', 0)} to an undeclared name, {c.get('bad_arguments', 0)} with arguments "
                     f"off the schema, {c.get('unparsed', 0)} not a call at all")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    from rill.bench.common import save_plot

    rows = result["rows"]

    def draw(axes) -> None:
        (ax,) = axes
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["tokens_per_s"]["plain"] for r in rows], 0.4, label="plain")
        ax.bar([x + 0.2 for x in xs], [r["tokens_per_s"]["auto_grammar"] for r in rows], 0.4,
               label='tool_choice "auto" grammar')
        for x, r in zip(xs, rows):
            ax.annotate(f"{r['overhead']:+.0%} time/token", (x + 0.2, r["tokens_per_s"]["auto_grammar"]),
                        ha="center", va="bottom")
        ax.set_xticks(list(xs), [str(r["batch"]) for r in rows])
        ax.set_xlabel("requests decoding at once")
        ax.set_ylabel("decode tokens/s (better median step)")
        ax.legend()

    save_plot(path, draw, title="rill-tiny with the Agents SDK's tools: the auto tool-call grammar's cost")
