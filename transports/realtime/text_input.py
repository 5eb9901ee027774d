"""Streamed text input: the chat prompt split around the user message being streamed, and the
turn that tokenizes it as it arrives.

A prompt is `prefix + text + suffix`, where prefix is the chat template over the conversation up
to the new user message's text and suffix closes it and opens the assistant's answer. The
template is rendered once with a placeholder in place of the text and split there. The text goes
through `rill.tokenizer.IncrementalEncoder`, so the ids sent to the engine equal those of the
whole prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rill.errors import TemplateRewritesTextError, ValidationError
from rill.tokenizer import IncrementalEncoder, Tokenizer
from rill.tokenizer.chat_template import STREAMED_TEXT_PLACEHOLDER, split_at_placeholder
from rill.transports.realtime.events import RealtimeError


@dataclass
class InputTurn:
    """A user message streaming into engine session `request_id`."""

    request_id: str
    encoder: IncrementalEncoder
    suffix: str  # closes the message and opens the answer
    per_chunk: bool  # respond_per_chunk: every piece is tokenized (and answered) at once
    text: str = ""
    # A model that reads pictures or video (rill.transports.realtime.video): the prompt as the engine
    # session holds it (rill.live_video.context), tokens sent to it, and the message's text and videos.
    context: Any = None
    num_sent: int = 0
    parts: list = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """The prompt's length so far (pictures and frames placed)."""
        return self.context.num_tokens if self.context is not None else self.encoder.num_committed_tokens


@dataclass(frozen=True)
class PromptSplit:
    prefix: str
    suffix: str


def split_prompt(tokenizer: Tokenizer, messages: list[dict], tools: list[dict] | None) -> PromptSplit:
    """The chat prompt around a new user message whose text is still arriving."""
    user = {"role": "user", "content": STREAMED_TEXT_PLACEHOLDER}
    try:
        rendered = tokenizer.apply_chat_template([*messages, user], tools=tools)
        return PromptSplit(*split_at_placeholder(rendered, STREAMED_TEXT_PLACEHOLDER))
    except TemplateRewritesTextError as exc:
        raise RealtimeError("template_unsupported", "this model's chat template does not copy a user message's "
                            "text as it is, so text cannot be streamed into it; send the whole text with "
                            "conversation.item.create") from exc
    except ValidationError as exc:
        raise RealtimeError(exc.code, exc.message, "conversation") from exc
