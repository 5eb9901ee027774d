"""Streamed text input: the chat prompt split around the message being streamed, and text
tokenized piece by piece into the same ids as the whole text.

A prompt is `prefix + text + suffix`, where prefix is the chat template over the conversation up
to the new user message's text and suffix closes it and opens the assistant's answer. The
template is rendered once with a sentinel in place of the text and split there.

Tokenizers merge across piece boundaries, so `IncrementalEncoder` holds back the last two words
(whitespace-delimited): they may still change when more text arrives. It only releases a
cut whose two sides encode to exactly the tokens of the whole, so the ids sent to the engine
equal `encode(prefix + text + suffix)` (verified per cut; `tests/test_realtime_input.py` checks
it on random splits). Text with no whitespace (CJK, say) is cut every few dozen characters
where a cut verifies, or only at commit.
"""

from __future__ import annotations

from dataclasses import dataclass

from rill.errors import ValidationError
from rill.tokenizer import Tokenizer
from rill.transports.realtime_events import RealtimeError

SENTINEL = "\u2063rill-streamed-input\u2063"  # invisible separators: a template's trim keeps it whole
HOLD_WORDS = 2
LONG_WORD_CHARS = 64  # with no whitespace, try a cut this far back from the end
MAX_CUT_TRIES = 3


@dataclass
class InputTurn:
    """A user message streaming into engine session `request_id`."""

    request_id: str
    encoder: IncrementalEncoder
    suffix: str  # closes the message and opens the answer
    per_chunk: bool  # respond_per_chunk: every piece is tokenized (and answered) at once
    text: str = ""


@dataclass(frozen=True)
class PromptSplit:
    prefix: str
    suffix: str


def split_prompt(tokenizer: Tokenizer, messages: list[dict], tools: list[dict] | None) -> PromptSplit:
    """The chat prompt around a new user message whose text is still arriving."""
    try:
        text = tokenizer.apply_chat_template([*messages, {"role": "user", "content": SENTINEL}], tools=tools)
    except ValidationError as exc:
        raise RealtimeError(exc.code, exc.message, "conversation") from exc
    parts = text.split(SENTINEL)
    if len(parts) != 2:
        raise RealtimeError("template_unsupported", "this model's chat template does not copy a user message's "
                            "text as it is, so text cannot be streamed into it; send the whole text with "
                            "conversation.item.create")
    return PromptSplit(*parts)


class IncrementalEncoder:
    """Text in pieces -> token ids equal to those of the whole text, as soon as they are stable."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._pending = ""  # text received, not yet tokenized for good
        self.num_tokens = 0

    def feed(self, text: str) -> list[int]:
        """Ids that text settles; the tail that may still change is kept for later."""
        self._pending += text
        for cut in self._cuts():
            ids = self._split_ids(cut)
            if ids is not None:
                self._pending = self._pending[cut:]
                return self._count(ids)
        return []

    def flush(self) -> list[int]:
        """Everything pending (end of the text, or a chunk that must be seen now)."""
        ids, self._pending = self._encode(self._pending), ""
        return self._count(ids)

    def _count(self, ids: list[int]) -> list[int]:
        self.num_tokens += len(ids)
        return ids

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False) if text else []

    def _cuts(self) -> list[int]:
        """Candidate cut points, latest first: word starts before the last HOLD_WORDS words."""
        text = self._pending
        starts = [i for i in range(1, len(text)) if text[i].isspace() and not text[i - 1].isspace()]
        cuts = starts[:-HOLD_WORDS] if len(starts) > HOLD_WORDS else []
        if not cuts and len(text) > 2 * LONG_WORD_CHARS:
            cuts = [len(text) - LONG_WORD_CHARS]
        return cuts[::-1][:MAX_CUT_TRIES]

    def _split_ids(self, cut: int) -> list[int] | None:
        """The ids before `cut` if the two sides encode to exactly the whole's ids, else None."""
        head = self._encode(self._pending[:cut])
        whole = self._encode(self._pending)
        tail = self._encode(self._pending[cut:])
        return head if head + tail == whole else None
