"""Property-based fuzzing of every parser that takes untrusted bytes, through a live server.

hypothesis generates request bodies for each endpoint (JSON shaped like the real requests, with
wrong types, nulls, huge numbers and unknown keys, and raw bytes), NDJSON bodies for Mode A, Mode B
chunks and realtime events. The property, for each: the answer is a 2xx or a 4xx in OpenAI's error
shape (a realtime `error` event), never a 5xx, never a hang, and the server goes on answering.

The server runs in a thread of its own (its own trio run) for the whole module, so hypothesis can
drive it with plain blocking clients; max_model_len is small so that any accepted request ends fast.
"""

from __future__ import annotations

import json
import threading
from functools import partial
from urllib.parse import quote

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect as ws_connect

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.transports.http import ServerConfig

EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
TIMEOUT_S = 30.0

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                    st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
small_ints = st.integers(-3, 300)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                           "content": st.one_of(st.text(max_size=30), json_values)}),
                    max_size=3)
SAMPLING = {"max_tokens": st.one_of(small_ints, json_values), "temperature": st.one_of(st.floats(-1, 3), json_values),
            "top_p": st.floats(-1, 2), "top_k": small_ints, "n": st.integers(-1, 3), "stream": st.booleans(),
            "logprobs": st.one_of(st.booleans(), small_ints), "top_logprobs": small_ints, "seed": json_values,
            "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=5)),
            "logit_bias": st.dictionaries(st.text(max_size=6), json_values, max_size=3),
            "stream_options": json_values, "tools": json_values, "tool_choice": json_values,
            "response_format": json_values, "echo": st.booleans(), "model": st.text(max_size=10),
            "unknown_field": json_values}


def bodies(required: dict) -> st.SearchStrategy:
    """Dicts with the required keys (usually well typed) and any of the sampling keys."""
    optional = st.fixed_dictionaries({}, optional=SAMPLING)
    return st.tuples(st.fixed_dictionaries(required), optional).map(lambda parts: {**parts[0], **parts[1]})


chat_bodies = bodies({"messages": st.one_of(messages, json_values)})
completion_bodies = bodies({"prompt": st.one_of(st.text(max_size=30), st.lists(small_ints, max_size=5), json_values)})
# /v1/responses: input items of every type the API names (and some it does not), in the shapes OpenAI
# sends and in wrong ones; tools in the flat form; the stored-response fields.
content_parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image",
                                                                         "x"])}, optional={"text": json_values}),
                         max_size=3)
input_items = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant", "tool"])},
                          optional={"type": st.just("message"), "content": st.one_of(st.text(max_size=30), content_parts),
                                    "id": st.text(max_size=8)}),
    st.fixed_dictionaries({"type": st.just("function_call")},
                          optional={"call_id": json_values, "name": json_values, "arguments": json_values}),
    st.fixed_dictionaries({"type": st.just("function_call_output")},
                          optional={"call_id": json_values, "output": json_values}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference", "nope"])},
                          optional={"summary": json_values, "id": json_values}),
    json_values), max_size=3)
flat_tools = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search", "x"])},
                                            optional={"name": st.text(max_size=8), "parameters": json_values,
                                                      "strict": json_values}), max_size=2)
RESPONSES = {"max_output_tokens": st.one_of(small_ints, json_values), "temperature": st.one_of(st.floats(-1, 3), json_values),
             "top_p": st.floats(-1, 2), "instructions": st.one_of(st.text(max_size=20), json_values),
             "tools": st.one_of(flat_tools, json_values), "tool_choice": json_values,
             "parallel_tool_calls": json_values, "text": json_values, "reasoning": json_values,
             "metadata": json_values, "user": json_values, "previous_response_id": st.one_of(st.text(max_size=12),
                                                                                            json_values),
             "store": st.one_of(st.booleans(), json_values), "background": st.booleans(), "stream": st.booleans(),
             "include": json_values, "truncation": json_values, "model": st.text(max_size=10),
             "unknown_field": json_values}
responses_bodies = st.tuples(st.fixed_dictionaries({"input": st.one_of(st.text(max_size=30), input_items, json_values)}),
                             st.fixed_dictionaries({}, optional=RESPONSES)).map(lambda parts: {**parts[0], **parts[1]})
raw_bodies = st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()))


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """A server on its own thread for the module; torch on one thread."""
    model_dir = make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2", max_position_embeddings=64)
    started, url, stop = threading.Event(), [], []

    async def main() -> None:
        config = ServerConfig(max_body_bytes=1 << 16)
        async with running_server(model_dir, config, max_num_seqs=8) as server:
            url.append(server.url)
            stop.append((trio.lowlevel.current_trio_token(), trio.Event()))
            started.set()
            await stop[0][1].wait()

    thread = threading.Thread(target=partial(trio.run, main), daemon=True)
    thread.start()
    assert started.wait(120)
    yield url[0]
    token, event = stop[0]
    token.run_sync_soon(event.set)
    thread.join(30)


@pytest.fixture(scope="module")
def client(server_url):
    with httpx.Client(base_url=server_url, timeout=TIMEOUT_S) as http:
        yield http


def check_answer(response: httpx.Response, client: httpx.Client) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert client.get("/health").status_code == 200


def post(client: httpx.Client, path: str, body, content_type: str = "application/json") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, content=content, headers={"content-type": content_type})


@EXAMPLES
@given(body=chat_bodies)
def test_fuzz_chat_completions(client, body):
    check_answer(post(client, "/v1/chat/completions", body), client)


@EXAMPLES
@given(body=completion_bodies)
def test_fuzz_completions(client, body):
    check_answer(post(client, "/v1/completions", body), client)


@EXAMPLES
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize",
                             "/v1/streaming_input/sessions", "/v1/responses"]), body=raw_bodies)
def test_fuzz_raw_bodies_on_every_json_route(client, path, body):
    check_answer(post(client, path, body), client)


@EXAMPLES
@given(first=chat_bodies, lines=st.lists(st.one_of(raw_bodies, json_values.map(lambda v: json.dumps(v).encode()),
                                                   st.fixed_dictionaries({"sequence_id": small_ints,
                                                                          "payload": json_values}).map(
                                                       lambda v: json.dumps(v).encode())), max_size=4))
def test_fuzz_mode_a_ndjson_bodies(client, first, lines):
    body = b"\n".join([json.dumps(first).encode(), *[line.replace(b"\n", b" ") for line in lines]]) + b"\n"
    check_answer(post(client, "/v1/chat/completions", body, "application/x-ndjson"), client)


@EXAMPLES
@given(body=responses_bodies)
def test_fuzz_responses(client, body):
    """Every body is answered; one answered 200 as JSON and stored can be read back."""
    response = post(client, "/v1/responses", body)
    check_answer(response, client)
    if response.status_code == 200 and response.headers["content-type"].startswith("application/json") \
            and response.json()["store"]:
        assert client.get(f"/v1/responses/{response.json()['id']}").status_code == 200


@EXAMPLES
@given(method=st.sampled_from(["GET", "DELETE"]), response_id=st.text(max_size=12),
       suffix=st.sampled_from(["", "/input_items", "/cancel"]),
       query=st.dictionaries(st.sampled_from(["stream", "starting_after", "limit", "order", "after", "include"]),
                             st.text(max_size=8), max_size=3))
def test_fuzz_stored_response_routes(client, method, response_id, suffix, query):
    method = "POST" if suffix == "/cancel" else method
    path = "/v1/responses/" + quote(response_id or "x", safe="") + suffix
    check_answer(client.request(method, path, params=query), client)


@pytest.fixture(scope="module")
def session_id(client):
    created = client.post("/v1/streaming_input/sessions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert created.status_code == 201, created.text
    return created.json()["session_id"]


@EXAMPLES
@given(chunk=st.one_of(json_values, st.fixed_dictionaries({"sequence_id": small_ints},
                                                          optional={"payload": json_values,
                                                                    "end_of_input": json_values,
                                                                    "modality": st.text(max_size=8)})),
       raw=st.booleans())
def test_fuzz_mode_b_chunks(client, session_id, chunk, raw):
    body = json.dumps(chunk).encode() if not raw else json.dumps(chunk).encode()[:-1]
    check_answer(post(client, f"/v1/streaming_input/sessions/{session_id}/chunks", body), client)


event_types = st.sampled_from(["session.update", "input_text_buffer.append", "input_text_buffer.commit",
                               "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear",
                               "conversation.item.create", "response.create", "response.cancel", "nope"])
events = st.one_of(
    st.tuples(event_types, st.dictionaries(st.sampled_from(["session", "item", "response", "delta", "audio",
                                                            "event_id", "text"]), json_values, max_size=3)).map(
        lambda parts: json.dumps({"type": parts[0], **parts[1]})),
    json_values.map(json.dumps), st.text(max_size=60))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(batch=st.lists(events, min_size=1, max_size=5))
def test_fuzz_realtime_events(server_url, client, batch):
    with ws_connect(server_url.replace("http", "ws") + "/v1/realtime", open_timeout=TIMEOUT_S) as ws:
        assert json.loads(ws.recv(timeout=TIMEOUT_S))["type"] == "session.created"
        for event in batch:
            ws.send(event)
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        while (answer := json.loads(ws.recv(timeout=TIMEOUT_S)))["type"] != "session.updated":
            if answer["type"] == "error":
                assert answer["error"]["type"] != "server_error", answer
    assert client.get("/health").status_code == 200
