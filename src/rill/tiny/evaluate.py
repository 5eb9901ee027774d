"""Held-out evaluation of rill-tiny: exact-answer accuracy per task family at temperature 0.

    rill eval-tiny [--model DIR] [--per-family N] [--json FILE] [--backend transformers|rill]

Cases come from the held-out split (number pairs, words, cities and zones the recipe never
trains on), each after 0-4 earlier exchanges, with or without a system prompt. The tool families
list their tools in the exact shapes agent frameworks emit (schemas.PRESETS: LangChain, llm, the
OpenAI Agents SDK, LlamaIndex, instructor, no `required`, an enum parameter, and rill's own), beside
tools that fit nothing, and tool results come in the forms clients send. Each family's
first case is the issue's own example. Generation goes through a backend: transformers
(greedy `generate`) or rill's offline `LLM`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rill.tiny import corpus, schemas, splits, tasks

FAMILIES = ("add", "sub", "reverse", "uppercase", "count", "weather_call", "time_call", "tool_answer", "no_tool", "about")
CALL_FAMILIES = ("weather_call", "time_call")
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "rill-tiny"
MAX_TOKENS = 256
BAR = 0.95
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class EvalCase:
    family: str
    messages: tuple[dict, ...]  # the prompt
    tools: tuple[dict, ...] | None
    expected: str | dict  # the exact answer text, or the call {"name": ..., "arguments": {...}}
    shape: str | None = None  # the framework schema shape of the tools listed (schemas.PRESETS)


def parse_tool_calls(text: str) -> list[dict] | None:
    """The JSON of each <tool_call> block; None when a block is not valid JSON."""
    try:
        return [json.loads(body) for body in _TOOL_CALL.findall(text)]
    except json.JSONDecodeError:
        return None


def is_correct(case: EvalCase, text: str) -> bool:
    if isinstance(case.expected, dict):  # exactly one call, nothing else said
        return parse_tool_calls(text) == [case.expected] and not _TOOL_CALL.sub("", text).strip()
    return text.strip() == case.expected


# -- cases ---------------------------------------------------------------------------------------


def make_cases(per_family: int, seed: int = 1234) -> list[EvalCase]:
    rng = random.Random(seed)
    cases = []
    for family in FAMILIES:
        examples = issue_examples()[family][:per_family]
        cases += examples + [_sample_case(rng, family) for _ in range(per_family - len(examples))]
    return cases


def _sample_case(rng: random.Random, family: str) -> EvalCase:
    """Tool families list their tools in one framework's exact shape, with the names frameworks give."""
    task, shape, toolbox = family, None, None
    if family in CALL_FAMILIES or family == "tool_answer":
        task = family.removesuffix("_call") if family in CALL_FAMILIES else rng.choice(tasks.TOOL_TASKS)
        other = [k for k in schemas.KINDS if k != task] if rng.random() < 0.5 else []
        shape, toolbox = _framework_toolbox(rng, [task, *other], rng.choice((0, 0, 1, 2)))
    elif family == "no_tool":
        task = rng.choice(tasks.TOOL_TASKS)
        roll = rng.random()
        if roll < 1 / 3:
            toolbox = schemas.Toolbox()
        else:  # only tools that do not fit: the other family's tool, or tools that fit neither
            other = [k for k in schemas.KINDS if k != task] if roll < 2 / 3 else []
            shape, toolbox = _framework_toolbox(rng, other, rng.choice((0, 1)) if other else rng.choice((1, 2)))
    conversation = corpus.sample_conversation(rng, splits.EVAL, task, toolbox=toolbox)
    return _cut(family, conversation.messages, conversation.tools, shape)


def _framework_toolbox(rng: random.Random, kinds: list[str], num_distractors: int) -> tuple[str, schemas.Toolbox]:
    shape = rng.choice(list(schemas.PRESETS))
    chosen = {kind: schemas.preset_tool(shape, kind) for kind in kinds}
    return shape, schemas.sample_toolbox(rng, kinds, num_distractors, schemas.PRESETS[shape], chosen)


def _cut(family: str, messages: Sequence[dict], tools, shape: str | None = None) -> EvalCase:
    """The prompt ends before the message under test: the call for call families, else the last answer."""
    if family in CALL_FAMILIES:
        messages = messages[:-2]  # drop the tool result and the final answer
        call = messages[-1]["tool_calls"][0]["function"]
        expected = {"name": call["name"], "arguments": call["arguments"]}
        return EvalCase(family, tuple(messages[:-1]), tools, expected, shape)
    return EvalCase(family, tuple(messages[:-1]), tools, messages[-1]["content"], shape)


def issue_examples() -> dict[str, list[EvalCase]]:
    both = (tasks.WEATHER_TOOL, tasks.TIME_TOOL)
    weather = [{"role": "user", "content": "What's the weather in Tokyo?"}, tasks.tool_call_message("get_weather", {"city": "Tokyo"})]
    result = {"role": "tool", "content": '{"temperature_c": 21, "condition": "sunny"}'}
    time_q = [{"role": "user", "content": "What time is it in Europe/Paris?"}, tasks.tool_call_message("get_time", {"timezone": "Europe/Paris"})]
    time_result = {"role": "tool", "content": '{"time": "09:30", "timezone": "Europe/Paris"}'}
    compact = {"role": "tool", "content": '{"temperature_c":2,"condition":"snowy"}'}  # JSON.stringify, as the JS SDK sends

    def ask(family, question, answer, tools=None, shape=None):
        return EvalCase(family, ({"role": "user", "content": question},), tools, answer, shape)

    def framework(shape, *kinds):
        return tuple(framework_tool(shape, kind) for kind in kinds)

    def call(family, question, shape, tools, name, arguments):
        return ask(family, question, {"name": name, "arguments": arguments}, tools, shape)

    return {
        "add": [ask("add", "What is 347 + 58?", tasks.arithmetic_answer(347, 58, "+"))],
        "sub": [ask("sub", "What is 512 - 77?", tasks.arithmetic_answer(512, 77, "-"))],
        "reverse": [ask("reverse", "Reverse the word: stream", tasks.reverse_answer("stream"))],
        "uppercase": [ask("uppercase", "Uppercase: hello world", "HELLO WORLD")],
        "count": [ask("count", 'How many letters are in "banana"?', tasks.count_answer("banana"))],
        "weather_call": [
            _cut("weather_call", weather + [result, {}], both),
            call("weather_call", "What's the weather in Tokyo?", "langchain", framework("langchain", "weather", "time"),
                 "get_weather", {"city": "Tokyo"}),
            call("weather_call", "What's the weather in Tokyo?", "instructor", framework("instructor", "weather"),
                 "GetWeather", {"city": "Tokyo"}),
        ],
        "time_call": [
            _cut("time_call", time_q + [time_result, {}], both),
            call("time_call", "What time is it in Europe/Paris?", "openai_agents", framework("openai_agents", "weather", "time"),
                 "get_time", {"timezone": "Europe/Paris"}),
        ],
        "tool_answer": [
            EvalCase("tool_answer", (*weather, result), both, tasks.weather_answer("Tokyo", 21, "sunny")),
            EvalCase("tool_answer", (*time_q, time_result), both, tasks.time_answer("Europe/Paris", "09:30")),
            EvalCase("tool_answer", (*weather, compact), both, tasks.weather_answer("Tokyo", 2, "snowy")),
        ],
        "no_tool": [
            ask("no_tool", "What's the weather in Tokyo?", tasks.NO_WEATHER_TOOL),
            ask("no_tool", "What's the weather in Tokyo?", tasks.NO_WEATHER_TOOL,
                (schemas.function_tool("search_web", ("query",), "Search the web for a query.", schemas.PRESETS["langchain"]),),
                "langchain"),
        ],
        "about": [ask("about", "What is rill?", tasks.ABOUT[0][1]), ask("about", "Which endpoints does rill have?", tasks.ABOUT[1][1])],
    }


def framework_tool(shape: str, kind: str) -> dict:
    """get_weather / get_time exactly as the framework `shape` sends them (schemas.PRESETS)."""
    name, param, doc = schemas.preset_tool(shape, kind)
    return schemas.function_tool(name, (param,), doc, schemas.PRESETS[shape],
                                 enum=schemas.EXTRA_ENUMS[kind] if schemas.PRESETS[shape].enum else None)


# -- backends ------------------------------------------------------------------------------------


class TransformersBackend:
    """Greedy generation with transformers, batched with left padding."""

    def __init__(self, model_dir: Path, device: str = "cpu", batch_size: int = 64) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
        self.device, self.batch_size = device, batch_size

    def generate(self, cases: Sequence[EvalCase], max_tokens: int) -> list[str]:
        prompts = [self._prompt(c) for c in cases]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        texts = [""] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, text in zip(chunk, self._generate([prompts[i] for i in chunk], max_tokens)):
                texts[i] = text
        return texts

    def _prompt(self, case: EvalCase) -> str:
        tools = list(case.tools) if case.tools else None
        return self.tokenizer.apply_chat_template(list(case.messages), tools=tools, add_generation_prompt=True, tokenize=False)

    def _generate(self, prompts: list[str], max_tokens: int) -> list[str]:
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with self.torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=max_tokens, do_sample=False)
        new = out[:, batch["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new, skip_special_tokens=True)


class RillBackend:
    """rill's own runtime: `LLM(path).chat(...)`, one call per distinct tools list."""

    def __init__(self, model_dir: Path) -> None:
        from rill import LLM, SamplingParams

        self.llm, self.sampling_params = LLM(str(model_dir)), SamplingParams

    def generate(self, cases: Sequence[EvalCase], max_tokens: int) -> list[str]:
        params = self.sampling_params(temperature=0, max_tokens=max_tokens)
        groups: dict[str, list[int]] = {}
        for i, case in enumerate(cases):
            groups.setdefault(json.dumps(case.tools), []).append(i)
        texts = [""] * len(cases)
        for indices in groups.values():
            tools = list(cases[indices[0]].tools) if cases[indices[0]].tools else None
            outputs = self.llm.chat([list(cases[i].messages) for i in indices], params, tools=tools)
            for i, output in zip(indices, outputs):
                texts[i] = output.outputs[0].text
        return texts


# -- report --------------------------------------------------------------------------------------


def evaluate(backend, cases: Sequence[EvalCase], max_tokens: int = MAX_TOKENS) -> dict:
    started = time.perf_counter()
    texts = backend.generate(cases, max_tokens)
    results = {f: {"n": 0, "correct": 0, "failures": []} for f in FAMILIES}
    shapes = {s: {"n": 0, "correct": 0} for s in schemas.PRESETS}  # the tool families' cases by schema shape
    for case, text in zip(cases, texts):
        entry = results[case.family]
        entry["n"] += 1
        right = is_correct(case, text)
        entry["correct"] += right
        if case.shape:
            shapes[case.shape]["n"] += 1
            shapes[case.shape]["correct"] += right
        if not right and len(entry["failures"]) < 5:
            entry["failures"].append({"prompt": case.messages[-1].get("content"), "shape": case.shape,
                                      "expected": case.expected, "got": text})
    for entry in (*results.values(), *shapes.values()):
        entry["accuracy"] = entry["correct"] / entry["n"] if entry["n"] else None
    return {"families": results, "shapes": shapes, "seconds": round(time.perf_counter() - started, 1), "num_cases": len(cases)}


def format_table(report: dict) -> str:
    lines = ["| family | held-out accuracy | correct / n |", "|---|---|---|"]
    for family, entry in report["families"].items():
        if entry["n"]:
            lines.append(f"| {family} | {entry['accuracy']:.1%} | {entry['correct']} / {entry['n']} |")
    shapes = [f"{s} {e['correct']}/{e['n']}" for s, e in report.get("shapes", {}).items() if e["n"]]
    if shapes:
        lines.append(f"\ntool families by schema shape: {', '.join(shapes)}")
    return "\n".join(lines)


def plot(report: dict, path: Path, *, measure: str = "held-out accuracy", unit: str = "cases") -> Path:
    """Accuracy per family as bars, with the bar every family must reach (ImportError without matplotlib).
    rill eval-tiny-speech draws its table with it too (measure "held-out exact transcripts", unit "clips")."""
    from rill.bench.common import save_plot

    families = [f for f, e in report["families"].items() if e["n"]]
    accuracy = [100 * report["families"][f]["accuracy"] for f in families]

    def draw(axes):
        ax = axes[0]
        bars = ax.bar(families, accuracy, color=["tab:green" if a >= 100 * BAR else "tab:red" for a in accuracy])
        ax.axhline(100 * BAR, color="black", linestyle="--", linewidth=1, label=f"bar {BAR:.0%}")
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_ylim(0, 105)
        ax.set_ylabel(f"{measure} (%)")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(loc="lower right")

    n = max(report["families"][f]["n"] for f in families) if families else 0
    return save_plot(path, draw, title=f"{Path(report['model']).name}: {n} held-out {unit} per family, "
                                        f"{report['backend']} backend")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rill eval-tiny", description="Held-out accuracy of rill-tiny per task family.")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="Hugging Face model directory")
    p.add_argument("--per-family", type=int, default=100, help="cases per family")
    p.add_argument("--json", type=Path, default=None, help="write the full report here (and a plot beside it, FILE.png)")
    p.add_argument("--backend", choices=("transformers", "rill"), default="rill")
    p.add_argument("--device", default="cpu", help="device for the transformers backend")
    p.add_argument("--seed", type=int, default=1234, help="seed of the held-out cases")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend == "rill":
        backend = RillBackend(args.model)
    else:
        backend = TransformersBackend(args.model, args.device)
    report = evaluate(backend, make_cases(args.per_family, args.seed))
    report.update(backend=args.backend, model=str(args.model), per_family=args.per_family, seed=args.seed)
    print(format_table(report))
    print(f"{report['num_cases']} cases in {report['seconds']} s with the {args.backend} backend")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        try:
            png = plot(report, args.json.with_suffix(".png"))
        except ImportError:
            print(f"wrote {args.json} (install the bench extra for a plot)")
        else:
            print(f"wrote {args.json} and {png}")
    below = [f for f, e in report["families"].items() if e["n"] and e["accuracy"] < BAR]
    if below:
        print(f"below {BAR:.0%}: {', '.join(below)}", file=sys.stderr)
    return 1 if below else 0


if __name__ == "__main__":
    raise SystemExit(main())
