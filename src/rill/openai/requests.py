"""Request bodies of POST /v1/chat/completions and /v1/completions, as msgspec structs.

Unknown fields are ignored (clients send vendor extensions); a field of the wrong type or
value fails decoding, and `errors.from_decode_error` names it. Defaults of None mean "not
given": the model's generation_config.json, then vLLM's defaults, fill those in.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class MediaURL(msgspec.Struct):
    """An image_url / video_url part's source: a data: URL, or http(s)/file where the server allows them."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted; Qwen2-VL's resolution is its processor's


class ContentPart(msgspec.Struct):
    """One part of a message's content: text, or (for a vision model) image_url, or vLLM's video_url.
    A text-only model refuses the other types."""

    type: str
    text: str | None = None
    image_url: MediaURL | None = None
    video_url: MediaURL | None = None


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(msgspec.Struct):
    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class Message(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct):
    function: FunctionDef
    type: Literal["function"] = "function"


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str | None = None  # OpenAI requires it; rill needs only the schema
    description: str | None = None
    schema: dict[str, Any] | bool | None = None  # None: any JSON value
    strict: bool | None = None  # rill enforces the schema either way


class ResponseFormat(msgspec.Struct):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(msgspec.Struct, kw_only=True):
    """vLLM's `structured_outputs` (sent through the openai SDK's extra_body): exactly one constraint."""

    json: dict[str, Any] | bool | str | None = None  # a JSON Schema, or its JSON text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark (llguidance's dialect) or GBNF
    json_object: bool | None = None


class SamplingFields(msgspec.Struct, kw_only=True):
    """The sampling knobs both endpoints share (OpenAI's, plus vLLM's extensions)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int | None = None  # None (also an explicit null, as the openai SDK sends for n=None): 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # OpenAI's spec allows null for these (the openai SDK sends it for a None argument): null is the default.
    echo: bool | None = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class CompletionRequest(SamplingFields, kw_only=True):
    # One text, texts, token ids, or lists of token ids (checked in completions._prompt_ids):
    # msgspec allows one array type per union, so the list's items carry the alternatives.
    prompt: str | list[str | int | list[int]]
    logprobs: int | None = None
    suffix: str | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """POST /tokenize: text (`prompt`) or a chat (`messages`), vLLM's shape."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]
    model: str | None = None
