"""Hugging Face chat templates: found in a model directory and rendered as transformers 5 renders them.

The environment and the input preparation follow `transformers.utils.chat_template_utils`
(`_cached_compile_jinja_template`, `render_jinja_template`) and `apply_chat_template`, so a template renders
to the same text here as there. Templates are untrusted code from the Hub, hence the immutable sandbox.

Message content passes through untouched: a string, or a list of content parts such as
`[{"type": "text", "text": ...}]`, exactly as transformers hands it to the template. Templates written for
parts iterate over them; a template that expects a string will print the list, as it would in transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rill.errors import ChatTemplateError, ModelLoadError, TemplateRewritesTextError, ValidationError

CHAT_TEMPLATE_FILE = "chat_template.jinja"  # what transformers 5's save_pretrained writes
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # named templates other than "default", one .jinja each

# Names the renderer passes itself; chat_template_kwargs may not replace them.
RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})

# transformers names a message's reasoning in several ways; templates read the first.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Stands for a message's text that is still streaming in. Private-use characters: no real message
# holds them, no template has a reason to touch them, and a template's trim keeps them whole.
STREAMED_TEXT_PLACEHOLDER = "\ue000rill:streamed-text\ue000"

ChatTemplates = str | dict[str, str]  # one template, or named ones ("default", "tool_use", ...)


# -- finding templates ---------------------------------------------------------------------------


def load_chat_templates(model_dir: Path, config: Mapping[str, Any]) -> ChatTemplates | None:
    """The model's templates. Template files win over tokenizer_config.json's entry, as in transformers 5."""
    files = _template_files(model_dir)
    if list(files) == ["default"]:
        return files["default"]
    return files or _config_templates(config)


def _template_files(model_dir: Path) -> dict[str, str]:
    templates = {}
    default = model_dir / CHAT_TEMPLATE_FILE
    if default.is_file():
        templates["default"] = default.read_text(encoding="utf-8")
    named_dir = model_dir / CHAT_TEMPLATE_DIR
    if named_dir.is_dir():
        for path in sorted(named_dir.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    return templates


def _config_templates(config: Mapping[str, Any]) -> ChatTemplates | None:
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    # The legacy form of several templates: [{"name": ..., "template": ...}, ...]
    if isinstance(value, list) and all(isinstance(t, dict) and {"name", "template"} <= t.keys() for t in value):
        return {t["name"]: t["template"] for t in value}
    raise ModelLoadError(
        'tokenizer_config.json: "chat_template" must be a string or a list of {"name", "template"} objects'
    )


def select_template(templates: ChatTemplates | None, *, has_tools: bool) -> str:
    """Pick the template to render: "tool_use" when tools are given and it exists, else "default"."""
    if templates is None:
        raise ChatTemplateError("this model has no chat template; provide one with --chat-template")
    if isinstance(templates, str):
        return templates
    if has_tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ChatTemplateError(f"this model's chat templates {sorted(templates)} include no 'default' template")


# -- the sandbox -------------------------------------------------------------------------------------


class _TemplateRaised(jinja2.TemplateError):
    """The template called raise_exception(); its message is meant for the user as it stands."""


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Replaces jinja's own filter, which escapes HTML characters and offers no separators or sort_keys.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` for templates, without exposing the dict type itself to type-hackery."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore names so a template cannot reach CPython internals."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]  # jinja's signature trick, so that namespace(self=...) works
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set the namespace attribute {name!r}")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it; we render the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per distinct template text."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(), namespace=_TemplateNamespace
    )
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template has a syntax error on line {e.lineno}: {e.message}") from e


# -- rendering -----------------------------------------------------------------------------------------


def render_chat(
    template: str,
    messages: list[Mapping[str, Any]],
    *,
    tools: list[Mapping[str, Any]] | None = None,
    documents: list[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render `messages` as transformers' apply_chat_template(..., tokenize=False) would.

    `variables` are the extra template variables (special tokens, then chat_template_kwargs over them).
    Tools are JSON-schema dicts, OpenAI-style `{"type": "function", "function": {...}}` or bare; like
    transformers we pass them, and tool-call arguments (dict or JSON string), to the template unchanged.
    """
    if continue_final_message and add_generation_prompt:
        raise ValidationError(
            "continue_final_message and add_generation_prompt cannot both be set", param="continue_final_message"
        )
    chat = _prepare_messages(messages)
    final_text = _tag_final_message(chat, template) if continue_final_message else None
    rendered = _render(
        compile_template(template),
        messages=chat,
        tools=_plain(_check_dicts(tools, "tools")),
        documents=_plain(_check_dicts(documents, "documents")),
        add_generation_prompt=add_generation_prompt,
        **_plain(_check_variables(variables or {})),
    )
    return rendered if final_text is None else _cut_at_tag(rendered, final_text)


def _render(compiled: jinja2.Template, **context) -> str:
    # Whatever the template does wrong surfaces as ChatTemplateError, never as a jinja traceback.
    try:
        return compiled.render(**context)
    except _TemplateRaised as e:
        raise ChatTemplateError(str(e)) from e
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template failed: {e}") from e
    except Exception as e:  # a template can trip TypeError, KeyError, ... in its own expressions
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e


def _prepare_messages(messages) -> list[dict[str, Any]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValidationError("messages must be a non-empty list", param="messages")
    if not all(isinstance(m, Mapping) for m in messages):
        raise ValidationError("each message must be an object", param="messages")
    # transformers drops None values: templates handle a missing "content" or "tool_calls" but print None.
    chat = [_plain({k: v for k, v in m.items() if v is not None}) for m in messages]
    return [_alias_reasoning(m) for m in chat]


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    # Fill reasoning_content from its older names, and "thinking" for gpt-oss templates, as transformers does.
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value: Any) -> Any:
    """A copy built of plain JSON types: the sandbox knows nothing of other objects' methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums) can carry methods; keep the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"  # an inert placeholder, as transformers renders one


def _check_dicts(items, param: str):
    if items is None:
        return None
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, Mapping) for i in items):
        raise ValidationError(f"{param} must be a list of objects", param=param)
    return items


def _check_variables(variables: Mapping[str, Any]) -> Mapping[str, Any]:
    clash = RESERVED_VARIABLES & variables.keys()
    if clash:
        raise ValidationError(
            f"chat_template_kwargs may not set {sorted(clash)}; use the request fields", param="chat_template_kwargs"
        )
    return variables


def _tag_final_message(chat: list[dict[str, Any]], template: str) -> str:
    """Mark the end of the last message's text, so the render can be cut there. Returns that text."""
    final = chat[-1]
    content = final.get("content")
    if content is None:
        raise ValidationError("continue_final_message needs a final message with content", param="messages")
    if "content" not in template:
        raise ChatTemplateError("continue_final_message is set but the chat template never reads message content")
    if isinstance(content, str):
        final["content"] = content + _CONTINUE_TAG
        return content
    for part in reversed(content if isinstance(content, list) else []):
        if isinstance(part, dict) and "text" in part:  # the last text part is the one to continue
            text, part["text"] = part["text"], part["text"] + _CONTINUE_TAG
            return text
    raise ValidationError("continue_final_message found no text to continue in the final message", param="messages")


def _cut_at_tag(rendered: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError("continue_final_message is set but the chat template drops part of the final message")
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing space, and our tag's with it


# -- streamed text ----------------------------------------------------------------------------------


def split_at_placeholder(rendered: str, placeholder: str) -> tuple[str, str]:
    """The rendered prompt before and after `placeholder`, which stood in for a message's text.

    Text can be streamed in there only if the template copied the placeholder verbatim exactly once;
    otherwise this raises TemplateRewritesTextError.
    """
    before, found, after = rendered.partition(placeholder)
    if not found or placeholder in after:
        raise TemplateRewritesTextError("the chat template does not copy a message's text verbatim exactly once, "
                                        "so text cannot be streamed into it")
    return before, after
