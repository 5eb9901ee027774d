"""Request fields -> SamplingParams. Fields the client left out take the model's
generation_config.json values, then SamplingParams' (vLLM's) defaults."""

from __future__ import annotations

from typing import Any

from rill.openai.errors import bad_request
from rill.openai.requests import ChatCompletionRequest, CompletionRequest, SamplingFields
from rill.sampling_params import SamplingParams

# Passed through when the request sets them; None means "not given".
_OPTIONAL = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
             "logit_bias", "seed")
# Always passed (their request defaults are SamplingParams' own).
_ALWAYS = ("ignore_eos", "min_tokens", "skip_special_tokens", "include_stop_str_in_output")
# OpenAI's default for /v1/completions; chat defaults to the room left in the context.
COMPLETION_MAX_TOKENS = 16


def _common(req: SamplingFields) -> dict[str, Any]:
    fields = {name: getattr(req, name) for name in _OPTIONAL if getattr(req, name) is not None}
    fields.update({name: getattr(req, name) for name in _ALWAYS})
    fields["n"] = 1 if req.n is None else req.n
    if req.top_k is not None:
        fields["top_k"] = None if req.top_k == -1 else req.top_k  # vLLM clients send -1 for "off"
    if req.stop is not None:
        fields["stop"] = req.stop
    if req.stop_token_ids is not None:
        fields["stop_token_ids"] = req.stop_token_ids
    return fields


def _with_max_tokens(fields: dict[str, Any], max_tokens: int | None, gen_cfg: dict, default: int | None):
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    elif gen_cfg.get("max_new_tokens") is None:
        fields["max_tokens"] = default
    return fields


def chat_sampling_params(req: ChatCompletionRequest, gen_cfg: dict) -> SamplingParams:
    fields = _common(req)
    if req.logprobs:
        fields["logprobs"] = req.top_logprobs or 0
    elif req.top_logprobs is not None:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return SamplingParams.from_generation_config(gen_cfg, **_with_max_tokens(fields, max_tokens, gen_cfg, None))


def completion_sampling_params(req: CompletionRequest, gen_cfg: dict) -> SamplingParams:
    fields = _common(req)
    if req.logprobs is not None:
        fields["logprobs"] = req.logprobs
        if req.echo:  # the echoed prompt's tokens come with their logprobs too
            fields["prompt_logprobs"] = req.logprobs
    max_tokens = req.max_tokens
    if echo_only(req):
        max_tokens = 1  # the engine samples one token, which the answer leaves out (as vLLM does)
    fields = _with_max_tokens(fields, max_tokens, gen_cfg, COMPLETION_MAX_TOKENS)
    return SamplingParams.from_generation_config(gen_cfg, **fields)


def echo_only(req: CompletionRequest) -> bool:
    """max_tokens 0 with echo: the answer is the prompt (with its logprobs), nothing generated."""
    return bool(req.echo) and req.max_tokens == 0
