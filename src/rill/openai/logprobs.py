"""Engine logprobs -> OpenAI's two logprob shapes (chat's list of tokens, completions' columns).

A token is shown as its own decoded text (special tokens included), as vLLM shows it; a token
holding part of a UTF-8 character decodes to U+FFFD, and `bytes` carries its exact text bytes."""

from __future__ import annotations

from collections.abc import Iterable

from rill.openai.responses import ChatLogprob, ChatLogprobs, CompletionLogprobs, TopLogprob
from rill.outputs import TokenLogprob


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _top(tokenizer, token_id: int, logprob: float) -> TopLogprob:
    text = token_text(tokenizer, token_id)
    return TopLogprob(text, logprob, list(text.encode()))


def chat_logprobs(tokenizer, logprobs: Iterable[TokenLogprob], num_top: int) -> ChatLogprobs:
    content = []
    for lp in logprobs:
        text = token_text(tokenizer, lp.token_id)
        top = [_top(tokenizer, t, v) for t, v in (lp.top or [])[:num_top]]
        content.append(ChatLogprob(text, lp.logprob, list(text.encode()), top))
    return ChatLogprobs(content)


def completion_logprobs(tokenizer, logprobs: Iterable[TokenLogprob], num_top: int,
                        text_offset: int) -> CompletionLogprobs:
    """Columns for these tokens; offsets count from `text_offset` (the choice's text so far)."""
    out = CompletionLogprobs()
    for lp in logprobs:
        text = token_text(tokenizer, lp.token_id)
        out.tokens.append(text)
        out.token_logprobs.append(lp.logprob)
        out.text_offset.append(text_offset)
        out.top_logprobs.append({token_text(tokenizer, t): v for t, v in (lp.top or [])[:num_top]} or None)
        text_offset += len(text)
    return out
