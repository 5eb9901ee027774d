"""Input a careless or hostile client sends: each gets a 4xx in OpenAI's shape (or a realtime
`error` event), never a 5xx, and the server goes on answering. Also: /metrics is current when an
idle engine's only request is aborted."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import httpx
import pytest
import trio
import trio_websocket

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig

HI = [{"role": "user", "content": "hi"}]
DEEP = 5000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


def assert_error(response: httpx.Response, status: int, param=None, code=None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and (code is None or error["code"] == code)
    return error


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_json_nested_past_the_decoder_depth_is_400_on_every_route(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize",
                     "/v1/streaming_input/sessions"):
            body = f'{{"x": {nested(DEEP)}}}'
            error = assert_error(await client.post(path, content=body, headers={"content-type": "application/json"}),
                                 400, code="invalid_json")
            assert "nested too deeply" in error["message"]
        assert (await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1})).status_code == 200


async def test_deep_tool_call_arguments_are_kept_as_text_not_a_500(model_dir):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": nested(DEEP)}}
    messages = [*HI, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        response = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
        assert response.status_code in (200, 400), response.text


async def test_detokenize_ids_outside_the_vocabulary_are_400_naming_the_first(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        vocab = server.serving.vocab_size
        assert_error(await client.post("/detokenize", json={"tokens": [1, 10**12, -4]}), 400, "tokens[1]")
        assert_error(await client.post("/detokenize", json={"tokens": [-4]}), 400, "tokens[0]")
        assert_error(await client.post("/detokenize", json={"tokens": [vocab]}), 400, "tokens[0]")
        assert (await client.post("/detokenize", json={"tokens": [0, vocab - 1]})).status_code == 200


async def test_n_is_capped_by_max_num_seqs_at_the_limit_and_past_it(model_dir):
    async with running_server(model_dir, max_num_seqs=4) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        at = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1, "n": 4})
        assert at.status_code == 200 and len(at.json()["choices"]) == 4
        error = assert_error(await client.post("/v1/chat/completions", json={"messages": HI, "n": 5}), 400, "n")
        assert "--max-num-seqs" in error["message"]
        assert_error(await client.post("/v1/completions", json={"prompt": "hi", "n": 100000}), 400, "n")


async def test_realtime_event_nested_past_the_decoder_depth_is_an_error_event(model_dir):
    server_config = ServerConfig(realtime=RealtimeConfig(ws_port=0, ping_interval_s=None))
    async with running_server(model_dir, server_config) as server:
        for url in (server.url.replace("http", "ws") + "/v1/realtime", server.ws_url + "/v1/realtime"):
            async with trio_websocket.open_websocket_url(url) as ws:
                assert json.loads(await ws.get_message())["type"] == "session.created"
                await ws.send_message(f'{{"type": "session.update", "session": {nested(DEEP)}}}')
                error = json.loads(await ws.get_message())
                assert error["type"] == "error" and error["error"]["code"] == "invalid_json"
                await ws.send_message(json.dumps({"type": "session.update", "session": {}}))
                assert json.loads(await ws.get_message())["type"] == "session.updated"  # still serving


def gauge(metrics_text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", metrics_text, re.MULTILINE)
    assert match, f"{name} is not in /metrics"
    return float(match[1])


async def test_metrics_gauges_are_current_after_an_abort_on_an_idle_engine(model_dir):
    body = {"messages": HI, "max_tokens": 500, "ignore_eos": True, "stream": True}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.aiter_lines()
            while '"content"' not in await anext(lines):
                pass
        await wait_for(lambda: server.all_kv_free and not server.engine.core.requests, seconds=5)

        async def settled() -> bool:
            text = (await client.get("/metrics")).text
            return (gauge(text, "rill_num_requests_running") == 0
                    and gauge(text, "rill_kv_cache_free_blocks") == gauge(text, "rill_kv_cache_blocks"))

        for _ in range(100):  # no other request makes the engine step meanwhile
            if await settled():
                break
            await trio.sleep(0.05)
        assert await settled()


async def _raw_get(port: int, target: bytes, host: bytes = b"127.0.0.1") -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    return data.split(b"\r\n", 1)[0]


async def test_crafted_paths_and_hosts_do_not_slip_past_the_api_key(model_dir):
    async with running_server(model_dir, ServerConfig(api_key="sekret")) as server:
        port = int(server.url.rsplit(":", 1)[1])
        for target in (b"/v1/models", b"/v1/models?x", b"//v1/models", b"/v1%2Fmodels", b"/./v1/models",
                       b"/v1/../v1/models", b"/V1/models", b"/health/../v1/models", b"/tokenize",
                       b"/v1/streaming_input/sessions", b"/nowhere"):
            status = await _raw_get(port, target)
            assert b" 200 " not in status + b" ", (target, status)
        assert b" 401 " in await _raw_get(port, b"/v1/models", host=b"evil.example")
        assert b" 200 " in await _raw_get(port, b"/health")


def test_key_comparison_hashes_both_sides_so_length_does_not_matter():
    from rill.transports.api_keys import bearer_matches

    assert bearer_matches("Bearer sekret", "sekret")
    for given in ("", "Bearer", "Bearer sekre", "Bearer sekretX", "bearer sekret", "Bearer " + "s" * 10000):
        assert not bearer_matches(given, "sekret")


async def _read_all(stream, seconds: float) -> bytes:
    data = b""
    with trio.fail_after(seconds):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_slow_headers_are_cut_off_at_the_keep_alive_timeout(model_dir):
    async with running_server(model_dir, ServerConfig(keep_alive_timeout_s=0.5)) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert await _read_all(stream, 10) == b""  # closed by the server, well before 10 s
        await stream.aclose()


async def test_a_body_dribbled_byte_by_byte_is_a_408_at_the_body_timeout(model_dir):
    body = json.dumps({"messages": HI, "max_tokens": 1}).encode()
    async with running_server(model_dir, ServerConfig(body_timeout_s=1.0)) as server:
        stream = await trio.open_tcp_stream("127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        answer = b""
        with trio.move_on_after(15):
            for byte in body:  # one byte every 0.2 s: the whole body would take about 14 s
                await stream.send_all(bytes([byte]))
                with trio.move_on_after(0.2):
                    answer += await stream.receive_some(65536)
                if answer:
                    break
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        await stream.aclose()
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/health")).status_code == 200


async def test_headers_at_the_limit_pass_and_past_it_are_431(model_dir):
    async with running_server(model_dir, ServerConfig(max_header_bytes=16 << 10)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/health", headers={"x-pad": "a" * (12 << 10)})).status_code == 200
        port = int(server.url.rsplit(":", 1)[1])
        for headers in (b"x-pad: " + b"a" * (64 << 10) + b"\r\n", b"".join(b"x-%d: 1\r\n" % i for i in range(10000))):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
            assert (await _read_all(stream, 10)).startswith(b"HTTP/1.1 431")
            await stream.aclose()
        assert (await client.get("/health")).status_code == 200


def _burst(port: int, n: int, hold_loop_s: float):
    """Open n connections at once (from a thread) while the server's event loop is held (a synchronous
    sleep in it, as a busy loop would be), each sending one request; return the sockets (filled as
    they connect) and the thread."""
    import socket
    import threading
    import time

    socks: list[socket.socket] = []

    def connect_all():
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            socks.append(s)

    opener = threading.Thread(target=connect_all)
    opener.start()
    time.sleep(hold_loop_s)  # nothing is accepted meanwhile: the kernel's queue holds them
    return socks, opener


async def _answers(socks) -> list[bytes]:
    def read(s):
        data = b""
        try:
            while len(data) < 12:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:  # a reset: the queue was full
            data = repr(exc).encode()
        s.close()
        return data[:12]

    return [await trio.to_thread.run_sync(read, s) for s in socks]


async def test_a_burst_of_connections_while_the_loop_is_busy_is_all_answered(model_dir):
    """The accept queue (ServerConfig.backlog, default 2048) holds every connection made while the
    event loop is busy; hypercorn's own default (100) made 256 clients connecting at once get resets."""
    async with running_server(model_dir) as server:
        port = int(server.url.rsplit(":", 1)[1])
        socks, opener = _burst(port, 300, 1.0)
        await trio.to_thread.run_sync(opener.join, 30)
        assert len(socks) == 300
        answers = await _answers(socks)
        assert answers == [b"HTTP/1.1 200"] * 300, sorted(set(answers))


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss to read a listening socket's queue")
@pytest.mark.parametrize("backlog", [None, 64])
async def test_the_listen_queue_is_the_configured_backlog(model_dir, backlog):
    somaxconn = int(open("/proc/sys/net/core/somaxconn").read())
    want = min(2048 if backlog is None else backlog, somaxconn)
    server_config = ServerConfig() if backlog is None else ServerConfig(backlog=backlog)
    async with running_server(model_dir, server_config) as server:
        port = server.url.rsplit(":", 1)[1]
        listing = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=10)
        assert [int(line.split()[2]) for line in listing.stdout.splitlines()] == [want], listing.stdout
