"""Synthetic conversations for rill-tiny: a final exchange preceded by up to four earlier ones.

A conversation may carry a system prompt and a tools list in one framework's schema shape
(schemas.py): the weather tool, the time tool, tools that fit neither, or none. Tool families
call the listed tool that fits, by its name and parameter, and answer in plain text when none
fits, so the model learns to read the tools list rather than to always call.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from rill.tiny import schemas, tasks
from rill.tiny.template import render

# How often each family closes a training conversation (history turns draw from the same mix).
TRAIN_WEIGHTS = {"add": 3.0, "sub": 5.5, "reverse": 2.0, "uppercase": 2.0, "count": 1.5, "weather": 3.5, "time": 3.5, "about": 1.0}
MAX_HISTORY = 4


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


def sample_toolbox(rng: random.Random, task: str) -> schemas.Toolbox:
    """Tool families mostly get their tool, often beside the other one and tools that fit nothing;
    otherwise no tools, the other one, or only tools that fit nothing (then they answer without a
    call). Other families mostly get none (CPU training time goes with prompt length)."""
    if task in tasks.TOOL_TASKS:
        other = [k for k in schemas.KINDS if k != task]
        if rng.random() < 0.7:
            kinds = [task] + (other if rng.random() < 0.5 else [])
            return schemas.sample_toolbox(rng, kinds, rng.choice((0, 0, 0, 1, 1, 2)))
        roll = rng.random()
        if roll < 0.4:
            return schemas.Toolbox()
        return schemas.sample_toolbox(rng, other if roll < 0.7 else [], rng.choice((1, 1, 2)))
    if rng.random() < 0.75:
        return schemas.Toolbox()
    kinds = [k for k in schemas.KINDS if rng.random() < 0.6]
    return schemas.sample_toolbox(rng, kinds, rng.choice((0, 1)) if kinds else rng.choice((1, 2)))


def sample_conversation(
    rng: random.Random,
    split: str,
    task: str | None = None,
    *,
    toolbox: schemas.Toolbox | None = None,
    num_history: int | None = None,
    system: bool | None = None,
) -> Conversation:
    """One conversation ending with an exchange of `task`; unset arguments are drawn from rng."""
    task = task or sample_task(rng)
    toolbox = sample_toolbox(rng, task) if toolbox is None else toolbox
    if num_history is None:
        num_history = rng.choice((0, 0, 0, 1, 2, 3, 4))
    if system is None:
        system = rng.random() < 0.5
    exchanges = [tasks.make_exchange(rng, sample_task(rng), split, toolbox) for _ in range(num_history)]
    exchanges.append(tasks.make_exchange(rng, task, split, toolbox))
    messages = [{"role": "system", "content": rng.choice(tasks.SYSTEM_PROMPTS)}] if system else []
    for exchange in exchanges:
        messages.extend(exchange.messages)
    return Conversation(tuple(messages), toolbox.tools or None, tuple(exchanges))


def iter_conversations(seed: int, split: str) -> Iterator[Conversation]:
    rng = random.Random(seed)
    while True:
        yield sample_conversation(rng, split)

