"""What a request constrains its output to, as the text of an llguidance grammar.

Every kind becomes one grammar text: JSON schemas go through llguidance's JSON compiler (with
rill's separators, see JSON_OPTIONS), the rest are Lark (llguidance's dialect: `%json {...}` embeds a
schema, `/.../` a regex). The text is also the compile cache's key, so two requests with the same
schema share one compiled grammar however their JSON was laid out.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import msgspec
from llguidance import LLMatcher
from llguidance.gbnf_to_lark import gbnf_to_lark

from rill.errors import ValidationError

# JSON as json.dumps and most chat models write it ("a": 1, "b": 2), and no free whitespace: a
# small model given the choice of blanks can write them until max_tokens.
JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# A special token Lark can write by name (`<think>`, `<|im_end|>`); others (`[INST]`) are left out of free text.
_BY_NAME = re.compile(r"<[^<>\s]+>")


class GrammarSpec(msgspec.Struct, frozen=True):
    """A grammar's llguidance text, and what the request asked for (for messages and metrics)."""

    kind: str  # json_schema, json_object, regex, choice, grammar, tool_call, text_or_tool_calls
    text: str


def json_schema(schema: Any, param: str) -> GrammarSpec:
    """Output that is one JSON value valid against `schema` (a JSON Schema object)."""
    return GrammarSpec("json_schema", _json_grammar(_schema_object(schema, param), param))


def json_object() -> GrammarSpec:
    """Any JSON object (OpenAI's response_format json_object)."""
    return GrammarSpec("json_object", _json_grammar(ANY_OBJECT, "response_format"))


def regex(pattern: Any, param: str) -> GrammarSpec:
    if not isinstance(pattern, str) or not pattern:
        raise ValidationError(f"{param} must be a non-empty regular expression", param=param)
    return GrammarSpec("regex", LLMatcher.grammar_from_regex(pattern))


def choice(options: Any, param: str) -> GrammarSpec:
    """Exactly one of the given strings."""
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        raise ValidationError(f"{param} must be a non-empty list of non-empty strings", param=param)
    return GrammarSpec("choice", "start: " + " | ".join(map(_literal, dict.fromkeys(options))))


def grammar(text: Any, param: str) -> GrammarSpec:
    """A Lark grammar in llguidance's dialect, or a GBNF one (llama.cpp's, rules written `::=`)."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(f"{param} must be a non-empty grammar", param=param)
    if "::=" in text:
        try:
            text = gbnf_to_lark(text)
        except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions on bad input
            raise ValidationError(f"{param} is not a valid GBNF grammar: {exc}", param=param) from exc
    return GrammarSpec("grammar", text)


def tool_call(head: str, options: list[tuple[str, Any]], tail: list[str], params: list[str],
              tags: frozenset[str] = frozenset()) -> GrammarSpec:
    """`head`, then one of `options` (each a literal followed by JSON valid against its schema), then
    the `tail` parts: a tool call whose wrapper is the model's format and whose arguments fit the
    function. params[i] names options[i]'s schema in errors; parts in `tags` are special tokens
    (rill.structured.vocab.special_tags), written by name."""
    start = f"start: {_literal(head)} call {_parts(tail, tags)}" if head else f"start: call {_parts(tail, tags)}"
    return GrammarSpec("tool_call", "\n".join([start, *_call_rules(options, params)]))


def text_or_tool_calls(head: list[str], options: list[tuple[str, Any]], tail: list[str], params: list[str],
                       tags: frozenset[str], one_call: bool = False) -> GrammarSpec:
    """Free text, then (or instead) tool calls one per line, each the `head` parts, one of `options` and
    the `tail` parts as in tool_call: tool_choice "auto" with strict tools, where the model may answer
    in text but a call it makes must fit. head[0], the call's opening, must be a special token (in
    `tags`): free text never holds it, not even spelled out, so every call the tool-call parser finds is
    one the grammar constrained. (Spelled as text, the opening could not end the free text: llguidance's
    lexer is greedy.) The model's other tags stay free, so a reasoning model can still write `<think>`."""
    others = sorted(tag for tag in tags - {head[0]} if _BY_NAME.fullmatch(tag))
    calls = "tool_call" if one_call else 'tool_call ("\\n" tool_call)*'
    # TEXT never follows TEXT: the lexer would end one where the opening's last letter begins the next.
    rules = [f"start: TEXT? {'(tag TEXT?)* ' if others else ''}calls?",
             f'calls: {calls} "\\n"?',  # Hermes writes a newline between calls, and may end on one
             f"tool_call: {_parts(head, tags)} call {_parts(tail, tags)}",
             *_call_rules(options, params),
             f"TEXT: /(?s:.+)/ & ~(/(?s:.*)/ {_literal(head[0])} /(?s:.*)/)"]
    if others:
        rules.append("tag: " + " | ".join(others))
    return GrammarSpec("text_or_tool_calls", "\n".join(rules))


# -- helpers ----------------------------------------------------------------------------------------------


def _call_rules(options: list[tuple[str, Any]], params: list[str]) -> list[str]:
    """`call`, one of the options: its literal (a function's name), then its arguments' JSON."""
    rules, alternatives = [], []
    for i, ((literal, schema), param) in enumerate(zip(options, params)):
        schema = _checked_schema(_schema_object(schema, param), param)
        rules.append(f"args_{i}: %json " + json.dumps(_with_options(schema), ensure_ascii=False))
        alternatives.append(f"{_literal(literal)} args_{i}" if literal else f"args_{i}")
    return ["call: " + " | ".join(alternatives), *rules]


def _parts(parts: list[str], tags: frozenset[str]) -> str:
    """Lark for text in parts: a special token by name, anything else as a string."""
    return " ".join(part if part in tags else _literal(part) for part in parts)


def _schema_object(schema: Any, param: str) -> dict[str, Any]:
    if isinstance(schema, str):  # vLLM's structured_outputs.json may be the schema's JSON text
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{param} is not valid JSON: {exc}", param=param) from exc
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise ValidationError(f"{param} must be a JSON Schema object", param=param)
    return schema


def _with_options(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with rill's JSON layout; the client's own x-guidance settings win."""
    return {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}


def _json_grammar(schema: dict[str, Any], param: str) -> str:
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise ValidationError(f"{param} is not a valid JSON Schema: {exc}", param=param) from exc


def _checked_schema(schema: dict[str, Any], param: str) -> dict[str, Any]:
    """Check a schema alone before it is embedded in a larger grammar, so that an error names it."""
    if not isinstance(schema.get("x-guidance", {}), dict):  # _with_options merges rill's settings into it
        raise ValidationError(f"{param} is not a schema rill can enforce: x-guidance must be an object", param=param)
    invalid, message = _schema_problem(json.dumps(schema, sort_keys=True, ensure_ascii=False))
    if message:
        problem = "is not a valid JSON Schema" if invalid else "is not a schema rill can enforce"
        raise ValidationError(f"{param} {problem}: {message}", param=param)
    return schema


@functools.lru_cache(maxsize=256)
def _schema_problem(schema_json: str) -> tuple[bool, str]:
    """(invalid, message) for a schema's JSON text: message "" when it can be enforced. Cached: every
    request that lists tools checks each one (tool_choice "auto"), mostly the same few schemas."""
    try:
        text = LLMatcher.grammar_from_json_schema(json.loads(schema_json), defaults=JSON_OPTIONS)
    except ValueError as exc:
        return True, str(exc)
    return False, _grammar_error(text)


def is_enforceable(schema: Any) -> bool:
    """True when `schema` is a JSON Schema object that llguidance can enforce (as tool_call checks it)."""
    try:
        _checked_schema(_schema_object(schema, ""), "")
    except ValidationError:
        return False
    return True


def _grammar_error(text: str) -> str:
    """llguidance's message for an invalid grammar ("" when it is valid); independent of the tokenizer."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(text)
    return messages[0] if is_error and messages else ""


def _literal(text: str) -> str:
    """A Lark string literal (Lark reads JSON's string escapes)."""
    return json.dumps(text, ensure_ascii=False)
