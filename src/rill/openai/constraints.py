"""Which grammar, if any, a request's output must match: response_format, vLLM's structured_outputs,
or a tool call that tool_choice forces (its wrapper in the model's Hermes format, its arguments
valid against the function's parameters). Compiled through Serving.compile_grammar, so an invalid
schema, regex or grammar is a 400 naming its field before anything runs."""

from __future__ import annotations

import json

from rill.openai.errors import bad_request
from rill.openai.requests import SamplingFields, StructuredOutputs, Tool
from rill.openai.tool_parser import TOOL_CALL_END
from rill.structured import GrammarSpec, specs

# What follows a Hermes call's arguments: the object that holds name and arguments closes, then the block.
CALL_TAIL = ["}\n", TOOL_CALL_END]
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def output_constraint(req: SamplingFields) -> tuple[GrammarSpec, str] | None:
    """The spec of response_format or structured_outputs, with the field to name in errors."""
    fmt = req.response_format
    asked = fmt is not None and fmt.type != "text"
    if asked and req.structured_outputs is not None:
        raise bad_request("response_format and structured_outputs both constrain the output; send one",
                          "structured_outputs")
    if asked:
        return _response_format(req)
    if req.structured_outputs is not None:
        return _structured_outputs(req.structured_outputs)
    return None


def _response_format(req: SamplingFields) -> tuple[GrammarSpec, str]:
    fmt = req.response_format
    if fmt.type == "json_object":
        return specs.json_object(), "response_format"
    if fmt.json_schema is None:
        raise bad_request("response_format json_schema needs its json_schema object", "response_format.json_schema")
    schema = fmt.json_schema.schema
    param = "response_format.json_schema.schema"
    return specs.json_schema(True if schema is None else schema, param), param


def _structured_outputs(so: StructuredOutputs) -> tuple[GrammarSpec, str]:
    given = [name for name in _STRUCTURED_KINDS if getattr(so, name) not in (None, False)]
    if len(given) != 1:
        raise bad_request(f"structured_outputs needs exactly one of {', '.join(_STRUCTURED_KINDS)}; "
                          f"got {', '.join(given) or 'none'}", "structured_outputs")
    kind = given[0]
    param = f"structured_outputs.{kind}"
    if kind == "json":
        return specs.json_schema(so.json, param), param
    if kind == "json_object":
        return specs.json_object(), param
    build = {"regex": specs.regex, "choice": specs.choice, "grammar": specs.grammar}[kind]
    return build(getattr(so, kind), param), param


def tool_call_constraint(tools: list[Tool], name: str | None, output_text: str,
                         tags: frozenset[str]) -> tuple[GrammarSpec, str]:
    """A forced Hermes call: the output starts with `output_text` (the part of the call's start that
    the prompt does not hold, rill.openai.forced_prefix), then the named function's arguments (or any
    tool's name and its arguments, for tool_choice "required"), then the call's end."""
    indexed = [(i, t) for i, t in enumerate(tools) if name is None or t.function.name == name]
    params = [f"tools[{i}].function.parameters" for i, _ in indexed]
    schemas = [_parameters(t) for _, t in indexed]
    if name is not None:  # the prompt (and output_text) already hold the name and `"arguments": `
        options = [("", schemas[0])]
    else:  # the start ends in `{"name": "`: each option writes a name, then that tool's arguments
        options = [(json.dumps(t.function.name, ensure_ascii=False)[1:] + ', "arguments": ', schema)
                   for (_, t), schema in zip(indexed, schemas)]
    return specs.tool_call(output_text, options, CALL_TAIL, params, tags), "tools"


def _parameters(tool: Tool) -> dict:
    """A function's parameter schema; one that declares none takes any JSON object (OpenAI's default)."""
    return tool.function.parameters if tool.function.parameters is not None else specs.ANY_OBJECT
