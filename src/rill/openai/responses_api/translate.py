"""A Responses request -> the chat path's request: one engine path, one sampler, one tool parser.

Input items become chat messages (message items by role, function_call items an assistant message's
tool_calls, function_call_output items tool messages), `instructions` a leading system message, the
flat function tools chat's nested ones, `text.format` chat's `response_format` (so json_schema and
json_object go through rill.structured as on chat). The chat path's validation then runs unchanged;
`renamed` maps the field it names back to the Responses field the client set.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from rill.openai.errors import ApiError, bad_request
from rill.openai.requests import (
    ChatCompletionRequest, FunctionCall, FunctionDef, JsonSchemaFormat, Message, NamedFunction, NamedToolChoice,
    ResponseFormat, Tool, ToolCall,
)
from rill.openai.responses_api.events import new_id
from rill.openai.responses_api.schema import ContentPart, InputItem, ResponsesRequest

MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")

# Chat field (as the chat path's errors name it) -> the Responses field it came from.
_RENAMES = [
    (re.compile(r"^(max_completion_tokens|max_tokens)$"), "max_output_tokens"),
    (re.compile(r"^messages"), "input"),
    (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
]


def renamed(error: ApiError) -> ApiError:
    """The chat path's error with its param named as the Responses request names it."""
    for pattern, replacement in _RENAMES:
        if error.param and pattern.search(error.param):
            error.param = pattern.sub(replacement, error.param)
            break
    return error


# -- request -> chat request -------------------------------------------------------------------------------


def chat_request(req: ResponsesRequest, earlier: list[dict[str, Any]], items: list[InputItem],
                 ) -> ChatCompletionRequest:
    """The chat request that answers `items` (request_items) after the `earlier` conversation (stored items)."""
    messages = [Message("system", req.instructions)] if req.instructions else []
    messages += item_messages(_decode_items(earlier), "previous_response_id")
    messages += item_messages(items, "input")
    tools, choice = chat_tools(req)
    return ChatCompletionRequest(
        messages=messages, model=req.model, max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p, tools=tools, tool_choice=choice,
        parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        response_format=response_format(req), user=req.user,
    )


def request_items(req: ResponsesRequest) -> list[InputItem]:
    """`input` as items (a string is one user message); a request must bring something to answer."""
    if isinstance(req.input, str):
        return [InputItem(type="message", role="user", content=req.input)]
    if not req.input and req.previous_response_id is None:
        raise bad_request("input is required: a string or a non-empty list of items", "input",
                          "missing_required_parameter")
    return list(req.input or ())


def _decode_items(items: list[dict[str, Any]]) -> list[InputItem]:
    return msgspec.convert(items, list[InputItem])


def item_messages(items: list[InputItem], param: str) -> list[Message]:
    """Chat messages for items, in order; consecutive calls join one assistant message's tool_calls."""
    messages: list[Message] = []
    reasoning: str | None = None  # a reasoning item's text, carried to the assistant turn after it
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        kind = item.type or "message"
        if kind == "reasoning":
            reasoning = _parts_text(item.content or item.summary or [], where + ".content") or None
        elif kind == "message":
            messages.append(_message(item, where, reasoning if item.role == "assistant" else None))
            reasoning = None
        elif kind == "function_call":
            _add_call(messages, item, where, reasoning)
            reasoning = None
        elif kind == "function_call_output":
            messages.append(_call_output(item, where))
        else:
            raise bad_request(f"input item type {kind!r} is not supported; rill takes {', '.join(ITEM_TYPES)}",
                              where + ".type", "unsupported")
    return messages


def _message(item: InputItem, where: str, reasoning: str | None) -> Message:
    if item.role not in MESSAGE_ROLES:
        raise bad_request(f"a message's role must be one of {', '.join(MESSAGE_ROLES)}; got {item.role!r}",
                          where + ".role")
    if item.content is None:
        raise bad_request("a message item needs its content", where + ".content", "missing_required_parameter")
    return Message(item.role, _text(item.content, where + ".content"), reasoning_content=reasoning)


def _add_call(messages: list[Message], item: InputItem, where: str, reasoning: str | None) -> None:
    for name in ("call_id", "name", "arguments"):
        if getattr(item, name) is None:
            raise bad_request(f"a function_call item needs its {name}", f"{where}.{name}",
                              "missing_required_parameter")
    call = ToolCall(FunctionCall(item.name, item.arguments), id=item.call_id)
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant" and reasoning is None:
        last.tool_calls = (last.tool_calls or []) + [call]
    else:
        messages.append(Message("assistant", None, tool_calls=[call], reasoning_content=reasoning))


def _call_output(item: InputItem, where: str) -> Message:
    if item.call_id is None:
        raise bad_request("a function_call_output item needs its call_id", where + ".call_id",
                          "missing_required_parameter")
    if item.output is None:
        raise bad_request("a function_call_output item needs its output", where + ".output",
                          "missing_required_parameter")
    return Message("tool", _text(item.output, where + ".output"), tool_call_id=item.call_id)


def _text(content: str | list[ContentPart], where: str) -> str:
    return content if isinstance(content, str) else _parts_text(content, where)


def _parts_text(parts: list[ContentPart], where: str) -> str:
    """Text parts joined by newlines (as chat joins content parts); rill's models read text only."""
    for j, part in enumerate(parts):
        if part.type not in TEXT_PARTS or part.text is None:
            raise bad_request(f"content part type {part.type!r} is not supported: this model reads text only",
                              f"{where}[{j}].type", "unsupported")
    return "\n".join(part.text for part in parts)


# -- tools and formats ---------------------------------------------------------------------------------------


def chat_tools(req: ResponsesRequest) -> tuple[list[Tool] | None, Any]:
    """Flat function tools -> chat's nested ones; tool_choice likewise. `strict` defaults to true, as
    OpenAI's Responses API does (chat's default is false)."""
    tools = None if req.tools is None else [_tool(t, i) for i, t in enumerate(req.tools)]
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return tools, choice
    if choice.type != "function" or not choice.name:
        raise bad_request(f"tool_choice type {choice.type!r} is not supported; name a function tool "
                          "({'type': 'function', 'name': ...}) or use none, auto or required", "tool_choice",
                          "unsupported")
    return tools, NamedToolChoice(NamedFunction(choice.name))


def _tool(tool, i: int) -> Tool:
    if tool.type != "function":
        raise bad_request(f"tool type {tool.type!r} is not supported: rill runs function tools, which the "
                          "client executes", f"tools[{i}].type", "unsupported")
    if not tool.name:
        raise bad_request("a function tool needs its name", f"tools[{i}].name", "missing_required_parameter")
    strict = True if tool.strict is None else tool.strict
    return Tool(FunctionDef(tool.name, tool.description, tool.parameters, strict))


def response_format(req: ResponsesRequest) -> ResponseFormat | None:
    """`text.format` as chat's `response_format` (structured outputs enforce it the same way)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object")
    if fmt.schema is None:
        raise bad_request("text.format json_schema needs its schema", "text.format.schema",
                          "missing_required_parameter")
    return ResponseFormat("json_schema", JsonSchemaFormat(name=fmt.name, description=fmt.description,
                                                          schema=fmt.schema, strict=fmt.strict))


# -- items as stored ---------------------------------------------------------------------------------------


def stored_items(items: list[InputItem]) -> list[dict[str, Any]]:
    """Input items as OpenAI lists them (GET /v1/responses/{id}/input_items): typed, with an id, a
    message's content as parts."""
    return [_stored(item) for item in items]


def _stored(item: InputItem) -> dict[str, Any]:
    out = {k: v for k, v in msgspec.structs.asdict(item).items() if v is not None}
    out["type"] = item.type or "message"
    if out["type"] == "message":
        out.setdefault("id", new_id("msg"))
        if isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            out["content"] = [{"type": kind, "text": item.content}]
    else:
        out.setdefault("id", new_id({"function_call": "fc", "reasoning": "rs"}.get(out["type"], "fco")))
    return msgspec.to_builtins(out)
