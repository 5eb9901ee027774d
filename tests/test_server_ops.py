"""The server as an operator sees it: disconnects free KV, concurrent streams stay exact,
/v1/models, /health, /metrics, /tokenize, one log line per request, forced tool calls, the
app's own engine lifecycle, and `rill serve` shutting down gracefully on SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio
from websockets.sync.client import connect as ws_connect
from hypercorn.trio import serve

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, parse_sse, running_server, wait_for  # noqa: F401
from rill.config import EngineConfig
from rill.server import hypercorn_config
from rill.transports.http import ServerConfig, create_app

HI = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


async def test_disconnect_mid_stream_aborts_and_frees_kv(model_dir, caplog):
    caplog.set_level(logging.INFO, logger="rill.server")
    body = {"messages": HI, "max_tokens": 500, "ignore_eos": True, "stream": True}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.aiter_lines()
            while '"content"' not in await anext(lines):
                pass
            assert not server.all_kv_free
        # Leaving the block closes the connection with the body unread.
        await wait_for(lambda: server.all_kv_free and not server.engine.core.requests, seconds=5)
        # The live counters (the per-step snapshot is not refreshed once the engine goes idle).
        assert server.engine.core.stats.num_aborted == 1
        assert server.engine.core.stats.num_generation_tokens < 500
    (line,) = [r.getMessage() for r in caplog.records if r.name == "rill.server"]
    assert "status=499" in line  # nginx's "client closed request"


async def test_32_concurrent_streams_each_equal_its_greedy_output_alone(model_dir):
    prompts = [[{"role": "user", "content": f"Question {i}: " + "why " * (i % 7)}] for i in range(32)]
    params = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        alone = []
        for messages in prompts:
            response = await client.post("/v1/chat/completions", json={"messages": messages, **params})
            alone.append(response.json()["choices"][0]["message"]["content"])
        together: dict[int, str] = {}

        async def one(i: int) -> None:
            body = {"messages": prompts[i], "stream": True, **params}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                frames = parse_sse((await response.aread()).decode())
            assert frames[-1].data == "[DONE]"
            together[i] = "".join(f.json["choices"][0]["delta"].get("content", "") for f in frames[:-1])

        async with trio.open_nursery() as nursery:
            for i in range(32):
                nursery.start_soon(one, i)
        assert server.engine.stats.num_running == 0 or server.all_kv_free
    assert [together[i] for i in range(32)] == alone
    assert len(set(alone)) > 1


async def test_models_health_metrics_and_tokenize(model_dir):
    async with running_server(model_dir, ServerConfig(served_model_names=["tiny", "alias"])) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["tiny", "alias"] and models["object"] == "list"
        assert models["data"][0]["max_model_len"] == 1024
        assert (await client.post("/v1/chat/completions", json={"model": "alias", "messages": HI,
                                                                "max_tokens": 4})).status_code == 200
        health = await client.get("/health")
        assert health.status_code == 200
        metrics = (await client.get("/metrics")).text
        tok = server.engine.tokenizer
        ids = (await client.post("/tokenize", json={"prompt": "Hello world"})).json()
        chat_ids = (await client.post("/tokenize", json={"messages": HI})).json()
        text = (await client.post("/detokenize", json={"tokens": ids["tokens"]})).json()
    assert sample(metrics, "rill_generation_tokens_total") >= 4
    assert sample(metrics, "rill_prompt_tokens_total") > 5
    assert sample(metrics, "rill_time_to_first_token_seconds_count") >= 1
    assert sample(metrics, "rill_e2e_request_latency_seconds_count") >= 1
    assert sample(metrics, "rill_inter_token_latency_seconds_count") >= 3
    assert sample(metrics, 'rill_http_requests_total{endpoint="/v1/chat/completions",status="200"}') == 1
    for name in ("rill_num_requests_running", "rill_num_requests_waiting", "rill_kv_cache_usage_ratio",
                 "rill_prefix_cache_hit_rate"):
        assert sample(metrics, name) >= 0
    assert ids == {"tokens": tok.encode("Hello world"), "count": len(ids["tokens"]), "max_model_len": 1024}
    assert chat_ids["tokens"] == tok.encode_chat(HI)
    assert text == {"prompt": "Hello world"}


def sample(metrics_text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", metrics_text, re.MULTILINE)
    assert match, f"{name} is not in /metrics"
    return float(match[1])


async def test_one_log_line_per_request(model_dir, caplog):
    caplog.set_level(logging.INFO, logger="rill.server")
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 3, "ignore_eos": True})
        await client.post("/v1/chat/completions", json={"messages": HI, "temperature": "x"})
        async with client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True}) as response:
            await response.aread()
    lines = [r.getMessage() for r in caplog.records if r.name == "rill.server"]
    assert len(lines) == 3, lines
    ok, bad, streamed = lines
    assert "status=200" in ok and "generated_tokens=3" in ok and "ttft_ms=" in ok and "total_ms=" in ok
    assert "status=400" in bad and "ttft_ms=-" in bad
    assert "/v1/completions status=200" in streamed


async def test_requests_that_make_no_trace_log_one_line_each(model_dir, caplog):
    """Unknown routes, 405s, 401s, Mode A refused at line 1 and plain routes log too, once."""
    caplog.set_level(logging.INFO, logger="rill.server")
    key = {"Authorization": "Bearer k"}
    async with running_server(model_dir, ServerConfig(api_key="k")) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.post("/v1/no-such-route", json={"input": "x"}, headers=key)).status_code == 404
        assert (await client.put("/v1/chat/completions", json={}, headers=key)).status_code == 405
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/v1/models", headers=key)).status_code == 200
        ndjson = {**key, "Content-Type": "application/x-ndjson"}
        assert (await client.post("/v1/chat/completions", content=b"not json\n", headers=ndjson)).status_code == 400
        await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1}, headers=key)
    lines = [r.getMessage() for r in caplog.records if r.name == "rill.server"]
    assert [line.split(" total_ms=")[0] for line in lines[:5]] == [
        "POST /v1/no-such-route status=404", "PUT /v1/chat/completions status=405", "GET /v1/models status=401",
        "GET /v1/models status=200", "POST /v1/chat/completions status=400"]
    assert len(lines) == 6 and " /v1/chat/completions status=200 prompt_tokens=" in lines[5]


async def test_sigterm_after_a_closed_realtime_session_stops_at_once(model_dir, tmp_path):
    """hypercorn's ping task used to sleep out its interval after the close, and shutdown waited."""
    flags = ["--shutdown-grace-s", "60", "--ws-ping-interval-s", "60"]
    async with rill_serve_process(model_dir, tmp_path, flags) as (process, url, stderr_path):
        assert await trio.to_thread.run_sync(_one_realtime_session, url) == "session.created"
        await wait_for(lambda: "closed" in stderr_path.read_text())
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):  # the grace and the ping interval are 60 s
            assert await process.wait() == 0, stderr_path.read_text()


class InjectedFault(RuntimeError):
    """Fault injection: raised by the model runner on purpose, to kill the engine mid-stream."""


async def test_serve_exits_1_when_the_engine_dies_after_erroring_the_stream_in_flight(model_dir, monkeypatch):
    """A supervisor must see the death: serve() returns exit status 1 (rill serve exits with it)."""
    from rill.engine.model_runner import ModelRunner
    from rill.server import serve as rill_serve

    real_execute, fail = ModelRunner.execute, threading.Event()

    def execute_with_injected_fault(self, *args, **kwargs):
        if fail.is_set():
            raise InjectedFault("injected fault in the model runner")
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "execute", execute_with_injected_fault)
    config = EngineConfig(model=str(model_dir), num_kv_blocks=64)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            status = []

            async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
                status.append(await rill_serve(config, ServerConfig(), "127.0.0.1", 0, 30.0,
                                               shutdown_trigger=trio.sleep_forever, task_status=task_status))

            binds = await nursery.start(run_server)
            body = {"messages": HI, "max_tokens": 400, "ignore_eos": True, "stream": True}
            raw = ""
            async with httpx.AsyncClient(base_url=binds[0]) as client:
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    async for text in response.aiter_text():
                        raw += text
                        if '"content"' in raw:
                            fail.set()
    assert parse_sse(raw)[-1].event == "error"
    assert status == [1]


async def test_sigint_with_an_idle_keep_alive_connection_stops_at_once(model_dir, tmp_path):
    async with rill_serve_process(model_dir, tmp_path, ["--shutdown-grace-s", "60"]) as (process, url, stderr_path):
        async with httpx.AsyncClient(base_url=url) as client:  # its connection stays open, idle
            await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            process.send_signal(signal.SIGINT)
            with trio.fail_after(30):  # the grace is 60 s
                assert await process.wait() == 0, stderr_path.read_text()


def _one_realtime_session(url: str) -> str:
    with ws_connect(url.replace("http", "ws") + "/v1/realtime") as ws:
        return json.loads(ws.recv())["type"]


async def test_named_tool_choice_streams_the_call_name_first(model_dir):
    body = {"messages": [{"role": "user", "content": "Weather in Tokyo?"}], "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "temperature": 0, "max_tokens": 12, "ignore_eos": True}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            frames = parse_sse((await response.aread()).decode())
        whole = (await client.post("/v1/chat/completions", json=body)).json()
    deltas = [f.json["choices"][0]["delta"] for f in frames[1:-1]]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    first = calls[0]
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["name"] == "get_weather"
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls[1:])
    arguments = "".join(c["function"].get("arguments", "") for c in calls)
    # A forced call is constrained to the tool's parameter schema (structured outputs), so even a
    # random model's arguments are a JSON object that validates, streamed and not.
    choice = whole["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"]), dict) and isinstance(json.loads(arguments), dict)
    assert frames[-2].json["choices"][0]["finish_reason"] == "tool_calls"


async def test_app_opens_its_own_engine_for_its_lifetime(model_dir, caplog):
    """create_app(config) alone, as `hypercorn 'rill.transports.http:create_app()'` would run it."""
    caplog.set_level(logging.INFO)
    app = create_app(EngineConfig(model=str(model_dir), num_kv_blocks=64), ServerConfig())
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            config = hypercorn_config("127.0.0.1", 0, 1.0)
            binds = await nursery.start(partial(serve, app, config, shutdown_trigger=stop.wait))
            async with httpx.AsyncClient(base_url=binds[0]) as client:
                assert (await client.get("/health")).status_code == 200
                response = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
                assert response.json()["usage"]["completion_tokens"] <= 3
            stop.set()  # a graceful stop runs the app's shutdown, which closes its engine
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_rill_serve_finishes_streams_in_flight_on_sigterm_and_exits_0(model_dir, tmp_path):
    async with rill_serve_process(model_dir, tmp_path, ["--shutdown-grace-s", "30"]) as (process, url, stderr_path):
        body = {"messages": HI, "max_tokens": 40, "ignore_eos": True, "stream": True}
        raw, signalled = "", False
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for text in response.aiter_text():
                    raw += text
                    if '"content"' in raw and not signalled:  # once: a second signal stops at once
                        process.send_signal(signal.SIGTERM)
                        signalled = True
        with trio.fail_after(30):
            code = await process.wait()
    frames = parse_sse(raw)
    assert frames[-1].data == "[DONE]" and frames[-2].json["choices"][0]["finish_reason"] == "length"
    assert code == 0, stderr_path.read_text()
    assert "SIGTERM" in stderr_path.read_text()


@asynccontextmanager
async def rill_serve_process(model_dir, tmp_path, flags: list[str]):
    """`rill serve` as a subprocess on a free port: yields (process, url, stderr path); killed after."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rill", "serve", str(model_dir), "--port", "0", "--num-kv-blocks", "64", *flags]
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:
        process = await trio.lowlevel.open_process(command, stderr=stderr, stdout=subprocess.DEVNULL,
                                                   cwd=tmp_path, env=env)
        try:
            yield process, await _bound_url(stderr_path, process), stderr_path
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def _bound_url(stderr_path, process) -> str:
    with trio.fail_after(60):
        while True:
            match = re.search(r"serving .* at (http://127\.0\.0\.1:\d+)", stderr_path.read_text())
            if match:
                return match[1]
            assert process.returncode is None, stderr_path.read_text()
            await trio.sleep(0.05)
