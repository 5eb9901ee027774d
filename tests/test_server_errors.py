"""Requests the server must refuse, and how: OpenAI's error shape with the status, the field at
fault and a code, always before a stream starts; failures after it started arrive as an SSE
error event (a fault injected into the model runner, named as such)."""

from __future__ import annotations

import threading

import httpx
import pytest

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, parse_sse, running_server, wait_for  # noqa: F401
from rill.transports.http import ServerConfig

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


def assert_error(response: httpx.Response, status: int, param=None, code=None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


BAD_CHATS = [
    ({"temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({"n": 0}, "n"),
    ({"top_p": 2}, "top_p"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stop": [""]}, "stop"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "strng"}}}},
     "response_format.json_schema.schema"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
]


async def test_bad_fields_are_400_naming_the_field_before_any_stream(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        for stream in (False, True):
            for fields, param in BAD_CHATS:
                body = {"messages": HI, "stream": stream, **fields}
                response = await client.post("/v1/chat/completions", json=body)
                assert_error(response, 400, param)
        missing = await client.post("/v1/chat/completions", json={"model": str(model_dir)})
        assert_error(missing, 400, "messages", "missing_required_parameter")
        broken = await client.post("/v1/chat/completions", content=b'{"messages": [', headers={
            "content-type": "application/json"})
        assert_error(broken, 400, None, "invalid_json")
        bad_ids = await client.post("/v1/completions", json={"prompt": [1, 2, 10**6]})
        assert_error(bad_ids, 400, "prompt")
        mixed = await client.post("/v1/completions", json={"prompt": ["a", [1, 2]]})
        assert_error(mixed, 400, "prompt")
        assert server.serving.num_awaiting_first_token == 0 and server.all_kv_free


async def test_unknown_fields_are_ignored(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        body = {"messages": HI, "max_tokens": 2, "some_vendor_field": {"x": 1}, "user": "u1"}
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


async def test_unknown_model_is_404(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        for path, body in (("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "x"})):
            response = await client.post(path, json={"model": "gpt-9", **body})
            error = assert_error(response, 404, "model", "model_not_found")
            assert "gpt-9" in error["message"]


async def test_unknown_route_and_wrong_method_use_the_error_shape(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        assert_error(await client.get("/v1/nothing"), 404)
        assert_error(await client.get("/v1/chat/completions"), 405)


async def test_too_long_prompt_is_400_with_the_numbers_even_when_streaming(model_dir):
    async with running_server(model_dir, max_model_len=256) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        long_chat = [{"role": "user", "content": "the quick brown fox " * 200}]
        for stream in (False, True):
            response = await client.post("/v1/chat/completions", json={"messages": long_chat, "stream": stream})
            error = assert_error(response, 400, "messages", "context_length_exceeded")
            assert "256" in error["message"] and "tokens" in error["message"]
        too_many = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 300,
                                                                    "stream": True})
        error = assert_error(too_many, 400, "max_tokens", "context_length_exceeded")
        assert "256" in error["message"] and "300" in error["message"]
        prompt = await client.post("/v1/completions", json={"prompt": list(range(3, 300))})
        assert_error(prompt, 400, "prompt", "context_length_exceeded")


async def test_api_key_guards_v1_and_tokenize_but_not_health_or_metrics(model_dir):
    server_config = ServerConfig(api_key="sekret")
    async with running_server(model_dir, server_config) as server, httpx.AsyncClient(base_url=server.url) as client:
        assert_error(await client.get("/v1/models"), 401, None, "invalid_api_key")
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401, None, "invalid_api_key")
        assert_error(await client.post("/tokenize", json={"prompt": "x"}), 401)
        assert_error(await client.post("/v1/chat/completions", json={"messages": HI}), 401)
        good = {"Authorization": "Bearer sekret"}
        assert (await client.get("/v1/models", headers=good)).status_code == 200
        assert (await client.post("/tokenize", json={"prompt": "x"}, headers=good)).status_code == 200
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200


async def test_body_over_the_limit_is_413(model_dir):
    server_config = ServerConfig(max_body_bytes=2048)
    async with running_server(model_dir, server_config) as server, httpx.AsyncClient(base_url=server.url) as client:
        big = [{"role": "user", "content": "x" * 4096}]
        assert_error(await client.post("/v1/chat/completions", json={"messages": big}), 413)
        small = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
        assert small.status_code == 200


async def test_requests_past_max_waiting_get_429_with_retry_after(model_dir):
    # One running slot: A runs, B waits for its first token, C is one too many.
    server_config = ServerConfig(max_waiting=1)
    long = {"messages": HI, "max_tokens": 400, "ignore_eos": True, "stream": True}
    async with running_server(model_dir, server_config, max_num_seqs=1) as server, \
            httpx.AsyncClient(base_url=server.url) as a_client, httpx.AsyncClient(base_url=server.url) as b_client:
        async with a_client.stream("POST", "/v1/chat/completions", json=long) as a:
            lines = a.aiter_lines()
            while '"content"' not in await anext(lines):
                pass
            async with b_client.stream("POST", "/v1/chat/completions", json=long) as b:
                assert b.status_code == 200
                await wait_for(lambda: server.serving.num_awaiting_first_token == 1)
                async with httpx.AsyncClient(base_url=server.url) as c_client:
                    c = await c_client.post("/v1/chat/completions", json={"messages": HI})
                assert_error(c, 429, None, "too_many_waiting_requests")
                assert c.json()["error"]["type"] == "rate_limit_error"
                assert int(c.headers["retry-after"]) >= 1
        await wait_for(lambda: server.all_kv_free and server.serving.num_awaiting_first_token == 0)


class InjectedFault(RuntimeError):
    """Fault injection: raised by the model runner on purpose, to kill the engine mid-stream."""


async def test_engine_failure_mid_stream_is_an_sse_error_event_then_503(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        runner = server.engine.core.runner
        real_execute, fail = runner.execute, threading.Event()

        def execute_with_injected_fault(*args, **kwargs):
            if fail.is_set():
                raise InjectedFault("injected fault in the model runner")
            return real_execute(*args, **kwargs)

        runner.execute = execute_with_injected_fault
        body = {"messages": HI, "max_tokens": 400, "ignore_eos": True, "stream": True}
        raw = ""
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for text in response.aiter_text():
                raw += text
                if '"content"' in raw:
                    fail.set()
        assert response.status_code == 200
        frames = parse_sse(raw)
        assert frames[0].json["choices"][0]["delta"] == {"role": "assistant"}
        assert frames[-1].event == "error" and all(f.data != "[DONE]" for f in frames)
        error = frames[-1].json["error"]
        assert "InjectedFault" in error["message"] and error["type"] == "server_error"
        assert_error(await client.get("/health"), 503)
        assert_error(await client.post("/v1/chat/completions", json={"messages": HI}), 503, None, "engine_dead")
