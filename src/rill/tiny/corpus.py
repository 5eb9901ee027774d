"""Synthetic conversations for rill-tiny: a final exchange preceded by up to four earlier ones.

A conversation may carry a system prompt and a tools list (any subset of get_weather and
get_time). Tool families call their tool only when it is listed and answer in plain text
otherwise, so the model learns to read the tools list rather than to always call.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rill.tiny import splits, tasks
from rill.tiny.template import render

# How often each family closes a training conversation (history turns draw from the same mix).
TRAIN_WEIGHTS = {"add": 3.0, "sub": 4.5, "reverse": 2.0, "uppercase": 2.0, "count": 1.5, "weather": 3.0, "time": 3.0, "about": 1.0}
MAX_HISTORY = 4
TOOL_SETS = ((), ("get_weather",), ("get_time",), ("get_weather", "get_time"), ("get_time", "get_weather"))


@dataclass(frozen=True)
class Conversation:
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    exchanges: tuple[tasks.Exchange, ...]

    @property
    def task(self) -> str:
        return self.exchanges[-1].task

    @property
    def keys(self) -> list[tuple]:
        return [e.key for e in self.exchanges if e.key is not None]

    def text(self) -> str:
        return render(self.messages, self.tools)


def sample_task(rng: random.Random) -> str:
    names = list(TRAIN_WEIGHTS)
    return rng.choices(names, weights=[TRAIN_WEIGHTS[n] for n in names])[0]


def sample_tool_names(rng: random.Random, task: str) -> tuple[str, ...]:
    """Tool families mostly get their tool; other families mostly get none (tool lists are long in
    a character-level model, and CPU training time goes with prompt length)."""
    if task in tasks.TOOL_TASKS:
        wanted = tasks.TOOL_FOR_TASK[task]
        with_tool = [s for s in TOOL_SETS if wanted in s]
        return rng.choice(with_tool) if rng.random() < 0.7 else rng.choice([s for s in TOOL_SETS if wanted not in s])
    return () if rng.random() < 0.75 else rng.choice(TOOL_SETS[1:])


def sample_conversation(
    rng: random.Random,
    split: str,
    task: str | None = None,
    *,
    tool_names: Sequence[str] | None = None,
    num_history: int | None = None,
    system: bool | None = None,
    vary_tool_json: bool = False,
) -> Conversation:
    """One conversation ending with an exchange of `task`; unset arguments are drawn from rng."""
    task = task or sample_task(rng)
    tool_names = tuple(sample_tool_names(rng, task) if tool_names is None else tool_names)
    if num_history is None:
        num_history = rng.choice((0, 0, 0, 1, 2, 3, 4))
    if system is None:
        system = rng.random() < 0.5
    exchanges = [tasks.make_exchange(rng, sample_task(rng), split, tool_names) for _ in range(num_history)]
    exchanges.append(tasks.make_exchange(rng, task, split, tool_names))
    messages = [{"role": "system", "content": rng.choice(tasks.SYSTEM_PROMPTS)}] if system else []
    for exchange in exchanges:
        messages.extend(exchange.messages)
    tools = tuple(_tool_json(rng, name, vary_tool_json) for name in tool_names) or None
    return Conversation(tuple(messages), tools, tuple(exchanges))


def iter_conversations(seed: int, split: str) -> Iterator[Conversation]:
    rng = random.Random(seed)
    vary = split == splits.TRAIN
    while True:
        yield sample_conversation(rng, split, vary_tool_json=vary)


def _tool_json(rng: random.Random, name: str, vary: bool) -> dict:
    """The tool schema; in training half are key-sorted, as Jinja's own tojson would print them."""
    tool = tasks.TOOLS[name]
    return _sorted_keys(tool) if vary and rng.random() < 0.5 else tool


def _sorted_keys(value):
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    return value
