"""Which grammar, if any, a request's output must match: response_format, vLLM's structured_outputs,
a tool call that tool_choice forces (its wrapper in the model's Hermes format, its arguments valid
against the function's parameters), or, under tool_choice "auto", text or calls to the declared
tools whose arguments are valid. Compiled through Serving.compile_grammar, so an invalid schema,
regex or grammar is a 400 naming its field before anything runs."""

from __future__ import annotations

import json

from rill.openai.errors import bad_request
from rill.openai.requests import SamplingFields, StructuredOutputs, Tool
from rill.openai.tool_parser import TOOL_CALL_END, TOOL_CALL_START
from rill.structured import GrammarSpec, specs

# A whole Hermes call's start, as forced_prefix.call_start(None) writes it: the block opens, then the
# object that holds the name and arguments, up to the name's first character.
CALL_HEAD = [TOOL_CALL_START, '\n{"name": "']
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
        options = [(_name_rest(f[0]), schema) for (_, f), schema in zip(indexed, schemas)]
    return specs.tool_call(output_text, options, CALL_TAIL, params, tags), param.split("[")[0]


def auto_tools_constraint(tools: list[Tool], parallel: bool, tags: frozenset[str]) -> tuple[GrammarSpec, str] | None:
    """tool_choice "auto": the answer is text, or (after text or not) Hermes calls, each to a declared
    function with arguments valid against its parameters (issue 49: a sampled `Get_weather` is a call
    no client can run). Free text is free until the model writes `<tool_call>`; from there the grammar
    holds the call. A strict function's parameters must be enforceable (else a 400, as OpenAI's strict
    mode promises); a non-strict function's that llguidance cannot enforce fall back to any JSON object.
    None (nothing constrained) when the model's `<tool_call>` is not a special token: text could not
    end where a spelled-out call begins (specs.text_or_tool_calls)."""
    functions = [(t.function.name, t.function.parameters, bool(t.function.strict)) for t in tools]
    return auto_calls_constraint(functions, parallel, tags, "tools[{}].function.parameters")


def auto_calls_constraint(functions: list[tuple[str, dict | None, bool]], parallel: bool, tags: frozenset[str],
                          param: str) -> tuple[GrammarSpec, str] | None:
    """auto_tools_constraint over (name, parameters, strict) triples; `param` names the parameters'
    field, formatted with the function's index (realtime tools are flat, chat's nested)."""
    if not functions or TOOL_CALL_START not in tags:
        return None
    params = [param.format(i) for i in range(len(functions))]
    options = [(_name_rest(name), _auto_schema(parameters, strict))
               for (name, parameters, strict) in functions]
    return (specs.text_or_tool_calls(CALL_HEAD, options, CALL_TAIL, params, tags, one_call=not parallel),
            param.split("[")[0])


def _auto_schema(parameters: dict | None, strict: bool) -> dict:
    """What a call's arguments must match under "auto": the function's parameters when it declares
    them, checked when the grammar is built; a non-strict function's that cannot be enforced, any
    object (a 400 would break requests that worked before the call's grammar existed)."""
    if parameters is None:
        return specs.ANY_OBJECT
    if strict or specs.is_enforceable(parameters):
        return parameters
    return specs.ANY_OBJECT


def _name_rest(name: str) -> str:
    """A call's text after `{"name": "`: the rest of the name, then the arguments' key."""
    return json.dumps(name, ensure_ascii=False)[1:] + ', "arguments": '
