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
    """A forced Hermes call on chat completions (see forced_call_constraint)."""
    functions = [(t.function.name, t.function.parameters) for t in tools]
    return forced_call_constraint(functions, name, output_text, tags, "tools[{}].function.parameters")


def forced_call_constraint(functions: list[tuple[str, dict | None]], name: str | None, output_text: str,
                           tags: frozenset[str], param: str) -> tuple[GrammarSpec, str]:
    """A forced Hermes call: the output starts with `output_text` (the part of the call's start that
    the prompt does not hold, rill.openai.forced_prefix), then the named function's arguments (or any
    function's name and its arguments, for tool_choice "required"), then the call's end. `param` is
    the parameters' field, formatted with the function's index."""
    indexed = [(i, f) for i, f in enumerate(functions) if name is None or f[0] == name]
    params = [param.format(i) for i, _ in indexed]
    schemas = [specs.ANY_OBJECT if f[1] is None else f[1] for _, f in indexed]  # none declared: any object
    if name is not None:  # the prompt (and output_text) already hold the name and `"arguments": `
        options = [("", schemas[0])]
    else:  # the start ends in `{"name": "`: each option writes a name, then that function's arguments
        options = [(json.dumps(f[0], ensure_ascii=False)[1:] + ', "arguments": ', schema)
                   for (_, f), schema in zip(indexed, schemas)]
    return specs.tool_call(output_text, options, CALL_TAIL, params, tags), param.split("[")[0]
