"""What the engine hands back: per-step deltas (cross the thread boundary) and offline results."""

from __future__ import annotations

import msgspec


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    logprob: float
    rank: int | None
    top: list[tuple[int, float]] | None  # (token_id, logprob), most likely first


class RequestDelta(msgspec.Struct, frozen=True):
    """One engine step's news for one sequence of a request."""

    request_id: str
    index: int  # which of the request's n samples
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # stop | length | abort | error
    turn_finish_reason: str | None = None  # respond_per_chunk: this chunk's answer ended, session lives
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    # SamplingParams.prompt_logprobs: one entry per prompt token (the first is None: nothing comes
    # before it), on the delta that carries the first sampled token.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # SamplingParams.pooling: the prompt's pooled hidden state (not normalized), on the one delta
    # that ends a pooling request (it samples no token).
    embedding: list[float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def coalesce(deltas: list[RequestDelta]) -> list[RequestDelta]:
    """Merge each sequence's consecutive deltas into one, keeping every sequence's order.

    Used when several engine steps reach trio in one delivery (trio fell behind): a reader gets
    one delta with all the tokens it has not seen, as vLLM's output collector does, instead of
    one wake-up per step. A delta that ends the request or its turn, or carries an error, is
    the last of its group, so turn and request boundaries stay where they were.
    """
    out: list[RequestDelta] = []
    open_at: dict[tuple[str, int], int] = {}  # sequence -> index in out of its mergeable delta
    for delta in deltas:
        key = (delta.request_id, delta.index)
        at = open_at.get(key)
        if at is None:
            out.append(delta)
            at = len(out) - 1
        else:
            out[at] = delta = merge_deltas(out[at], delta)
        if delta.finish_reason is None and delta.turn_finish_reason is None and delta.error is None:
            open_at[key] = at
        else:
            open_at.pop(key, None)
    return out


def merge_deltas(first: RequestDelta, then: RequestDelta) -> RequestDelta:
    """One sequence's two consecutive deltas as one: `then`'s fields, both deltas' tokens, text and logprobs."""
    logprobs = None
    if first.logprobs is not None or then.logprobs is not None:
        logprobs = [*(first.logprobs or ()), *(then.logprobs or ())]
    return msgspec.structs.replace(
        then, token_ids=first.token_ids + then.token_ids, text=first.text + then.text, logprobs=logprobs,
        prompt_logprobs=first.prompt_logprobs or then.prompt_logprobs,
    )


class CompletionOutput(msgspec.Struct):
    index: int
    text: str = ""
    token_ids: list[int] = msgspec.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None

    def add(self, delta: RequestDelta) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason


class RequestOutput(msgspec.Struct):
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)
