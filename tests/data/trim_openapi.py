"""Cut OpenAI's openapi.yaml down to the four operations rill shares with it, and the realtime events.

    python tests/data/trim_openapi.py FULL_OPENAPI.yaml COMMIT > tests/data/openai-openapi.yaml

Keeps POST /chat/completions, POST /completions, GET /models and GET /models/{model}, every
component they reference (recursively), and drops prose (description, examples, x-* keys) so the
pinned copy stays small. Schemas are left exactly as the spec writes them.
"""

from __future__ import annotations

import sys

import yaml

OPERATIONS = {"/chat/completions": "post", "/completions": "post", "/models": "get", "/models/{model}": "get"}
# Schemas kept with everything they reference, though no kept operation names them: the realtime
# server events (tests/test_realtime_spec_events.py validates a scripted session against them).
SCHEMAS = ("RealtimeServerEvent",)
PROSE = ("description", "summary", "title")


def strip_prose(node):
    if isinstance(node, dict):
        return {k: strip_prose(v) for k, v in node.items() if not _is_prose(k, v)}
    if isinstance(node, list):
        return [strip_prose(v) for v in node]
    return node


def _is_prose(key: str, value) -> bool:
    """x-* extensions, examples and prose; a *property* may itself be named `description` or
    `title`, and then its value is a schema (a dict), which stays."""
    return key.startswith("x-") or key in ("example", "examples") or (key in PROSE and isinstance(value, str))


def refs(node):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for v in node.values():
            yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def trim(spec: dict, commit: str) -> dict:
    paths = {path: {method: spec["paths"][path][method]} for path, method in OPERATIONS.items()}
    components: dict[str, dict] = {}
    todo = list(refs(paths)) + [f"#/components/schemas/{name}" for name in SCHEMAS]
    while todo:
        ref = todo.pop()
        _, _, kind, name = ref.split("/")
        if name in components.setdefault(kind, {}):
            continue
        components[kind][name] = spec["components"][kind][name]
        todo.extend(refs(components[kind][name]))
    components["securitySchemes"] = spec["components"]["securitySchemes"]
    info = {"title": spec["info"]["title"], "version": spec["info"]["version"],
            "description": f"Trimmed from openai/openai-openapi@{commit} openapi.yaml by tests/data/trim_openapi.py"}
    out = {"openapi": spec["openapi"], "info": info, "servers": spec["servers"], "security": spec["security"],
           "paths": paths, "components": {k: dict(sorted(v.items())) for k, v in components.items()}}
    out = strip_prose(out)
    out["info"] = info  # title is required there, and the description names the source
    return out


def main() -> None:
    source, commit = sys.argv[1], sys.argv[2]
    with open(source) as f:
        spec = yaml.safe_load(f)
    print(f"# OpenAI's OpenAPI spec, trimmed: openai/openai-openapi, commit {commit}, openapi.yaml.")
    print("# Upstream: https://github.com/openai/openai-openapi/blob/" + commit + "/openapi.yaml")
    print("# Regenerate with tests/data/trim_openapi.py; do not edit by hand.")
    print(yaml.safe_dump(trim(spec, commit), sort_keys=False, allow_unicode=True, width=120), end="")


if __name__ == "__main__":
    main()
