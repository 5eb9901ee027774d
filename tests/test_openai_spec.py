"""rill's answers against OpenAI's own OpenAPI spec (a pinned, trimmed copy in tests/data, made by
tests/data/trim_openapi.py): real answers from a live server, validated with jsonschema against
the spec's component schemas; and (slow) a bounded schemathesis run over the four operations rill
shares with the spec: no 5xx, no hang, and 200 answers that conform.

The spec is an OpenAPI 3.1 document that still writes some nullable fields the 3.0 way
(`nullable: true`, which JSON Schema 2020-12 ignores): a chunk's `finish_reason: null`, which OpenAI
itself sends, would fail. `openapi_to_json_schema` reads `nullable` as OpenAI means it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest
import trio
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, parse_sse, running_server  # noqa: F401
from rill.transports.http import ServerConfig

SPEC_PATH = Path(__file__).parent / "data" / "openai-openapi.yaml"
HI = [{"role": "user", "content": "What is 17 + 25?"}]
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}


def openapi_to_json_schema(node):
    """`{..., nullable: true}` -> `{anyOf: [{...}, {type: null}]}`, everywhere in the document."""
    if isinstance(node, list):
        return [openapi_to_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@pytest.fixture(scope="module")
def spec() -> dict:
    with open(SPEC_PATH) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def validate(spec):
    """validate(component name, instance): raise if the instance breaks the spec's schema."""
    registry = Registry().with_resource("urn:openai", Resource(openapi_to_json_schema(spec), DRAFT202012))

    def check(name: str, instance) -> None:
        schema = {"$ref": f"urn:openai#/components/schemas/{name}"}
        jsonschema.Draft202012Validator(schema, registry=registry).validate(instance)

    return check


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


def test_the_pinned_spec_names_its_source_and_holds_the_four_shared_operations(spec):
    header = SPEC_PATH.read_text().splitlines()[0]
    assert "openai/openai-openapi" in header and "commit" in header
    operations = {(path, method) for path, methods in spec["paths"].items() for method in methods}
    assert operations == {("/chat/completions", "post"), ("/completions", "post"), ("/models", "get"),
                          ("/models/{model}", "get")}


def test_the_validator_rejects_a_message_without_refusal(validate):
    message = {"role": "assistant", "content": "hi", "refusal": None}
    validate("ChatCompletionResponseMessage", message)
    with pytest.raises(jsonschema.ValidationError):
        validate("ChatCompletionResponseMessage", {"role": "assistant", "content": "hi"})


async def test_chat_answers_and_every_stream_chunk_conform(model_dir, validate):
    body = {"model": str(model_dir), "messages": HI, **GREEDY, "n": 2, "logprobs": True, "top_logprobs": 2}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/chat/completions", json=stream) as response:
            frames = parse_sse((await response.aread()).decode())
    validate("CreateChatCompletionResponse", whole)
    assert frames[-1].data == "[DONE]"
    for frame in frames[:-1]:
        validate("CreateChatCompletionStreamResponse", frame.json)
    assert frames[-2].json["usage"]["completion_tokens"] == 12


async def test_a_chat_answer_with_a_tool_call_conforms(model_dir, validate):
    # A random model writes no tool call: the assistant's final message holds one, continued and echoed.
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    body = {"model": str(model_dir), "messages": [*HI, {"role": "assistant", "content": call}], "tools": [tool],
            "echo": True, "continue_final_message": True, "add_generation_prompt": False, **GREEDY}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            frames = parse_sse((await response.aread()).decode())
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    validate("CreateChatCompletionResponse", whole)
    for frame in frames[:-1]:
        validate("CreateChatCompletionStreamResponse", frame.json)


async def test_completion_answers_conform(model_dir, validate):
    body = {"model": str(model_dir), "prompt": ["Hello world", "Goodbye"], **GREEDY, "logprobs": 2}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        plain = (await client.post("/v1/completions", json=body)).json()
        echoed = (await client.post("/v1/completions", json={**body, "echo": True})).json()
    validate("CreateCompletionResponse", plain)
    # The echoed prompt's first token has no logprob: OpenAI and vLLM send null there, where the
    # spec's columns say number. The rest of the answer must conform.
    for choice in echoed["choices"]:
        lp = choice["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        for name in ("token_logprobs", "top_logprobs"):
            lp[name] = lp[name][1:]
    validate("CreateCompletionResponse", echoed)


async def test_models_and_model_retrieval_conform(model_dir, validate):
    async with running_server(model_dir, ServerConfig(served_model_names=["rill-test"])) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        listed = (await client.get("/v1/models")).json()
        card = (await client.get("/v1/models/rill-test")).json()
    validate("ListModelsResponse", listed)
    validate("Model", card)
    assert listed["data"] == [card]


@pytest.mark.parametrize("method, path, body, status", [
    ("POST", "/v1/chat/completions", {"messages": "nope"}, 400),
    ("POST", "/v1/chat/completions", {"model": "no-such-model", "messages": HI}, 404),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
    ("POST", "/v1/completions", b"{not json", 400),
    ("GET", "/v1/models/no-such-model", None, 404),
    ("GET", "/v1/no-such-route", None, 404),
    ("DELETE", "/v1/models/rill-test", None, 405),
])
async def test_error_bodies_conform(model_dir, validate, method, path, body, status):
    async with running_server(model_dir, ServerConfig(served_model_names=["rill-test"])) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        content = body if isinstance(body, bytes) else None
        response = await client.request(method, path, json=None if content else body, content=content)
    assert response.status_code == status
    validate("ErrorResponse", response.json())


# -- schemathesis -----------------------------------------------------------------------------------------------

MAX_EXAMPLES = 8  # per operation and phase
RUN_TIMEOUT_S = 480  # the whole run; past it, something hangs


def served_spec(spec: dict, model: str, path: Path) -> Path:
    """The spec as rill serves it, so that generated requests reach generation: each request's `model`
    is the served name (any other is a 404 before anything else runs), and a completion's `prompt`
    is not null (the spec's null means OpenAI's "<|endoftext|>"; rill, like vLLM, answers 400, and
    schemathesis draws null for most prompts). Negative cases still send other values there."""
    spec = json.loads(json.dumps(spec))
    schemas = spec["components"]["schemas"]
    for name in ("CreateChatCompletionRequest", "CreateCompletionRequest"):
        for part in [schemas[name], *schemas[name].get("allOf", [])]:
            if "model" in part.get("properties", {}):
                part["properties"]["model"] = {"type": "string", "enum": [model]}
    schemas["CreateCompletionRequest"]["properties"]["prompt"].pop("nullable")
    # An echoed prompt's first token has no logprob: OpenAI and vLLM send null in both columns there.
    columns = schemas["CreateCompletionResponse"]["properties"]["choices"]["items"]["properties"]["logprobs"]
    for name in ("token_logprobs", "top_logprobs"):
        item = columns["anyOf"][0]["properties"][name]
        item["items"] = {"anyOf": [item["items"], {"type": "null"}]}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.slow
async def test_schemathesis_finds_no_server_error_and_no_nonconforming_answer(spec, tmp_path):
    """rill-tiny, with a short context so that every generated request ends soon; schemathesis runs
    its coverage and fuzzing phases, positive and negative, over the four shared operations."""
    schemathesis = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert schemathesis, "schemathesis is in the test extra"
    location = served_spec(spec, "rill-tiny", tmp_path / "openapi.yaml")
    har = tmp_path / "run.har.json"
    async with running_server("rill-tiny", max_model_len=256, num_kv_blocks=512) as server:
        command = [schemathesis, "run", str(location), "--url", server.v1, "--max-examples", str(MAX_EXAMPLES),
                   # One worker: hypothesis parses lambda sources with `ast`, which is not thread-safe on
                   # Python 3.11 ("AST constructor recursion depth mismatch" from a second worker).
                   "--phases", "coverage,fuzzing", "--mode", "all", "--workers", "1", "--seed", "29",
                   "--checks", "not_a_server_error,response_schema_conformance", "--request-timeout", "60",
                   "--report", "har", "--report-har-path", str(har)]
        with trio.fail_after(RUN_TIMEOUT_S):
            # cwd: schemathesis keeps a crash cache (.schemathesis/) in its working directory.
            result = await trio.run_process(command, capture_stdout=True, stderr=subprocess.STDOUT, check=False,
                                            cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})
    output = result.stdout.decode(errors="replace")
    assert result.returncode == 0, output[-6000:]
    entries = json.loads(har.read_text())["log"]["entries"]
    statuses = [entry["response"]["status"] for entry in entries]
    print(f"schemathesis: {len(statuses)} requests, {statuses.count(200)} answered 200, "
          f"{sum(s >= 500 for s in statuses)} 5xx; by operation and status: {_by_operation(entries)}")
    assert statuses.count(200) >= 20 and not any(s >= 500 for s in statuses)


def _by_operation(entries: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in entries:
        path = entry["request"]["url"].split("/v1", 1)[1]
        key = f"{entry['request']['method']} {'/models/{model}' if path.startswith('/models/') else path} " \
              f"{entry['response']['status']}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
