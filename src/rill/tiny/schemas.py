"""Tool schemas as agent frameworks write them, and tool results in the forms clients send.

rill-tiny must call get_weather / get_time whatever shape the schema comes in: pydantic's
alphabetical key order ("properties" first, "type" last), `title`s, descriptions on the function
and its parameters, `enum` parameters, `additionalProperties: false`, `strict: true`, no
`required`, and the names frameworks give (GetWeather, get_current_weather, ...). A Toolbox is
the tools one conversation lists, and for each tool family the (name, parameter) of the listed
tool that fits, if any. The exact shapes the frameworks emit are in /work/notes/framework_schemas.json
when this was written (langchain-core 1.8, openai-agents 0.24, llama-index-core 0.14, instructor
1.17, llm 0.36); PRESETS reproduces them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

KINDS = ("weather", "time")
PARAMS = {"weather": ("city", "location", "city_name"), "time": ("timezone", "tz", "time_zone")}
DOCS = {
    "weather": ("Get the current weather in a city.", "Get the current weather in a given location.",
                "Look up the weather for a city.", "Returns the current weather.", "Current weather for a place."),
    "time": ("Get the current time in a timezone.", "Get the current time in a given timezone.",
             "Look up the local time for a timezone.", "Returns the current time.", "Current time for a timezone."),
}
PARAM_DOCS = {"weather": ("The city name", "Name of the city"), "time": ("An IANA timezone", "The timezone name")}
EXTRA_ENUMS = {"weather": ("unit", ("celsius", "fahrenheit")), "time": ("format", ("24h", "12h"))}
INSTRUCTOR_DOC = "Correctly extracted `{name}` with all the required parameters with correct types"
# Tools that fit none of the questions: listed beside the one that fits, or alone (then no call).
DISTRACTORS = (
    ("search_web", ("query",), "Search the web for a query."),
    ("get_stock_price", ("symbol",), "Get the latest price of a stock."),
    ("send_email", ("to", "body"), "Send an email."),
    ("translate_text", ("text", "target_language"), "Translate text into another language."),
    ("get_news", ("topic",), "Get the latest news on a topic."),
    ("lookup_user", ("user_id",), "Find a user by id."),
)
_VERBS = ("get", "get", "fetch", "lookup", "check", "query", "read", "show", "")
_MIDS = {"weather": ("", "", "current", "local", "live"), "time": ("", "", "current", "local")}
_SUFFIXES = ("", "", "", "now", "info", "tool", "data", "report")


@dataclass(frozen=True)
class Style:
    """How one framework writes a schema; every tool in a conversation shares it."""

    pydantic: bool = False  # keys sorted as pydantic sorts them, else "type", "properties", "required"
    titles: bool = False  # "title": "City" on each parameter
    required: bool = True
    strict: bool = False  # the Agents SDK: "<name>_args" title, additionalProperties false, "strict": true
    doc: str = "doc"  # "doc", "llama" (signature, newline, doc), "llama_quoted", "instructor", "none", "null"
    pascal: bool = False  # class names (instructor): GetWeather
    param_docs: bool = False
    enum: bool = False  # a second, optional enum parameter (unit, format)
    sorted_wrapper: bool = False  # every key sorted, as Jinja's own tojson prints them


PRESETS = {
    "rill": Style(),
    "langchain": Style(pydantic=True),
    "llm": Style(pydantic=True),
    "openai_agents": Style(pydantic=True, titles=True, strict=True),
    "llama_index": Style(pydantic=True, titles=True, doc="llama"),
    # the same, for functions defined under `from __future__ import annotations`: (city: 'str') -> 'str'
    "llama_index_future": Style(pydantic=True, titles=True, doc="llama_quoted"),
    "instructor": Style(pydantic=True, titles=True, doc="instructor", pascal=True),
    "no_required": Style(pydantic=True, titles=True, required=False),
    "enum_unit": Style(pydantic=True, enum=True),
}


def preset_tool(preset: str, kind: str) -> tuple[str, str, str]:
    """(name, parameter, description) of the test functions as each framework names them:
    get_weather(city) / get_time(timezone), instructor's pydantic classes GetWeather / GetTime, and
    the OpenAI docs' get_current_weather(location, unit) beside the enum."""
    if preset == "instructor":
        return ("GetWeather" if kind == "weather" else "GetTime"), PARAMS[kind][0], DOCS[kind][0]
    if preset == "enum_unit":
        return f"get_current_{kind}", ("location" if kind == "weather" else "timezone"), DOCS[kind][1]
    return f"get_{kind}", PARAMS[kind][0], DOCS[kind][0]


@dataclass(frozen=True)
class Toolbox:
    tools: tuple[dict, ...] = ()
    fits: dict[str, tuple[str, str]] = field(default_factory=dict)  # kind -> (tool name, parameter)

    def call_for(self, kind: str) -> tuple[str, str] | None:
        return self.fits.get(kind)


def style_name(name: str, pascal: bool, camel: bool = False) -> str:
    parts = [p for p in name.split("_") if p]
    if pascal:
        return "".join(p.capitalize() for p in parts)
    if camel:
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    return "_".join(parts)


def sample_name(rng: random.Random, kind: str, style: Style, verb: str | None = None, suffix: str | None = None,
                camel: bool | None = None) -> str:
    """A name a developer might give the tool: get_weather, fetch_local_weather_now, CurrentTime..."""
    verb = rng.choice(_VERBS) if verb is None else verb
    suffix = rng.choice(_SUFFIXES) if suffix is None else suffix
    words = (verb, rng.choice(_MIDS[kind]), kind, suffix)
    name = "_".join(w for w in words if w)
    camel = rng.random() < 0.15 if camel is None else camel
    return style_name(name, style.pascal, camel=not style.pascal and camel)


def look_alike_names(rng: random.Random, kinds: Sequence[str], style: Style) -> dict[str, str]:
    """Weather and time tools named alike (show_weather beside show_time): the call must copy the
    kind's word and the verb from the schema, not from habit (held-out misses were show_weather
    for get_weather and GetTime for GetWeather)."""
    verb, suffix, camel = rng.choice(_VERBS[:-1]), rng.choice(_SUFFIXES), rng.random() < 0.15
    return {kind: sample_name(rng, kind, style, verb, suffix, camel) for kind in kinds}


def sample_style(rng: random.Random) -> Style:
    """Half the time a framework's exact shape, else any mix of the options."""
    if rng.random() < 0.5:
        return PRESETS[rng.choice(list(PRESETS))]
    pydantic = rng.random() < 0.7
    return Style(
        pydantic=pydantic, titles=pydantic and rng.random() < 0.5, required=rng.random() < 0.8,
        strict=rng.random() < 0.25,
        doc=rng.choice(("doc", "doc", "doc", "llama", "llama_quoted", "instructor", "none", "null")),
        pascal=rng.random() < 0.2, param_docs=rng.random() < 0.2, enum=rng.random() < 0.2,
        sorted_wrapper=rng.random() < 0.1,
    )


def function_tool(name: str, params: Sequence[str], doc: str | None, style: Style, *,
                  param_docs: Sequence[str] = (), enum: tuple[str, Sequence[str]] | None = None) -> dict:
    """One {"type": "function", "function": {...}} entry in the style's shape."""
    properties = {p: _property(p, style, param_docs[i] if i < len(param_docs) else None) for i, p in enumerate(params)}
    if enum:
        properties[enum[0]] = _enum_property(enum[0], enum[1], style)
    required = list(params) + ([enum[0]] if enum and style.strict else [])
    parameters = _parameters(name, properties, required, style)
    function = {"name": name}
    if style.doc != "none":
        function["description"] = _description(name, params, doc, style)
    function["parameters"] = parameters
    if style.strict:
        function["strict"] = True
    tool = {"type": "function", "function": function}
    return _sorted_keys(tool) if style.sorted_wrapper else tool


def tool_for(rng: random.Random, kind: str, style: Style, chosen: tuple[str, str, str] | None = None,
             name: str | None = None) -> tuple[dict, str, str]:
    """The weather or time tool in this style: (schema, name, the parameter a call fills); `chosen`
    fixes (name, parameter, description), `name` only the name, else they are drawn."""
    if chosen is None and name is not None:
        param = rng.choice(PARAMS[kind][:2]) if rng.random() < 0.8 else rng.choice(PARAMS[kind])
        chosen = (name, param, rng.choice(DOCS[kind]))
    if chosen is None and style.enum and rng.random() < 0.5:  # the OpenAI docs' get_current_weather(location, unit)
        chosen = (style_name(f"get_current_{kind}", style.pascal), ("location" if kind == "weather" else "timezone"),
                  DOCS[kind][1])
    if chosen is None and rng.random() < 0.4:  # the names and docstrings of the common examples
        name = style_name(rng.choice((f"get_{kind}", f"get_current_{kind}")), style.pascal)
        chosen = (name, rng.choice(PARAMS[kind][:2]), rng.choice(DOCS[kind][:2]))
    if chosen is None:
        # city and location (timezone and tz) about equally: the call must copy the schema's name, not a habit
        param = rng.choice(PARAMS[kind][:2]) if rng.random() < 0.8 else rng.choice(PARAMS[kind])
        chosen = (sample_name(rng, kind, style), param, rng.choice(DOCS[kind]))
    name, param, doc = chosen
    docs = [rng.choice(PARAM_DOCS[kind])] if style.param_docs else []
    enum = EXTRA_ENUMS[kind] if style.enum else None
    return function_tool(name, (param,), doc, style, param_docs=docs, enum=enum), name, param


def distractor(rng: random.Random, style: Style) -> dict:
    name, params, doc = rng.choice(DISTRACTORS)
    return function_tool(style_name(name, style.pascal), params, doc, style)


def sample_toolbox(rng: random.Random, kinds: Sequence[str], num_distractors: int, style: Style | None = None,
                   chosen: dict[str, tuple[str, str, str]] | None = None) -> Toolbox:
    """The fitting tools for `kinds` plus distractors, in a random order."""
    style = style or sample_style(rng)
    entries, fits = [], {}
    alike = look_alike_names(rng, kinds, style) if chosen is None and len(kinds) > 1 and rng.random() < 0.5 else {}
    for kind in kinds:
        tool, name, param = tool_for(rng, kind, style, (chosen or {}).get(kind), alike.get(kind))
        entries.append(tool)
        fits[kind] = (name, param)
    taken = {t["function"]["name"] for t in entries}
    for _ in range(num_distractors):
        tool = distractor(rng, style)
        if tool["function"]["name"] not in taken:
            taken.add(tool["function"]["name"])
            entries.append(tool)
    rng.shuffle(entries)
    return Toolbox(tuple(entries), fits)


def _property(param: str, style: Style, doc: str | None) -> dict:
    if not style.pydantic:
        return {"type": "string", "description": doc} if doc else {"type": "string"}
    prop = {"description": doc} if doc else {}
    if style.titles:
        prop["title"] = style_name(param, pascal=False).replace("_", " ").title()
    prop["type"] = "string"
    return prop


def _enum_property(param: str, values: Sequence[str], style: Style) -> dict:
    if not style.pydantic:
        return {"type": "string", "enum": list(values)}
    prop = {"default": values[0], "enum": list(values)}
    if style.titles:
        prop["title"] = param.title()
    prop["type"] = "string"
    return prop


def _parameters(name: str, properties: dict, required: list[str], style: Style) -> dict:
    if not style.pydantic:
        parameters = {"type": "object", "properties": properties}
        if style.required:
            parameters["required"] = required
        if style.strict:
            parameters["additionalProperties"] = False
        return parameters
    parameters = {"properties": properties}
    if style.required:
        parameters["required"] = required
    if style.strict:
        parameters["title"] = f"{name}_args"
    parameters["type"] = "object"
    if style.strict:
        parameters["additionalProperties"] = False
    return parameters


def _description(name: str, params: Sequence[str], doc: str, style: Style) -> str | None:
    if style.doc == "null":
        return None
    if style.doc == "llama":
        return f"{name}({', '.join(f'{p}: str' for p in params)}) -> str\n{doc}"
    if style.doc == "llama_quoted":
        return f"{name}({', '.join(f'{p}: {chr(39)}str{chr(39)}' for p in params)}) -> 'str'\n{doc}"
    if style.doc == "instructor":
        return INSTRUCTOR_DOC.format(name=name)
    return doc


def _sorted_keys(value):
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    return value


# -- tool results --------------------------------------------------------------------------------

WEATHER_KEYS = (("temperature_c", "condition"), ("city", "temperature_c", "condition"), ("temperature", "unit", "condition"))
TIME_KEYS = (("time", "timezone"), ("timezone", "time"), ("current_time",))
RESULT_FORMS = ("json", "json", "compact", "repr", "plain")


def weather_result(rng: random.Random, city: str, temperature_c: int, condition: str, form: str | None = None) -> str:
    form = form or rng.choice(RESULT_FORMS)
    if form == "plain":
        return rng.choice((f"{temperature_c}°C and {condition}", f"{condition.capitalize()}, {temperature_c}°C"))
    values = {"city": city, "temperature_c": temperature_c, "temperature": temperature_c, "unit": "celsius", "condition": condition}
    return serialize({k: values[k] for k in rng.choice(WEATHER_KEYS)}, form)


def time_result(rng: random.Random, zone: str, time: str, form: str | None = None) -> str:
    form = form or rng.choice(RESULT_FORMS)
    if form == "plain":
        return time
    values = {"time": time, "timezone": zone, "current_time": time}
    return serialize({k: values[k] for k in rng.choice(TIME_KEYS)}, form)


def serialize(value: dict, form: str) -> str:
    """json: Python's json.dumps; compact: JavaScript's JSON.stringify; repr: str(dict)."""
    if form == "compact":
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if form == "repr":
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def fixed_texts() -> list[str]:
    """Every word the schemas can show, for the held-out word check."""
    style = Style(pydantic=True, titles=True, strict=True, doc="llama", param_docs=True, enum=True)
    texts = [json.dumps(function_tool(n, p, d, style)) for n, p, d in DISTRACTORS]
    for kind in KINDS:
        texts += [*DOCS[kind], *PARAM_DOCS[kind], *PARAMS[kind], *_MIDS[kind], *EXTRA_ENUMS[kind][1], EXTRA_ENUMS[kind][0]]
    return texts + [*_VERBS, *_SUFFIXES, INSTRUCTOR_DOC, *WEATHER_KEYS[1], *WEATHER_KEYS[2], *TIME_KEYS[2]]
