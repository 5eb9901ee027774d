"""`<think>...</think>` reasoning, split from the answer into `reasoning_content`.

Two conventions, chosen by name with --reasoning-parser:
  qwen3        reasoning only when the output opens with `<think>`
  deepseek_r1  the output starts inside reasoning (the template opened `<think>`), an opening
               tag the model writes anyway is dropped
Either way reasoning ends at `</think>`. One streamer serves both paths: a finished text is
one delta followed by `finish`.
"""

from __future__ import annotations

import enum

from rill.openai.tool_parser import held_back

THINK_START = "<think>"
THINK_END = "</think>"
REASONING_PARSERS = ("qwen3", "deepseek_r1")


class _State(enum.Enum):
    OPENING = "opening"  # not yet known whether the output opens with <think>
    REASONING = "reasoning"
    ANSWER = "answer"


class ReasoningStreamer:
    def __init__(self, parser: str):
        if parser not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; choose from {REASONING_PARSERS}")
        self._starts_inside = parser == "deepseek_r1"
        self._state = _State.OPENING
        self._text = ""

    def feed(self, delta: str) -> tuple[str, str]:
        """Returns (reasoning, answer) text released by this delta."""
        self._text += delta
        if self._state is _State.OPENING and not self._open():
            return "", ""
        if self._state is _State.REASONING:
            return self._scan_reasoning()
        answer, self._text = self._text, ""
        return "", answer

    def finish(self) -> tuple[str, str]:
        text, self._text = self._text, ""
        if self._state is _State.REASONING:
            return text, ""
        return "", text

    def _open(self) -> bool:
        """Decide whether the output opens in reasoning; False while the start is still ambiguous."""
        stripped = self._text.lstrip()
        if len(stripped) < len(THINK_START) and THINK_START.startswith(stripped):
            return False
        if stripped.startswith(THINK_START):
            self._text, self._state = stripped[len(THINK_START):], _State.REASONING
        else:
            self._state = _State.REASONING if self._starts_inside else _State.ANSWER
        return True

    def _scan_reasoning(self) -> tuple[str, str]:
        at = self._text.find(THINK_END)
        if at >= 0:
            reasoning, answer = self._text[:at], self._text[at + len(THINK_END):]
            self._text, self._state = "", _State.ANSWER
            return reasoning, answer
        cut = len(self._text) - held_back(self._text, THINK_END)
        reasoning, self._text = self._text[:cut], self._text[cut:]
        return reasoning, ""


def split_reasoning(parser: str, text: str) -> tuple[str | None, str]:
    """(reasoning or None, answer) of a finished output."""
    streamer = ReasoningStreamer(parser)
    r1, a1 = streamer.feed(text)
    r2, a2 = streamer.finish()
    reasoning = r1 + r2
    return (reasoning or None), a1 + a2
