"""Engine logprobs -> OpenAI's two logprob shapes (chat's list of tokens, completions' columns).

A token is shown as its own decoded text (special tokens included), as vLLM shows it; a token
holding part of a UTF-8 character decodes to U+FFFD, and `bytes` carries its exact text bytes."""

from __future__ import annotations

from collections.abc import Iterable

from rill.openai.chat_bodies import ChatLogprob, ChatLogprobs, CompletionLogprobs, TopLogprob
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
        text_offset = _add_column(out, tokenizer, lp.token_id, lp, num_top, text_offset)
    return out


def echo_logprobs(tokenizer, prompt_ids: list[int], prompt_logprobs: list[TokenLogprob | None],
                  num_top: int) -> CompletionLogprobs:
    """Columns for an echoed prompt. Its first token has nothing before it, so its logprob and top
    logprobs are null, as OpenAI and vLLM send them."""
    out = CompletionLogprobs()
    text_offset = 0
    for token_id, lp in zip(prompt_ids, prompt_logprobs):
        text_offset = _add_column(out, tokenizer, token_id, lp, num_top, text_offset)
    return out


def _add_column(out: CompletionLogprobs, tokenizer, token_id: int, lp: TokenLogprob | None, num_top: int,
                text_offset: int) -> int:
    """Append one token's column; return the offset after its text."""
    text = token_text(tokenizer, token_id)
    out.tokens.append(text)
    out.text_offset.append(text_offset)
    if lp is None:
        out.token_logprobs.append(None)
        out.top_logprobs.append(None)
    else:
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append(_top_dict(tokenizer, text, lp, num_top))
    return text_offset + len(text)


def _top_dict(tokenizer, text: str, lp: TokenLogprob, num_top: int) -> dict[str, float]:
    """The chosen token and the num_top most likely: "the API will always return the logprob of the
    sampled token, so there may be up to logprobs+1 elements" (OpenAI's completions reference; vLLM
    does the same, the chosen token first)."""
    top = {text: lp.logprob}
    for token_id, value in (lp.top or [])[:num_top]:
        top.setdefault(token_text(tokenizer, token_id), value)
    return top
