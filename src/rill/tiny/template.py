"""rill-tiny's ChatML chat template, in Qwen2.5's shape, and a Python mirror used to build the corpus.

Tools are listed in the system turn inside <tools></tools> (one JSON object per line), calls are
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, and tool results are rendered as a
user turn holding <tool_response> blocks. The tool preamble is shorter than Qwen's so prompts stay
small for a character-level model. Unlike Qwen there is no default system prompt.

`render` must produce exactly what the Jinja template produces with transformers' `tojson`
(json.dumps, ensure_ascii=False); tests pin the two together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# The call format comes first and the signatures last, so the tool names sit right before the
# conversation: rill-tiny attends over a sliding window, and a character-level tools list is long.
TOOLS_HEADER = (
    "# Tools\n\nReturn each call within <tool_call></tool_call>:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
    "You may call these functions. Signatures are within <tools></tools>:\n<tools>"
)
TOOLS_FOOTER = "\n</tools>"

CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- " + json.dumps(TOOLS_HEADER) + " }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- '\\n' }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- " + json.dumps(TOOLS_FOOTER + "<|im_end|>\n") + " }}\n"
    "{%- elif messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}\n"
    "            {%- if tool_call.arguments is string %}\n"
    "                {{- tool_call.arguments }}\n"
    "            {%- else %}\n"
    "                {{- tool_call.arguments | tojson }}\n"
    "            {%- endif %}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

Message = Mapping[str, Any]
ASSISTANT_HEADER = "<|im_start|>assistant\n"


def render(messages: Sequence[Message], tools: Sequence[Mapping] | None = None, *, add_generation_prompt: bool = False) -> str:
    """The text CHAT_TEMPLATE renders for these messages."""
    text = "".join(part for part, _ in render_parts(messages, tools))
    return text + ASSISTANT_HEADER if add_generation_prompt else text


def render_parts(messages: Sequence[Message], tools: Sequence[Mapping] | None = None) -> list[tuple[str, bool]]:
    """The rendered text in pieces, each flagged True when it is an assistant turn.

    Every piece starts at a special token or a newline, so tokenizing the pieces one by one gives
    the same tokens as tokenizing the whole text (rill-tiny's tokenizer isolates newlines).
    """
    parts = [(_system_turn(messages, tools), False)]
    parts += [(_turn(messages, i, m), m["role"] == "assistant") for i, m in enumerate(messages)]
    return [(text, is_assistant) for text, is_assistant in parts if text]


def format_tool_call(name: str, arguments: Mapping | str) -> str:
    """A call as the assistant writes it (and as the template renders it)."""
    args = arguments if isinstance(arguments, str) else _tojson(arguments)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _system_turn(messages: Sequence[Message], tools: Sequence[Mapping] | None) -> str:
    has_system = bool(messages) and messages[0]["role"] == "system"
    if tools:
        system = messages[0]["content"] + "\n\n" if has_system else ""
        listed = "".join("\n" + _tojson(tool) for tool in tools)
        return f"<|im_start|>system\n{system}{TOOLS_HEADER}{listed}{TOOLS_FOOTER}<|im_end|>\n"
    if has_system:
        return f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n"
    return ""


def _turn(messages: Sequence[Message], i: int, message: Message) -> str:
    role = message["role"]
    if role == "system":
        return "" if i == 0 else f"<|im_start|>system\n{message['content']}<|im_end|>\n"
    if role == "user" or (role == "assistant" and not message.get("tool_calls")):
        return f"<|im_start|>{role}\n{message['content']}<|im_end|>\n"
    if role == "assistant":
        text = "\n" + message["content"] if message.get("content") else ""
        calls = "".join("\n" + format_tool_call(**_function(c)) for c in message["tool_calls"])
        return f"<|im_start|>assistant{text}{calls}<|im_end|>\n"
    if role == "tool":
        opens = i == 0 or messages[i - 1]["role"] != "tool"
        closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
        body = f"\n<tool_response>\n{message['content']}\n</tool_response>"
        return ("<|im_start|>user" if opens else "") + body + ("<|im_end|>\n" if closes else "")
    return ""


def _function(call: Mapping) -> dict:
    fn = call.get("function", call)
    return {"name": fn["name"], "arguments": fn["arguments"]}
