"""Request body of POST /v1/responses, as msgspec structs.

Input items and tools decode loosely (every field optional, `type` a plain string) so that
`translate` can refuse an unknown item or tool type with a 400 that names the item
(`input[2].type`), instead of msgspec's one message for a failed tagged union. Unknown fields are
ignored, as on the chat endpoints.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message item's content: input_text (user, system, developer) or output_text
    (assistant turns sent back); rill's models read text only."""

    type: str
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """A message (`type` "message" or left out), function_call, function_call_output or reasoning item."""

    type: str | None = None
    id: str | None = None
    role: str | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    summary: list[ContentPart] | None = None
    status: str | None = None


class ToolDef(msgspec.Struct, kw_only=True):
    """A tool in the Responses' flat form: `{"type": "function", "name", "parameters", "strict"}`."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


# The structs the response object echoes omit what the client left out.


class NamedTool(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: str
    name: str | None = None


class TextFormat(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Accepted and echoed: whether a model thinks is the model's (and --reasoning-parser's) business."""

    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    truncation: str | None = None
    include: list[str] | None = None

    @property
    def stores(self) -> bool:
        """`store` defaults to true, as on OpenAI."""
        return self.store is None or self.store
