"""A Messages request -> the chat path's request (rill.openai.requests.ChatCompletionRequest).

- `system` (a string or text blocks) becomes a leading system message.
- A user turn's `tool_result` blocks become tool messages (Anthropic puts them first in the turn
  after the calls, where chat wants them), its text and image blocks one user message after them.
- An assistant turn's `text` blocks become its content, `thinking` its reasoning_content, and
  `tool_use` its tool_calls (input as JSON arguments). A last assistant turn is a prefill: the
  answer continues it (continue_final_message), as Anthropic's does.
- `tools` become functions (`input_schema` their parameters); `tool_choice` auto/any/tool/none
  becomes auto/required/named/none and `disable_parallel_tool_use` parallel_tool_calls false.
- `output_config.format` (json_schema) becomes response_format: the answer's text matches the schema.
- `thinking` enabled or adaptive asks the template for thinking (`enable_thinking`, Qwen3's
  switch), disabled asks it not to; the server's --reasoning-parser splits it out of the answer.

Errors name the Anthropic field in its own dotted form (`messages.1.content.0.type`); `renamed`
maps the fields the chat path's checks name back to the ones the client set.
"""

from __future__ import annotations

import json
import re

from rill.anthropic.schema import Block, CountTokensRequest, MessageParam, MessagesRequest, ToolParam
from rill.openai.errors import ApiError, bad_request
from rill.openai.requests import (
    ChatCompletionRequest, ContentPart, FunctionCall, FunctionDef, JsonSchemaFormat, MediaURL, Message,
    NamedFunction, NamedToolChoice, ResponseFormat, Tool, ToolCall,
)

USER_BLOCKS = ("text", "image", "tool_result")
ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")
MIN_THINKING_BUDGET = 1024  # Anthropic's floor for thinking.budget_tokens

_RENAMES = [
    (re.compile(r"^(max_completion_tokens|max_tokens)$"), "max_tokens"),
    (re.compile(r"^stop$"), "stop_sequences"),
    (re.compile(r"^response_format(\.json_schema)?(\.schema)?"), "output_config.format.schema"),
    (re.compile(r"^messages\[.*"), "messages"),  # the chat messages do not map one to one
    (re.compile(r"^tools\[(\d+)\]\.function\.parameters"), r"tools.\1.input_schema"),
    (re.compile(r"^tools\[(\d+)\]\.function\.name"), r"tools.\1.name"),
]


def renamed(error: ApiError) -> ApiError:
    """A chat-path error with its param named as the Messages request names it."""
    for pattern, replacement in _RENAMES:
        if error.param and pattern.search(error.param):
            old, error.param = error.param, pattern.sub(replacement, error.param)
            if error.message.startswith(old):  # the message names the field first, as the param does
                error.message = error.param + error.message[len(old):]
            break
    return error


def chat_request(req: CountTokensRequest, accepts_images: bool) -> ChatCompletionRequest:
    """The chat request that answers `req` (a MessagesRequest, or a CountTokensRequest to count)."""
    messages = [Message("system", _system_text(req.system))] if req.system else []
    for i, message in enumerate(req.messages):
        messages += _messages(message, f"messages.{i}", accepts_images)
    prefill = bool(req.messages) and req.messages[-1].role == "assistant"
    tools, choice, parallel = _tools(req)
    full = isinstance(req, MessagesRequest)
    return ChatCompletionRequest(
        messages=messages, model=req.model, tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
        add_generation_prompt=not prefill, continue_final_message=prefill,
        chat_template_kwargs=_thinking(req), **(_sampling(req) if full else {}),
    )


def _sampling(req: MessagesRequest) -> dict:
    if req.max_tokens < 1:
        raise bad_request("max_tokens must be at least 1", "max_tokens")
    if req.temperature is not None and not 0.0 <= req.temperature <= 1.0:
        raise bad_request(f"temperature is {req.temperature}; it must be between 0 and 1", "temperature")
    output = req.output_config.format if req.output_config else None
    response_format = None if output is None else ResponseFormat(
        "json_schema", JsonSchemaFormat(name="output", schema=output.schema, strict=True))
    return dict(max_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature,
                top_p=req.top_p, top_k=req.top_k, user=req.metadata.user_id if req.metadata else None,
                response_format=response_format)


def _thinking(req: CountTokensRequest) -> dict | None:
    if req.thinking is None:
        return None
    if req.thinking.type == "enabled":
        budget = req.thinking.budget_tokens
        if budget is None or budget < MIN_THINKING_BUDGET:
            raise bad_request(f"budget_tokens must be at least {MIN_THINKING_BUDGET}", "thinking.budget_tokens")
        if isinstance(req, MessagesRequest) and budget >= req.max_tokens:
            raise bad_request("budget_tokens must be less than max_tokens", "thinking.budget_tokens")
    return {"enable_thinking": req.thinking.type != "disabled"}


def _system_text(system: str | list[Block]) -> str:
    if isinstance(system, str):
        return system
    for j, block in enumerate(system):
        if block.type != "text" or block.text is None:
            raise bad_request(f"system blocks must be text blocks; got {block.type!r}", f"system.{j}.type")
    return "\n".join(block.text for block in system)


# -- messages ----------------------------------------------------------------------------------------------


def _messages(message: MessageParam, where: str, accepts_images: bool) -> list[Message]:
    if isinstance(message.content, str):
        return [Message(message.role, message.content)]
    if message.role == "assistant":
        return [_assistant(message.content, where)]
    return _user(message.content, where, accepts_images)


def _user(blocks: list[Block], where: str, accepts_images: bool) -> list[Message]:
    results, parts = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        if block.type == "tool_result":
            results.append(_tool_result(block, at))
        elif block.type == "text":
            parts.append(ContentPart("text", text=_required(block.text, at + ".text")))
        elif block.type == "image":
            parts.append(_image(block, at, accepts_images))
        else:
            raise bad_request(f"a user turn's block type {block.type!r} is not supported; rill takes "
                              f"{', '.join(USER_BLOCKS)}", at + ".type", "unsupported")
    return results + ([Message("user", parts)] if parts else [])


def _tool_result(block: Block, at: str) -> Message:
    call_id = _required(block.tool_use_id, at + ".tool_use_id")
    content = block.content
    if isinstance(content, list):
        for k, part in enumerate(content):
            if part.type != "text" or part.text is None:
                raise bad_request(f"a tool_result's content blocks must be text; got {part.type!r}",
                                  f"{at}.content.{k}.type", "unsupported")
        content = "\n".join(part.text for part in content)
    return Message("tool", content or "", tool_call_id=call_id)


def _image(block: Block, at: str, accepts_images: bool) -> ContentPart:
    if not accepts_images:
        raise bad_request("this model reads text only: image blocks are not supported", at + ".type", "unsupported")
    source = block.source
    if source is None:
        raise bad_request("an image block needs its source", at + ".source", "missing_required_parameter")
    if source.type == "base64" and source.data and source.media_type:
        return ContentPart("image_url", image_url=MediaURL(f"data:{source.media_type};base64,{source.data}"))
    if source.type == "url" and source.url:
        return ContentPart("image_url", image_url=MediaURL(source.url))
    raise bad_request("an image source is base64 (media_type and data) or url (url)", at + ".source")


def _assistant(blocks: list[Block], where: str) -> Message:
    texts, calls, reasoning = [], [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        if block.type == "text":
            texts.append(_required(block.text, at + ".text"))
        elif block.type == "thinking":
            reasoning.append(block.thinking or "")
        elif block.type == "tool_use":
            name = _required(block.name, at + ".name")
            arguments = json.dumps(block.input if block.input is not None else {})
            calls.append(ToolCall(FunctionCall(name, arguments), id=_required(block.id, at + ".id")))
        elif block.type != "redacted_thinking":  # encrypted by Anthropic: nothing rill can read
            raise bad_request(f"an assistant turn's block type {block.type!r} is not supported; rill takes "
                              f"{', '.join(ASSISTANT_BLOCKS)}", at + ".type", "unsupported")
    return Message("assistant", "".join(texts) if texts or not calls else None, tool_calls=calls or None,
                   reasoning_content="".join(reasoning) or None)


def _required(value, param: str):
    if value is None:
        raise bad_request(f"{param.rsplit('.', 1)[-1]} is required", param, "missing_required_parameter")
    return value


# -- tools ---------------------------------------------------------------------------------------------------


def _tools(req: CountTokensRequest) -> tuple[list[Tool] | None, object, bool]:
    """(chat tools, chat tool_choice, parallel_tool_calls)."""
    tools = [_tool(t, i) for i, t in enumerate(req.tools)] if req.tools else None
    choice = req.tool_choice
    if choice is None:
        return tools, None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        name = _required(choice.name, "tool_choice.name")
        if name not in {t.name for t in req.tools or ()}:
            raise bad_request(f"tool_choice names {name!r}, which is not among the tools", "tool_choice.name")
        return tools, NamedToolChoice(NamedFunction(name)), parallel
    if choice.type == "any" and not tools:
        raise bad_request("tool_choice any asks for a tool call but the request has no tools", "tool_choice")
    return tools, {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def _tool(tool: ToolParam, i: int) -> Tool:
    if tool.type not in (None, "custom"):
        raise bad_request(f"tool type {tool.type!r} is one of Anthropic's server tools, which rill does not run; "
                          "declare client tools (name, description, input_schema)", f"tools.{i}.type", "unsupported")
    if tool.input_schema is None:
        raise bad_request("a tool needs its input_schema", f"tools.{i}.input_schema", "missing_required_parameter")
    return Tool(FunctionDef(tool.name, tool.description, tool.input_schema))
