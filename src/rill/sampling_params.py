"""How one request wants its tokens chosen: the OpenAI / vLLM sampling knobs, validated.

Defaults follow vLLM's SamplingParams so clients written for vLLM behave the same.
The server builds one of these per request, so validation is a handful of
comparisons in `__post_init__` (which msgspec also runs after decoding).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from rill.errors import ValidationError

# Temperatures below this are treated as 0 (greedy): dividing logits by a tiny
# temperature overflows float32 long before it changes the argmax.
GREEDY_TEMPERATURE = 1e-5
# OpenAI's cap on top_logprobs; vLLM uses the same default limit.
MAX_LOGPROBS = 20
# OpenAI's documented ranges.
MAX_ABS_PENALTY = 2.0
MAX_ABS_LOGIT_BIAS = 100.0

# generation_config.json keys taken as defaults, mapped to our field names. vLLM's
# `--generation-config auto` takes the same set.
_GENERATION_CONFIG_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


class SamplingParams(msgspec.Struct, kw_only=True):
    """Sampling parameters for one request. Invalid values raise ValidationError naming the field."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # None or 0: off (0 is stored as None)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: str | list[str] = []  # a single string is stored as a one-item list
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    min_tokens: int = 0
    max_tokens: int | None = 16  # None: until the model's length limit
    logprobs: int | None = None  # k >= 0: the sampled token's logprob plus the top k
    # k >= 0: each prompt token's logprob given the tokens before it, plus the top k (vLLM's field;
    # /v1/completions' echo with logprobs). A request that asks for them takes no prefix-cache hit.
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Text the output must begin with: the sampler lets through only tokens that agree with it until it
    # is spelled out, in whatever tokens the model picks (a forced tool-call start: rill.openai.forced_prefix).
    # Not a request field; it needs a plain ByteLevel tokenizer (Sampler ignores it otherwise).
    output_prefix: str | None = None
    # A compiled rill.structured.Grammar the output must match (response_format, structured_outputs, a
    # forced or strict tool call). Not a request field: the server compiles it before submitting.
    grammar: Any = None
    # "last" or "mean": run the prompt as prefill only and hand back its pooled hidden state
    # (RequestDelta.embedding) instead of sampling (rill.engine.pooling). Not a request field.
    pooling: str | None = None

    def __post_init__(self) -> None:
        _check_int("n", self.n, lo=1)
        _check_float("temperature", self.temperature, lo=0.0)
        _check_float("top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True)
        if self.top_k is not None:
            _check_int("top_k", self.top_k, lo=0)
            self.top_k = self.top_k or None
        _check_float("min_p", self.min_p, lo=0.0, hi=1.0)
        for name in ("presence_penalty", "frequency_penalty"):
            _check_float(name, getattr(self, name), lo=-MAX_ABS_PENALTY, hi=MAX_ABS_PENALTY)
        _check_float("repetition_penalty", self.repetition_penalty, lo=0.0, lo_open=True)
        if self.logit_bias is not None:
            self.logit_bias = _checked_logit_bias(self.logit_bias)
        if self.seed is not None:
            _check_int("seed", self.seed)
        self.stop = _checked_stop(self.stop)
        if not isinstance(self.stop_token_ids, list):
            raise ValidationError("stop_token_ids must be a list of token ids", param="stop_token_ids")
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, lo=0)
        _check_int("min_tokens", self.min_tokens, lo=0)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, lo=1)
            if self.min_tokens > self.max_tokens:
                raise ValidationError(
                    f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})",
                    param="min_tokens",
                )
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), lo=0, hi=MAX_LOGPROBS)

    @property
    def greedy(self) -> bool:
        """True when the request takes the most likely token (temperature 0)."""
        return self.temperature < GREEDY_TEMPERATURE

    def check_vocab(self, vocab_size: int) -> None:
        """Raise if logit_bias or stop_token_ids name a token the model does not have.

        Separate from __post_init__ because only the engine knows the vocabulary size.
        """
        named_ids = (("logit_bias", self.logit_bias or ()), ("stop_token_ids", self.stop_token_ids))
        for name, token_ids in named_ids:
            bad = [t for t in token_ids if t >= vocab_size]
            if bad:
                message = f"{name} names token ids {bad} outside the vocabulary of {vocab_size}"
                raise ValidationError(message, param=name)

    @classmethod
    def from_generation_config(cls, gen_cfg: dict[str, Any], **overrides: Any) -> SamplingParams:
        """Defaults from a model's generation_config.json, then the caller's explicit values.

        Only the keys in `_GENERATION_CONFIG_FIELDS` are read; null entries are skipped.
        `do_sample` is ignored, as vLLM does: a request asks for greedy with temperature=0.
        Every override is taken as given, None included (max_tokens=None means "no cap").
        """
        kwargs = {
            field: gen_cfg[key]
            for key, field in _GENERATION_CONFIG_FIELDS.items()
            if gen_cfg.get(key) is not None
        }
        kwargs.update(overrides)
        return cls(**kwargs)


def _is_number(value: object) -> bool:
    # bool is an int subclass, but True as a temperature is a client bug, not a 1.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_float(
    name: str,
    value: object,
    lo: float,
    hi: float | None = None,
    lo_open: bool = False,
) -> None:
    """Raise unless value is a finite number in [lo, hi] ((lo, hi] when lo_open)."""
    if not _is_number(value) or not math.isfinite(value):
        raise ValidationError(f"{name} must be a finite number, got {value!r}", param=name)
    too_low = value <= lo if lo_open else value < lo
    if too_low or (hi is not None and value > hi):
        bracket = "(" if lo_open else "["
        upper = "inf)" if hi is None else f"{hi}]"
        raise ValidationError(f"{name} must be in {bracket}{lo}, {upper}, got {value!r}", param=name)


def _check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> None:
    """Raise unless value is an int (not a bool) in [lo, hi]."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{name} must be an integer, got {value!r}", param=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lower = "-inf" if lo is None else lo
        upper = "inf" if hi is None else hi
        raise ValidationError(f"{name} must be in [{lower}, {upper}], got {value!r}", param=name)


def _checked_logit_bias(logit_bias: dict[Any, Any]) -> dict[int, float] | None:
    """Token ids as ints (OpenAI's JSON sends them as strings), biases in [-100, 100]."""
    if not isinstance(logit_bias, dict):
        raise ValidationError("logit_bias must be a mapping of token id to bias", param="logit_bias")
    checked = {}
    for key, bias in logit_bias.items():
        token_id = int(key) if isinstance(key, str) and key.isdigit() else key
        _check_int("logit_bias", token_id, lo=0)
        _check_float("logit_bias", bias, lo=-MAX_ABS_LOGIT_BIAS, hi=MAX_ABS_LOGIT_BIAS)
        checked[token_id] = bias
    return checked or None


def _checked_stop(stop: object) -> list[str]:
    """A list of non-empty strings; an empty stop string would end every request at once."""
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise ValidationError("stop must be a non-empty string or a list of them", param="stop")
    return list(stops)
