"""POST /v1/completions: prompts (text or token ids, one or many) in, text out, as JSON or SSE.

Choice `i * n + j` is sample j of prompt i. Every prompt is submitted at once; a stream sends
one prompt's choices after the other's, while the engine runs them together.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from rill.errors import ValidationError
from rill.openai import sse
from rill.openai.constraints import output_constraint
from rill.openai.errors import ApiError, bad_request
from rill.openai.logprobs import completion_logprobs, echo_logprobs
from rill.openai.params import completion_sampling_params, echo_only
from rill.openai.requests import CompletionRequest
from rill.openai.chat_bodies import Completion, CompletionChoice, CompletionLogprobs, usage
from rill.openai.serving import RequestTrace, Serving, api_error, decode_body, finish_reason, sampling_error
from rill.outputs import RequestDelta
from rill.sampling_params import SamplingParams

Deltas = AsyncIterator[tuple[int, RequestDelta]]  # (prompt index, delta), as Serving.run yields them


@dataclass
class CompletionJob:
    request: CompletionRequest
    trace: RequestTrace
    model: str
    prompts: list[list[int]]
    prompt_texts: list[str]  # echoed when echo is set
    params: SamplingParams
    created: int

    @property
    def include_usage(self) -> bool:
        return self.request.stream_options is not None and self.request.stream_options.include_usage


def prepare_completion(serving: Serving, trace: RequestTrace, body: bytes) -> CompletionJob:
    req = decode_body(body, CompletionRequest)
    model, params = check_completion(serving, req)
    serving.check_fan_out(num_prompts(req.prompt), params.n)  # before a prompt is tokenized
    prompts = prompt_token_ids(serving, req.prompt)
    trace.num_prompt_tokens = sum(map(len, prompts))
    for prompt in prompts:
        serving.check_fits(len(prompt), params.max_tokens, "prompt")
    serving.check_ready()
    texts = [_prompt_text(serving, req.prompt, i, ids) for i, ids in enumerate(prompts)] if req.echo else []
    return CompletionJob(req, trace, model, prompts, texts, params, int(time.time()))


def check_completion(serving: Serving, req: CompletionRequest) -> tuple[str, SamplingParams]:
    """The model name and sampling params of a request whose prompt arrives whole or streamed in."""
    model = serving.check_model(req.model)
    _check_supported(req)
    try:
        params = completion_sampling_params(req, serving.generation_config)
        serving.check_params(params)
    except ValidationError as exc:
        raise sampling_error(exc, {}) from exc
    params.grammar = serving.compile_grammar(output_constraint(req))
    return model, params


def _check_supported(req: CompletionRequest) -> None:
    if req.suffix is not None:
        raise bad_request("suffix is not supported", "suffix", "unsupported")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens 0 asks for no output; it needs echo set to true", "max_tokens")


def num_prompts(prompt) -> int:
    """How many prompts a prompt field holds (one string or token list, or a list of them)."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return 1
    return len(prompt)


def prompt_token_ids(serving: Serving, prompt) -> list[list[int]]:
    """str | list[str] | list[int] | list[list[int]] -> one id list per prompt."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if len({type(item) for item in prompt}) > 1:
        raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of "
                          "lists of token ids, not a mix", "prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    out = []
    for item in prompt:
        if isinstance(item, str):
            serving.check_prompt_text(item, "prompt")
        ids = serving.tokenizer.encode(item) if isinstance(item, str) else list(item)
        bad = [t for t in ids if not 0 <= t < serving.vocab_size]
        if bad:
            raise bad_request(f"prompt has token ids {bad[:8]} outside the vocabulary of {serving.vocab_size}",
                              "prompt")
        out.append(ids)
    return out


def _prompt_text(serving: Serving, prompt, i: int, ids: list[int]) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and isinstance(prompt[i], str):
        return prompt[i]
    return serving.tokenizer.decode(ids, skip_special_tokens=False)


class ChoiceText:
    """One choice's text so far: echo first, logprob columns with their offsets.

    With echo and logprobs, the prompt's columns (its prompt logprobs) come first. With echo and
    max_tokens 0 the engine still samples one token (SamplingParams needs one), which is left out.
    """

    def __init__(self, serving: Serving, job: CompletionJob, index: int, prompt_index: int):
        self.serving, self.job, self.index = serving, job, index
        self.pending = job.prompt_texts[prompt_index] if job.prompt_texts else ""
        self.prompt_ids = job.prompts[prompt_index]
        self.echo_only = echo_only(job.request)
        self.num_chars = 0
        self.num_output_tokens = 0

    def on_delta(self, delta: RequestDelta) -> CompletionChoice:
        text, self.pending = self.pending + ("" if self.echo_only else delta.text), ""
        logprobs = None
        if delta.logprobs is not None:
            logprobs = self._logprobs(delta)
            self.num_chars += sum(map(len, logprobs.tokens))
        self.num_output_tokens = 0 if self.echo_only else delta.num_output_tokens
        reason = finish_reason(delta)
        if self.echo_only:
            return CompletionChoice(self.index, text, logprobs, reason and "length")  # nothing generated
        return CompletionChoice(self.index, text, logprobs, reason, delta.stop_reason if reason else None)

    def _logprobs(self, delta: RequestDelta) -> CompletionLogprobs:
        tokenizer, num_top = self.serving.tokenizer, self.job.request.logprobs or 0
        out = CompletionLogprobs()
        if delta.prompt_logprobs is not None:
            out = echo_logprobs(tokenizer, self.prompt_ids, delta.prompt_logprobs, num_top)
        if not self.echo_only:
            offset = self.num_chars + sum(map(len, out.tokens))
            _extend(out, completion_logprobs(tokenizer, delta.logprobs, num_top, offset))
        return out


def _choices(serving: Serving, job: CompletionJob) -> dict[tuple[int, int], ChoiceText]:
    n = job.params.n
    return {(p, j): ChoiceText(serving, job, p * n + j, p) for p in range(len(job.prompts)) for j in range(n)}


async def stream_completion(serving: Serving, job: CompletionJob, deltas: Deltas | None = None,
                            ) -> AsyncIterator[bytes]:
    """`deltas` replaces running job.prompts (streamed input brings its own: rill.openai.streaming)."""
    choices = _choices(serving, job)
    status = 499
    try:
        async with aclosing(deltas or serving.run(job.trace, job.prompts, job.params)) as deltas:
            async for p, delta in deltas:
                if delta.error is not None:
                    raise ApiError(500, delta.error, code="engine_error")
                out = choices[p, delta.index].on_delta(delta)
                if out.text or out.logprobs or out.finish_reason:
                    yield sse.data_frame(Completion(job.trace.request_id, job.created, job.model, [out]))
        if job.include_usage:
            total = usage(sum(map(len, job.prompts)), sum(c.num_output_tokens for c in choices.values()))
            yield sse.data_frame(Completion(job.trace.request_id, job.created, job.model, [], usage=total))
        yield sse.DONE
        status = 200
    except Exception as exc:  # noqa: BLE001 - the status is sent: the error goes in the stream
        error = api_error(exc)
        status = error.status
        yield sse.error_frame(error)
    finally:
        serving.finish(job.trace, status)


async def complete(serving: Serving, job: CompletionJob, deltas: Deltas | None = None) -> Completion:
    choices = _choices(serving, job)
    results = {key: CompletionChoice(c.index, "", CompletionLogprobs() if job.params.logprobs is not None else None)
               for key, c in choices.items()}
    cached: dict[int, int] = {}  # prompt index -> its tokens found in the prefix cache
    async with aclosing(deltas or serving.run(job.trace, job.prompts, job.params)) as deltas:
        async for p, delta in deltas:
            if delta.error is not None:
                raise ApiError(500, delta.error, code="engine_error")
            _merge(results[p, delta.index], choices[p, delta.index].on_delta(delta))
            cached[p] = max(cached.get(p, 0), delta.num_cached_tokens)
    num_output = sum(c.num_output_tokens for c in choices.values())
    total = usage(sum(map(len, job.prompts)), num_output, sum(cached.values()))
    ordered = sorted(results.values(), key=lambda c: c.index)
    return Completion(job.trace.request_id, job.created, job.model, ordered, usage=total)


def _merge(into: CompletionChoice, part: CompletionChoice) -> None:
    into.text += part.text
    into.finish_reason, into.stop_reason = part.finish_reason, part.stop_reason
    if part.logprobs is not None:
        _extend(into.logprobs, part.logprobs)


def _extend(into: CompletionLogprobs, more: CompletionLogprobs) -> None:
    for name in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
        getattr(into, name).extend(getattr(more, name))
