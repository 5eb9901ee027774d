"""A request after an early error answer on the same keep-alive connection gets its answer.

Under hypercorn's trio worker an answer given before the request body arrived (404, 405, an early
413) used to leave the connection half-closed, and the next request on it hung forever
(rill.transports.keepalive says why). These tests repeat the sequences users hit, enough times
to catch a 1-in-4 race, and pin the deterministic cases with a raw socket that holds the body
back until after the answer is due.
"""

from __future__ import annotations

import httpx
import openai
import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.transports import keepalive
from rill.transports.http import ServerConfig

HI = [{"role": "user", "content": "hi"}]
REPEATS = 24  # a 1-in-4 hang survives 24 tries with probability 0.1%


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


async def test_sdk_404_then_chat_on_one_connection_never_hangs(model_dir):
    """The openai SDK in a thread of its own, as a client process would be, racing the server."""

    def sequence(base_url: str) -> str | None:
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3.0) as client:
            with pytest.raises(openai.NotFoundError):
                client.embeddings.create(model="m", input="hello")
            chat = client.chat.completions.create(model=str(model_dir), messages=HI, max_tokens=1)
            return chat.choices[0].finish_reason

    async with running_server(model_dir) as server:
        for _ in range(REPEATS):
            assert await trio.to_thread.run_sync(sequence, server.v1) == "length"


async def test_405_then_post_with_httpx_never_hangs(model_dir):
    def sequence(base_url: str) -> int:
        with httpx.Client(base_url=base_url, timeout=3.0) as client:
            assert client.put("/v1/chat/completions", json={"a": 1}).status_code == 405
            return client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1}).status_code

    async with running_server(model_dir) as server:
        for _ in range(REPEATS):
            assert await trio.to_thread.run_sync(sequence, server.url) == 200


async def test_mode_b_413_then_next_request_on_the_same_client(model_dir):
    config = ServerConfig(max_body_bytes=1 << 20)
    async with running_server(model_dir, config) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=5.0) as client:
        created = await client.post("/v1/streaming_input/sessions", json={"messages": HI})
        session_id = created.json()["session_id"]
        for sequence_id in range(6):
            chunk = {"sequence_id": sequence_id, "payload": "x" * (2 << 20)}
            refused = await client.post(f"/v1/streaming_input/sessions/{session_id}/chunks", json=chunk)
            assert refused.status_code == 413
            assert (await client.get("/v1/models")).status_code == 200


async def _raw_exchange(port: int, head: bytes, body: bytes, hold_s: float, stream=None):
    """Send `head`, wait `hold_s`, send `body`; return the status line and the stream."""
    stream = stream or await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(head)
    await trio.sleep(hold_s)
    await stream.send_all(body)
    return await _read_response(stream), stream


async def _read_response(stream) -> tuple[bytes, dict[bytes, bytes]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return b"EOF", {}
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines)}
    while len(rest) < int(headers.get(b"content-length", b"0")):
        rest += await stream.receive_some(65536)
    return status, headers


def _post(path: str, body: bytes, method: str = "POST") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()


async def test_body_that_arrives_after_a_405_keeps_the_connection_usable(model_dir):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    async with running_server(model_dir) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with trio.fail_after(20):
            (status, headers), stream = await _raw_exchange(port, _post("/v1/chat/completions", body, "PUT"),
                                                            body, hold_s=0.2)
            assert status.startswith(b"HTTP/1.1 405") and headers.get(b"connection") != b"close"
            (status, _), _ = await _raw_exchange(port, _post("/v1/chat/completions", body), body, 0, stream)
            assert status.startswith(b"HTTP/1.1 200")  # the same socket: the connection was reused
            await stream.aclose()


async def test_a_body_too_large_to_wait_for_is_answered_with_connection_close(model_dir, monkeypatch):
    monkeypatch.setattr(keepalive, "DRAIN_MAX_BYTES", 16)
    monkeypatch.setattr(keepalive, "DRAIN_UNREAD_MAX_BYTES", 16)  # a 404's body is one no handler asked for
    body = b'{"input": "a body longer than sixteen bytes"}'
    async with running_server(model_dir) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with trio.fail_after(20):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(_post("/v1/no-such-route", body))
            status, headers = await _read_response(stream)
            assert status.startswith(b"HTTP/1.1 404") and headers[b"connection"] == b"close"
            assert await stream.receive_some(1024) == b""  # closed by the server, not left hanging
            await stream.aclose()


async def test_a_connection_idle_as_long_as_a_client_pool_keeps_one_is_still_served(model_dir):
    """httpx, and so the openai SDK, reuses a pooled connection idle up to its keepalive_expiry (5 s), and a
    busy client sends later than its own clock says. With the server's keep-alive timeout equal to it (the
    old 5 s), such a request met a connection closed under it: "Server disconnected without sending a
    response" or a reset, seen at 256 streaming clients. The default now outlasts it: a request on the same
    socket half a second past the pool's expiry is answered."""
    idle_s = httpx.Limits().keepalive_expiry + 0.5  # the default pool's expiry, 5 s
    assert ServerConfig().keep_alive_timeout_s > idle_s
    get_models = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with running_server(model_dir) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with trio.fail_after(20):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(get_models)
            assert (await _read_response(stream))[0].startswith(b"HTTP/1.1 200")
            await trio.sleep(idle_s)
            await stream.send_all(get_models)
            assert (await _read_response(stream))[0].startswith(b"HTTP/1.1 200")  # the same socket
            await stream.aclose()


def test_the_cli_and_the_server_config_agree_on_the_keep_alive_default(monkeypatch):
    from rill.cli import build_parser

    monkeypatch.delenv("RILL_KEEP_ALIVE_TIMEOUT_S", raising=False)
    args = build_parser().parse_args(["serve"])
    assert args.keep_alive_timeout_s == ServerConfig().keep_alive_timeout_s == ServerConfig.from_env().keep_alive_timeout_s
