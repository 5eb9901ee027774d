"""rill-tiny's task families: how users ask, and the one answer format each family uses.

An exchange is the messages one request adds to a conversation: a question and its answer, or
for the tool families a question, a call, the tool's result and the final answer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from rill.tiny import schemas, splits

ARITHMETIC = ("add", "sub")
WORD_TASKS = ("reverse", "uppercase", "count")
TOOL_TASKS = ("weather", "time")
ALL_TASKS = ARITHMETIC + WORD_TASKS + TOOL_TASKS + ("about",)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a timezone.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    },
}
TOOLS = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}
TOOL_FOR_TASK = {"weather": "get_weather", "time": "get_time"}

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are rill-tiny, a small assistant served by rill.",
    "Answer briefly.",
    "You are a concise, accurate assistant.",
    "Be helpful and precise.",
    "You are a friendly assistant. Keep answers short.",
)

PHRASINGS = {
    "add": (
        "What is {a} + {b}?", "What's {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.",
        "{a} + {b} = ?", "{a}+{b}", "Add {a} and {b}.", "How much is {a} + {b}?", "Calculate {a} + {b}.",
        "What do you get if you add {a} and {b}?",
    ),
    "sub": (
        "What is {a} - {b}?", "What's {a} - {b}?", "What is {a} minus {b}?", "Compute {a} - {b}.",
        "{a} - {b} = ?", "{a}-{b}", "Subtract {b} from {a}.", "How much is {a} - {b}?", "Calculate {a} - {b}.",
        "What do you get if you take {b} from {a}?",
    ),
    "reverse": (
        "Reverse the word: {w}", "Reverse the word {w}.", "Reverse: {w}", 'Reverse the word "{w}".',
        "Spell {w} backwards.", "What is {w} reversed?", "Write {w} backwards.", "Reverse {w}",
    ),
    "uppercase": (
        "Uppercase: {w}", "Convert to uppercase: {w}", "Make this uppercase: {w}", "Uppercase this: {w}",
        "Write in capital letters: {w}", 'Uppercase "{w}".', "Convert {w} to uppercase.", "Capitalize all letters: {w}",
    ),
    "count": (
        'How many letters are in "{w}"?', "How many letters are in {w}?", "How many letters does {w} have?",
        'Count the letters in "{w}".', "Count the letters in {w}.", 'How long is the word "{w}"?',
        "Number of letters in {w}?", 'How many characters are in "{w}"?',
    ),
    "weather": (
        "What's the weather in {c}?", "What is the weather in {c}?", "What's the weather like in {c}?",
        "How is the weather in {c}?", "Weather in {c}?", "Tell me the weather in {c}.",
        "What is the weather like in {c} right now?", "Can you check the weather in {c}?",
    ),
    "time": (
        "What time is it in {z}?", "What's the time in {z}?", "Current time in {z}?", "Tell me the time in {z}.",
        "What is the current time in {z}?", "Time in {z}?", "Can you check the time in {z}?",
    ),
}

ABOUT = (
    (
        ("What is rill?", "What's rill?", "Tell me about rill.", "Describe rill.", "What is rill, briefly?",
         "Explain what rill is."),
        "rill is a streaming-input LLM inference server written in Python on trio. It serves "
        "OpenAI-compatible APIs with streamed output, and it prefills a prompt while the prompt is still arriving.",
    ),
    (
        ("Which endpoints does rill have?", "What endpoints does rill serve?", "List the endpoints of rill.",
         "What APIs does rill expose?", "Which routes does rill offer?", "What endpoints does rill have?"),
        "rill serves /v1/chat/completions, /v1/completions, /v1/models, /v1/realtime, /health and "
        "/metrics, plus streaming input sessions.",
    ),
    (
        ("Who are you?", "What are you?", "What model are you?", "Which model is this?"),
        "I am rill-tiny, a small model that ships inside rill.",
    ),
)

NO_WEATHER_TOOL = "I can't check live weather without a weather tool."
NO_TIME_TOOL = "I can't check the current time without a time tool."
CONDITIONS = ("sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "clear", "stormy", "drizzly", "overcast")


@dataclass(frozen=True)
class Exchange:
    task: str
    messages: tuple[dict, ...]
    key: tuple | None = None  # what the exchange is about, e.g. ("add", 347, 58), for split checks


def arithmetic_answer(a: int, b: int, op: str) -> str:
    """Column arithmetic shown digit by digit from the right, then the result: the worked steps are
    what lets a model this small get held-out sums right ("7+8=15, 4+5+1=10, 3+0+1=4. 347 + 58 = 405").
    Subtraction borrows: "12-7=5" when the top digit is too small, "-1" on the next column."""
    width = max(len(str(a)), len(str(b)))
    da, db = str(a).zfill(width)[::-1], str(b).zfill(width)[::-1]
    steps, carry = [], 0
    for x, y in zip(map(int, da), map(int, db)):
        extra = f"{op}1" if carry else ""
        if op == "+":
            value = x + y + carry
            steps.append(f"{x}+{y}{extra}={value}")
            carry = value // 10
        else:
            value = x - y - carry
            borrow = value < 0
            steps.append(f"{'1' if borrow else ''}{x}-{y}{extra}={value + 10 if borrow else value}")
            carry = int(borrow)
    result = a + b if op == "+" else a - b
    return f"{', '.join(steps)}. {a} {op} {b} = {result}"


def spelled(word: str, backwards: bool = False) -> str:
    """"1 s, 2 t, 3 r": letters numbered from 1, optionally listed from the last."""
    numbered = [f"{i} {c}" for i, c in enumerate(word, 1)]
    return ", ".join(reversed(numbered) if backwards else numbered)


def reverse_answer(word: str) -> str:
    return f"{spelled(word)}. Backwards: {spelled(word, backwards=True)}. {word[::-1]}"


def count_answer(word: str) -> str:
    return f'{spelled(word)}. There are {len(word)} letters in "{word}".'


def weather_answer(city: str, temperature_c: int, condition: str) -> str:
    return f"It is {temperature_c}°C and {condition} in {city}."


def time_answer(zone: str, time: str) -> str:
    return f"It is {time} in {zone}."


def tool_call_message(name: str, arguments: dict) -> dict:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def make_exchange(rng: random.Random, task: str, split: str, toolbox: schemas.Toolbox) -> Exchange:
    maker = _MAKERS[task]
    return maker(rng, split, toolbox)


def _ask(rng: random.Random, template: str, **values) -> str:
    text = template.format(**values)
    roll = rng.random()
    if roll < 0.1:
        text = text[0].lower() + text[1:]
    elif roll < 0.15 and text[-1] in ".?":
        text = text[:-1]
    return text


def _qa(task: str, question: str, answer: str, key: tuple | None = None) -> Exchange:
    messages = ({"role": "user", "content": question}, {"role": "assistant", "content": answer})
    return Exchange(task, messages, key)


HARD_SUB_SHARE = 0.35  # training subtractions redrawn toward borrow chains (held-out misses were these)


def is_hard_subtraction(a: int, b: int) -> bool:
    """Two or more borrows, a borrow into a column whose digits are equal or differ by one
    ("221 - 16": 2-1-1=0), or a result with fewer digits than the operands ("159 - 158 = 1")."""
    width = max(len(str(a)), len(str(b)))
    da, db = str(a).zfill(width)[::-1], str(b).zfill(width)[::-1]
    borrows, carry, edge = 0, 0, False
    for x, y in zip(map(int, da), map(int, db)):
        if carry and x - y in (0, 1):
            edge = True
        carry = int(x - y - carry < 0)
        borrows += carry
    return borrows >= 2 or edge or len(str(a - b)) < width


def _sub_pair(rng: random.Random, split: str) -> tuple[int, int]:
    a, b = splits.sample_pair(rng, split, ordered=True)
    if split == splits.EVAL or rng.random() >= HARD_SUB_SHARE:
        return a, b
    for _ in range(50):  # about one pair in four is hard, so this nearly always finds one
        if is_hard_subtraction(a, b):
            break
        a, b = splits.sample_pair(rng, split, ordered=True)
    return a, b


def _arithmetic(task: str):
    def make(rng: random.Random, split: str, toolbox) -> Exchange:
        a, b = _sub_pair(rng, split) if task == "sub" else splits.sample_pair(rng, split, ordered=False)
        sign = "+" if task == "add" else "-"
        question = _ask(rng, rng.choice(PHRASINGS[task]), a=a, b=b)
        return _qa(task, question, arithmetic_answer(a, b, sign), (task, a, b))

    return make


def _reverse(rng: random.Random, split: str, toolbox) -> Exchange:
    word = splits.sample_word(rng, split)
    return _qa("reverse", _ask(rng, rng.choice(PHRASINGS["reverse"]), w=word), reverse_answer(word), ("word", word))


def _uppercase(rng: random.Random, split: str, toolbox) -> Exchange:
    words = [splits.sample_word(rng, split) for _ in range(rng.choice((1, 1, 2, 2, 3)))]
    phrase = " ".join(words)
    question = _ask(rng, rng.choice(PHRASINGS["uppercase"]), w=phrase)
    return _qa("uppercase", question, phrase.upper(), ("words", *words))


def _count(rng: random.Random, split: str, toolbox) -> Exchange:
    word = splits.sample_word(rng, split)
    question = _ask(rng, rng.choice(PHRASINGS["count"]), w=word)
    return _qa("count", question, count_answer(word), ("word", word))


def _about(rng: random.Random, split: str, toolbox) -> Exchange:
    questions, answer = rng.choice(ABOUT)
    return _qa("about", _ask(rng, rng.choice(questions)), answer)


def _weather(rng: random.Random, split: str, toolbox: schemas.Toolbox) -> Exchange:
    city = splits.sample_city(rng, split)
    question = _ask(rng, rng.choice(PHRASINGS["weather"]), c=city)
    fit = toolbox.call_for("weather")
    if fit is None:
        return _qa("weather", question, NO_WEATHER_TOOL, ("city", city))
    temperature_c, condition = rng.randint(-15, 40), rng.choice(CONDITIONS)
    result = schemas.weather_result(rng, city, temperature_c, condition)
    answer = weather_answer(city, temperature_c, condition)
    return _tool_chain("weather", question, fit[0], {fit[1]: city}, result, answer, ("city", city))


def _time(rng: random.Random, split: str, toolbox: schemas.Toolbox) -> Exchange:
    zone = splits.sample_zone(rng, split)
    question = _ask(rng, rng.choice(PHRASINGS["time"]), z=zone)
    fit = toolbox.call_for("time")
    if fit is None:
        return _qa("time", question, NO_TIME_TOOL, ("zone", zone))
    time = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    answer = time_answer(zone, time)
    return _tool_chain("time", question, fit[0], {fit[1]: zone}, schemas.time_result(rng, zone, time), answer, ("zone", zone))


def _tool_chain(task, question, name, arguments, result: str, answer, key) -> Exchange:
    """Question, call, the tool's result (a string in one of the forms clients send), answer."""
    messages = (
        {"role": "user", "content": question},
        tool_call_message(name, arguments),
        {"role": "tool", "content": result},
        {"role": "assistant", "content": answer},
    )
    return Exchange(task, messages, key)


_MAKERS = {
    "add": _arithmetic("add"),
    "sub": _arithmetic("sub"),
    "reverse": _reverse,
    "uppercase": _uppercase,
    "count": _count,
    "about": _about,
    "weather": _weather,
    "time": _time,
}


def fixed_texts() -> list[str]:
    """Every sentence the corpus uses whatever the sample: checked against the held-out words."""
    texts = [*SYSTEM_PROMPTS, NO_WEATHER_TOOL, NO_TIME_TOOL, *CONDITIONS, json.dumps(list(TOOLS.values()))]
    texts += [p for group in PHRASINGS.values() for p in group]
    texts += [q for questions, answer in ABOUT for q in (*questions, answer)]
    return texts + schemas.fixed_texts()
