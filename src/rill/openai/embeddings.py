"""POST /v1/embeddings: inputs in, one pooled and normalized vector each out (OpenAI's shape).

Every input is one engine request that runs prefill only (SamplingParams.pooling,
rill.engine.pooling), all submitted at once so that the scheduler batches them as it batches
prompts. Texts are tokenized with the tokenizer's own special tokens: Qwen3-Embedding's appends
`<|endoftext|>`, whose final state is the embedding, and usage counts it. Token-id inputs are
taken as they are. `dimensions` keeps the first N values (Matryoshka) before normalizing.
"""

from __future__ import annotations

import base64
import time
from contextlib import aclosing
from typing import Literal

import msgspec
import numpy as np

from rill.errors import ValidationError
from rill.openai.embedding_model import EmbeddingModel, embedding_model
from rill.openai.errors import ApiError, bad_request
from rill.openai.serving import RequestTrace, Serving, decode_body
from rill.sampling_params import SamplingParams

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    # one text, texts, token ids, or lists of token ids (msgspec allows one array type per union)
    input: str | list[str | int | list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = None  # None: float
    dimensions: int | None = None
    user: str | None = None


class EmbeddingData(msgspec.Struct):
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32, as OpenAI sends it
    object: str = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct):
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


class EmbeddingJob(msgspec.Struct):
    request: EmbeddingRequest
    trace: RequestTrace
    model: str
    prompts: list[list[int]]
    info: EmbeddingModel
    created: int


def prepare_embeddings(serving: Serving, trace: RequestTrace, body: bytes) -> EmbeddingJob:
    req = decode_body(body, EmbeddingRequest)
    model = serving.check_model(req.model)
    info = embedding_model(serving)
    _check_dimensions(req.dimensions, info)
    prompts = input_token_ids(serving, req.input)
    trace.num_prompt_tokens = sum(map(len, prompts))
    one = isinstance(req.input, str) or isinstance(req.input[0], int)
    for i, prompt in enumerate(prompts):
        try:
            serving.engine.core.check_fits_pooling(len(prompt))
        except ValidationError as exc:
            raise bad_request(exc.message, "input" if one else f"input[{i}]", exc.code) from exc
    serving.check_ready()
    return EmbeddingJob(req, trace, model, prompts, info, int(time.time()))


def input_token_ids(serving: Serving, value) -> list[list[int]]:
    """str | list[str] | list[int] | list[list[int]] -> one id list per input."""
    items = [value] if isinstance(value, str) else value
    if not items:
        raise bad_request("input must not be empty", "input")
    if len({type(item) for item in items}) > 1:
        raise bad_request("input must be a string, a list of strings, a list of token ids or a list of "
                          "lists of token ids, not a mix", "input")
    if isinstance(items[0], int):
        items = [items]
    if len(items) > MAX_INPUTS:
        raise bad_request(f"input has {len(items)} items; at most {MAX_INPUTS} are allowed per request", "input")
    serving.check_fan_out(len(items), 1)  # one engine request per input; before anything is tokenized
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            _check_text_length(serving, item, "input" if len(items) == 1 else f"input[{i}]")
        ids = serving.tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else item
        bad = [t for t in ids if not 0 <= t < serving.vocab_size]
        if bad:
            raise bad_request(f"input[{i}] has token ids {bad[:8]} outside the vocabulary of {serving.vocab_size}",
                              f"input[{i}]")
        if not ids:
            raise bad_request(f"input[{i}] is empty", f"input[{i}]")
        prompts.append(ids)
    return prompts


def _check_text_length(serving: Serving, text: str, param: str) -> None:
    """400 before tokenizing a text sure to be longer than the context (rill.tokenizer.length_bound).
    An input may fill the context exactly, so only a bound past it refuses."""
    bound = getattr(serving.tokenizer, "token_count_bound", None)
    num_tokens = 0 if bound is None else bound.at_least(text)
    if num_tokens > serving.max_model_len:
        raise bad_request(f"this model's maximum context length is {serving.max_model_len} tokens; the input has "
                          f"{len(text)} characters, so at least {num_tokens} tokens", param, "context_length_exceeded")


def _check_dimensions(dimensions: int | None, info: EmbeddingModel) -> None:
    if dimensions is None:
        return
    if not info.matryoshka:
        raise bad_request("this model does not support dimensions (its vectors cannot be truncated: "
                          "it was not trained with Matryoshka representation learning)", "dimensions", "unsupported")
    allowed = info.matryoshka_dimensions
    if allowed is not None and dimensions not in allowed:
        raise bad_request(f"dimensions is {dimensions}; this model allows {list(allowed)}", "dimensions")
    if not 1 <= dimensions <= info.hidden_size:
        raise bad_request(f"dimensions is {dimensions}; it must be between 1 and {info.hidden_size}", "dimensions")


async def embed(serving: Serving, job: EmbeddingJob) -> EmbeddingList:
    """Run every input as a pooling request; the vectors in input order."""
    params = SamplingParams(max_tokens=1, pooling=job.info.pooling)
    vectors: list[list[float] | None] = [None] * len(job.prompts)
    async with aclosing(serving.run(job.trace, job.prompts, params)) as deltas:
        async for i, delta in deltas:
            if delta.error is not None:
                raise ApiError(500, delta.error, code="engine_error")
            if delta.embedding is not None:
                vectors[i] = delta.embedding
    fmt = job.request.encoding_format or "float"
    data = [EmbeddingData(i, _encode(_finish(v, job.request.dimensions), fmt)) for i, v in enumerate(vectors)]
    num_tokens = sum(map(len, job.prompts))
    return EmbeddingList(data, job.model, EmbeddingUsage(num_tokens, num_tokens))


def _finish(vector: list[float], dimensions: int | None) -> np.ndarray:
    """Truncated to `dimensions` (Matryoshka), then scaled to unit length."""
    out = np.asarray(vector[:dimensions] if dimensions else vector, dtype=np.float32)
    norm = float(np.linalg.norm(out))
    return out / norm if norm > 0 else out


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
