"""Response bodies and SSE chunks of the Chat Completions, Completions, models and tokenize
endpoints, as msgspec structs (the Responses API, /v1/responses, lives in `responses_api/`).

Chunk deltas omit unset fields, so a role frame is exactly `{"role": "assistant"}` and a
terminal frame's delta is `{}`.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


# -- logprobs -------------------------------------------------------------------------------------


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[ChatLogprob]
    refusal: list[ChatLogprob] | None = None  # the spec requires the key; rill's models never refuse


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    text_offset: list[int] = []
    top_logprobs: list[dict[str, float] | None] = []


# -- chat -----------------------------------------------------------------------------------------


class FunctionCallOut(msgspec.Struct):
    name: str
    arguments: str


class ToolCallOut(msgspec.Struct):
    id: str
    function: FunctionCallOut
    type: str = "function"


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    # Written even as null: OpenAI's spec requires the key (clients generated from it reject a
    # message without it), and omit_defaults never omits a field whose default comes from a factory
    # other than list/dict/set.
    refusal: str | None = msgspec.field(default_factory=lambda: None)
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] = []


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None
    stop_reason: str | int | None = None


# `object` is the struct's tag, so it is always written (omit_defaults would drop a default).
class ChatCompletion(msgspec.Struct, tag_field="object", tag="chat.completion"):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallDelta | None = None


class ChatDelta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, omit_defaults=True, tag_field="object", tag="chat.completion.chunk"):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# -- completions --------------------------------------------------------------------------------------


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class Completion(msgspec.Struct, omit_defaults=True, tag_field="object", tag="text_completion"):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# -- models, tokenize ------------------------------------------------------------------------------------


class ModelCard(msgspec.Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "rill"
    root: str | None = None
    task: str = "generate"  # vLLM's name for what a model does: "generate", or "transcription" for speech
    # rill's: what the model reads ("text", "image", "video"; "audio" for speech), so that a client (the web
    # page's camera button) can tell per card; the words of OpenRouter's architecture.input_modalities
    input_modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


class TokenizeResponse(msgspec.Struct):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(msgspec.Struct):
    prompt: str


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int = 0) -> Usage:
    details = PromptTokensDetails(num_cached_tokens) if num_cached_tokens else None
    return Usage(num_prompt_tokens, num_completion_tokens, num_prompt_tokens + num_completion_tokens, details)


def encode(value: Any) -> bytes:
    return msgspec.json.encode(value)
