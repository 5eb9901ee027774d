"""Storms, faults and peers' known attacks: many clients leaving at random points, a model that
fails with every kind of client live, a slow reader, cancellations among concurrent requests, a
realtime stream past the context length, invalid UTF-8 in a WebSocket frame. Afterwards nothing
is left: no running request, no KV block, no session, no realtime connection."""

from __future__ import annotations

import json
import random
import threading
from functools import partial

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, parse_sse, running_server, wait_for  # noqa: F401
from rill.sessions import StreamingInputConfig
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig
from rill.transports.realtime.quart_route import realtime_hub

HI = [{"role": "user", "content": "hi"}]
SESSIONS = "/v1/streaming_input/sessions"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2-64"), "qwen2", max_position_embeddings=64)


def nothing_left(server) -> bool:
    core, state = server.engine.core, server.app.extensions["rill"]
    return (server.all_kv_free and not core.requests and not core.sessions and state.sessions.num_open == 0
            and realtime_hub(server.app).num_connections == 0 and server.serving.num_awaiting_first_token == 0)


async def cut_stream(client: httpx.AsyncClient, frames_before_cut: int, path: str, body: dict) -> None:
    async with client.stream("POST", path, json=body) as response:
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data:")
            if seen >= frames_before_cut:
                return  # leaving the block drops the connection with the stream unread


async def abandoned_session(client: httpx.AsyncClient, rng: random.Random) -> None:
    created = await client.post(SESSIONS, json={"messages": HI, "max_tokens": 8})
    session_id = created.json()["session_id"]
    for sequence_id in range(rng.randrange(3)):
        await client.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": sequence_id, "payload": " more"})
    if rng.random() < 0.5:
        await client.delete(f"{SESSIONS}/{session_id}")  # else it expires


async def dropped_realtime(url: str, rng: random.Random) -> None:
    async with open_websocket_url(url) as ws:
        await ws.get_message()  # session.created
        await ws.send_message(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
        await ws.send_message(json.dumps({"type": "response.create", "response": {"max_output_tokens": 200}}))
        for _ in range(rng.randrange(1, 6)):
            await ws.get_message()
    # the connection closes mid-response


async def test_storm_of_cut_streams_abandoned_sessions_and_dropped_realtime_leaves_nothing(model_dir):
    rng = random.Random(0)
    config = ServerConfig(streaming_input=StreamingInputConfig(session_timeout_s=1.0))
    async with running_server(model_dir, config) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=200)) as client:
        ws_url = server.url.replace("http", "ws") + "/v1/realtime"
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    path = "/v1/chat/completions" if i % 2 else "/v1/completions"
                    body = {"max_tokens": 60, "ignore_eos": True, "stream": True,
                            **({"messages": HI} if i % 2 else {"prompt": "hello"})}
                    nursery.start_soon(cut_stream, client, rng.randrange(1, 40), path, body)
                for _ in range(30):
                    nursery.start_soon(abandoned_session, client, random.Random(rng.random()))
                for _ in range(20):
                    nursery.start_soon(dropped_realtime, ws_url, random.Random(rng.random()))
        await wait_for(lambda: nothing_left(server), seconds=30)
        metrics = (await client.get("/metrics")).text
        assert "rill_realtime_connections_open 0.0" in metrics and "rill_streaming_sessions_open 0.0" in metrics
        assert (await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2})).status_code == 200


async def test_cancelling_10_of_100_concurrent_requests_leaves_the_90_exact(model_dir):
    body = {"prompt": "hello", "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    async with running_server(model_dir) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=200)) as client:
        alone = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        answers: list[dict] = []

        async def complete() -> None:
            answers.append((await client.post("/v1/completions", json=body)).json())

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                cancel_scopes = []
                for i in range(100):
                    scope = trio.CancelScope()
                    if i % 10 == 0:
                        cancel_scopes.append(scope)

                    async def run(scope=scope) -> None:
                        with scope:
                            await complete()

                    nursery.start_soon(run)
                await trio.sleep(0.05)
                for scope in cancel_scopes:
                    scope.cancel()
        assert len(answers) >= 90
        for answer in answers:
            assert answer["usage"]["completion_tokens"] == 12 and answer["choices"][0]["text"] == alone
        await wait_for(lambda: nothing_left(server), seconds=30)


class InjectedFault(RuntimeError):
    """Fault injection: raised by the model runner on purpose, to kill the engine mid-step."""


async def test_a_model_fault_with_streams_sessions_and_realtime_live_errors_each_and_hangs_none(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        runner, fail = server.engine.core.runner, threading.Event()
        real_execute = runner.execute

        def execute_with_injected_fault(*args, **kwargs):
            if fail.is_set():
                raise InjectedFault("injected fault in the model runner")
            return real_execute(*args, **kwargs)

        runner.execute = execute_with_injected_fault
        session_id = (await client.post(SESSIONS, json={"messages": HI, "max_tokens": 300,
                                                        "ignore_eos": True})).json()["session_id"]
        outcomes: dict[str, str] = {}

        async def sse() -> None:
            raw = ""
            body = {"messages": HI, "max_tokens": 400, "ignore_eos": True, "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for text in response.aiter_text():
                    raw += text
                    if '"content"' in raw:
                        fail.set()
            outcomes["sse"] = parse_sse(raw)[-1].event

        async def mode_b() -> None:
            await client.post(f"{SESSIONS}/{session_id}/finish")
            result = await client.get(f"{SESSIONS}/{session_id}/result")
            while result.status_code == 202:  # still answering
                await trio.sleep(0.05)
                result = await client.get(f"{SESSIONS}/{session_id}/result")
            outcomes["mode_b"] = result.json().get("error", {}).get("type", "no error")

        async def realtime() -> None:
            async with open_websocket_url(server.url.replace("http", "ws") + "/v1/realtime") as ws:
                await ws.get_message()
                await ws.send_message(json.dumps({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
                await ws.send_message(json.dumps({"type": "response.create", "response": {
                    "max_output_tokens": 400}}))
                # The answer fails (response.done, failed) if it started before the fault; if the engine
                # was already dead when response.create arrived, the create itself is an error event.
                while (event := json.loads(await ws.get_message()))["type"] not in ("response.done", "error"):
                    pass
                outcomes["realtime"] = (event["response"]["status"] if event["type"] == "response.done"
                                        else event["error"]["code"])

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(realtime)
                nursery.start_soon(mode_b)
                nursery.start_soon(sse)
        assert outcomes["sse"] == "error"
        assert outcomes["mode_b"] == "server_error"
        assert outcomes["realtime"] in ("failed", "engine_dead")
        assert (await client.get("/health")).status_code == 503


async def test_a_slow_reader_does_not_hold_the_engine_or_the_others(model_dir):
    async with running_server(model_dir) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as slow, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as others:
        body = {"messages": HI, "max_tokens": 300, "ignore_eos": True, "stream": True}
        async with slow.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.aiter_lines()
            while '"content"' not in await anext(lines):
                pass
            # The slow client reads nothing more while eight others run to the end.
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for _ in range(8):
                        nursery.start_soon(partial(others.post, "/v1/completions",
                                                   json={"prompt": "hi", "max_tokens": 20, "ignore_eos": True}))
            # ... and the engine finished the slow one's 300 tokens too: it never waited on its reader.
            await wait_for(lambda: not server.engine.core.requests, seconds=60)
            rest = [line async for line in lines]
        assert rest[-1] == "data: [DONE]" or rest[-2] == "data: [DONE]"


async def test_realtime_stream_past_the_context_ends_the_response_with_an_error_and_the_engine_lives(
        short_model_dir):
    async with running_server(short_model_dir) as server:
        async with open_websocket_url(server.url.replace("http", "ws") + "/v1/realtime") as ws:
            await ws.get_message()
            with trio.fail_after(60):
                errors = []
                for _ in range(40):  # far past 64 tokens
                    await ws.send_message(json.dumps({"type": "input_text_buffer.append", "delta": " word"}))
                    with trio.move_on_after(0.05):
                        while True:
                            event = json.loads(await ws.get_message())
                            if event["type"] == "error" or (event["type"] == "response.done"
                                                            and event["response"]["status"] == "failed"):
                                errors.append(event)
                    if errors:
                        break
                assert errors, "no error for input past the context length"
        assert server.engine.is_alive
        async with httpx.AsyncClient(base_url=server.url) as client:
            answer = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
            assert answer.status_code == 200
        await wait_for(lambda: nothing_left(server), seconds=10)


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_invalid_utf8_in_a_websocket_text_frame_closes_that_connection_only(model_dir, listener):
    """RFC 6455 8.1: the endpoint fails the connection (hypercorn closes TCP without a close frame;
    trio-websocket sends 1007). Either way that connection ends and the server serves the next."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request
    from wsproto.frame_protocol import Opcode

    config = ServerConfig(realtime=RealtimeConfig(ws_port=0))
    async with running_server(model_dir, config) as server:
        url = server.url.replace("http", "ws") + "/v1/realtime" if listener == "http" else server.ws_url
        host, port = url.removeprefix("ws://").split("/")[0].split(":")
        stream = await trio.open_tcp_stream(host, int(port))
        client = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(client.send(Request(host=host, target="/v1/realtime")))
        with trio.fail_after(10):
            while not any(isinstance(e, AcceptConnection) for e in client.events()):
                client.receive_data(await stream.receive_some())
            # A masked text frame whose payload is not UTF-8, built by hand (wsproto will not send one).
            payload, mask = b"\xff\xfe{", b"\x01\x02\x03\x04"
            frame = bytes([0x80 | Opcode.TEXT, 0x80 | len(payload)]) + mask + bytes(
                b ^ mask[i % 4] for i, b in enumerate(payload))
            await stream.send_all(frame)
            while await stream.receive_some():  # until the server ends the connection
                pass
        await stream.aclose()
        await wait_for(lambda: realtime_hub(server.app).num_connections == 0)
        async with open_websocket_url(url) as ws:
            assert json.loads(await ws.get_message())["type"] == "session.created"


@pytest.mark.parametrize("error", [trio.BusyResourceError, trio.BrokenResourceError])
async def test_fault_injected_ping_that_meets_the_close_ends_the_keepalive_not_the_listener(error):
    """hypercorn's close sends EOF outside its send lock, so a ping racing it raised BusyResourceError
    in the connection's task group, which took the whole listener down (CI saw it after invalid UTF-8).
    Fault injected: the stream's send raises as a socket mid-close does."""
    from types import SimpleNamespace

    from rill.transports import hypercorn_ws

    async def send_raises(event):
        raise error("another task is currently sending data on this SocketStream")

    stream = SimpleNamespace(config=SimpleNamespace(websocket_ping_interval=0.05), _send_wsproto_event=send_raises)
    with trio.fail_after(5):
        await hypercorn_ws._send_pings(stream)  # returns; nothing propagates


async def test_an_endless_ndjson_body_is_cut_at_the_session_payload_cap(model_dir):
    """Mode A: an upload past the session's payload cap is refused with 413 when the cap is crossed;
    the server reads (and drops) the rest for at most 5 s so the connection can be reused
    (rill.transports.keepalive), and nothing is left behind."""
    config = ServerConfig(streaming_input=StreamingInputConfig(max_payload_bytes_per_session=1024))
    async with running_server(model_dir, config) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sent = 0

        async def endless():
            nonlocal sent
            yield json.dumps({"messages": HI, "max_tokens": 4}).encode() + b"\n"
            for sequence_id in range(100_000):  # bounded: ~4 MB, far past the cap
                sent += 1
                yield json.dumps({"sequence_id": sequence_id, "payload": " words" * 6}).encode() + b"\n"

        with trio.fail_after(60):
            response = await client.post("/v1/chat/completions", content=endless(),
                                          headers={"content-type": "application/x-ndjson"})
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "session_payload_too_large"
        assert sent > 0
        await wait_for(lambda: nothing_left(server), seconds=10)


async def test_a_websocket_message_flood_is_answered_in_order_and_leaves_nothing(model_dir):
    """5,000 events sent as fast as the client can: the bounded inbox holds the sender back (TCP
    backpressure), every event is answered, and the connection and the server stay healthy."""
    async with running_server(model_dir) as server:
        async with open_websocket_url(server.url.replace("http", "ws") + "/v1/realtime") as ws:
            await ws.get_message()  # session.created
            n = 5000
            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    async def flood():
                        for i in range(n):
                            await ws.send_message(json.dumps({"type": "input_text_buffer.clear", "event_id": f"e{i}"}))

                    nursery.start_soon(flood)
                    answers = 0
                    while answers < n:
                        event = json.loads(await ws.get_message())
                        answers += event["type"] in ("input_text_buffer.cleared", "error")
        await wait_for(lambda: nothing_left(server), seconds=10)
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/health")).status_code == 200
