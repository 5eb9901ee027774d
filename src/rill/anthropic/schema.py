"""Request bodies of POST /v1/messages and /v1/messages/count_tokens, as msgspec structs.

Unknown fields are ignored (the SDK sends newer ones: service_tier, container, ...); a field of the
wrong type fails decoding and names its path. Block types are checked in translate.py, which
knows which it supports.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class Source(msgspec.Struct, kw_only=True):
    """An image block's source: base64 data with its media type, or a URL."""

    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class Block(msgspec.Struct, kw_only=True):
    """One content block; the fields a type does not use stay None."""

    type: str
    text: str | None = None  # text
    source: Source | None = None  # image
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # thinking
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    cache_control: dict[str, Any] | None = None  # accepted: rill's prefix cache needs no marks


class MessageParam(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolParam(msgspec.Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None  # None or "custom": a client tool; Anthropic's server tools have their own types
    cache_control: dict[str, Any] | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


class OutputFormat(msgspec.Struct, kw_only=True):
    """Structured outputs: the answer's text is JSON matching `schema` (rill.structured enforces it)."""

    type: Literal["json_schema"]
    schema: dict[str, Any] | bool


class OutputConfig(msgspec.Struct, kw_only=True):
    format: OutputFormat | None = None
    effort: str | None = None  # accepted; rill's models have no effort setting


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[MessageParam]
    system: str | list[Block] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
