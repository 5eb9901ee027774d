"""Clients that stop reading (issue 52, items 1 and 2): SSE streams whose reader never reads are
dropped once their output backs up past --max-stream-buffer-bytes, a write stalled past
--send-timeout-s closes its connection, and realtime connections that never read, or leave with
answers pending, are closed and counted out on both listeners. Real hostile clients on 127.0.0.1:
raw sockets with a small receive buffer (tests/helpers_hostile.py). SIGTERM with such clients is in
tests/test_shutdown_grace.py."""

from __future__ import annotations

import time

import httpx
import pytest
import trio

from helpers_hostile import RawRealtimeClient, post_and_never_read, rss_bytes
from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401
from rill.config import EngineConfig
from rill.engine.async_engine import SLOW_READER_ERROR, delta_bytes, open_engine
from rill.outputs import RequestDelta
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig
from rill.transports.realtime.quart_route import realtime_hub

LONG = 30_000  # tokens asked of each hostile stream: far more than any test waits for
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # endless: realtime answers (no ignore_eos there) never stop on their own
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral", endless=True, max_position_embeddings=32768)


def _stream_body(n: int) -> dict:
    return {"messages": HI, "max_tokens": LONG, "ignore_eos": True, "stream": True, "n": n}


async def _normal_chat_s(url: str) -> float:
    """Seconds a small chat request takes (the figure for everyone else during an attack)."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        response = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 4})
    assert response.status_code == 200, response.text
    return time.monotonic() - started


async def _read_until_closed(stream: trio.SocketStream, seconds: float) -> int:
    """Read what the server sent until it closes the connection (EOF or reset): bytes read."""
    total = 0
    with trio.fail_after(seconds):
        while True:
            try:
                data = await stream.receive_some(1 << 16)
            except trio.BrokenResourceError:  # reset: the server closed with our side unread
                return total
            if not data:
                return total
            total += len(data)


async def test_slow_sse_readers_are_dropped_past_the_stream_buffer_and_free_kv(model_dir):
    """Four clients ask n=4 long streams and never read. Before the fix every sequence ran on (and
    the process grew ~2.9 KB per unsent token); now each request is aborted once 256 KiB of its
    output waits, its KV freed, while a normal request is served in seconds."""
    config = ServerConfig(send_timeout_s=None)  # the buffer acts here, not the send timeout
    async with running_server(model_dir, config, num_kv_blocks=4096,
                              max_stream_buffer_bytes=256 << 10) as server:
        before = rss_bytes()
        hostile = [await post_and_never_read(server.url, "/v1/chat/completions", _stream_body(4)) for _ in range(4)]
        try:
            await wait_for(lambda: server.engine.core.requests, seconds=20)
            latency_s = await _normal_chat_s(server.url)
            # Figure: all 16 sequences aborted and every KV block free within 30 s of the attack.
            await wait_for(lambda: server.engine.num_slow_readers == 4 and not server.engine.core.requests
                           and server.all_kv_free, seconds=30)
            growth = rss_bytes() - before
        finally:
            for stream in hostile:
                await stream.aclose()
    assert latency_s < 10, f"a normal request took {latency_s:.1f} s during the attack"
    # 16.7 MB measured; before the fix, +82 MB in the same 30 s and growing (123,544 tokens generated)
    assert growth < 64 << 20, f"RSS grew {growth >> 20} MB"


async def test_a_write_stalled_past_the_send_timeout_closes_the_connection(model_dir):
    """No buffer bound: the 2 s send timeout alone ends a stream whose client stopped reading. Before
    the fix hypercorn's shielded write waited for the client forever."""
    config = ServerConfig(send_timeout_s=2.0)
    async with running_server(model_dir, config, max_stream_buffer_bytes=None) as server:
        stream = await post_and_never_read(server.url, "/v1/chat/completions", _stream_body(1))
        try:
            await wait_for(lambda: server.engine.core.requests, seconds=20)
            started = time.monotonic()
            # Figure: the request is aborted (its KV free) within 15 s of starting: the socket fills
            # within a few seconds, then the write waits 2 s.
            await wait_for(lambda: not server.engine.core.requests and server.all_kv_free, seconds=15)
            aborted_s = time.monotonic() - started
            await _read_until_closed(stream, seconds=10)  # what was in flight, then the close
        finally:
            await stream.aclose()
        assert server.engine.core.stats.num_aborted >= 1
    assert aborted_s < 15


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_realtime_clients_that_never_read_or_leave_are_closed_and_counted_out(model_dir, listener):
    """A client that asks for an answer, then writes events and reads nothing, is closed 2 s after the
    server's writes stall (before the fix: still open after 106 s); five that leave abruptly with
    answers pending release their slots, tasks and requests (rill_realtime_connections_open: 0)."""
    config = ServerConfig(send_timeout_s=2.0, realtime=RealtimeConfig(ws_port=0, send_timeout_s=2.0))
    async with running_server(model_dir, config, num_kv_blocks=1024) as server:
        hub = realtime_hub(server.app)
        url = server.url.replace("http://", "ws://") + "/v1/realtime" if listener == "http" else server.ws_url
        leavers = [await RawRealtimeClient.connect(url) for _ in range(5)]
        try:
            for client in leavers:
                await client.ask("hello " * 8, LONG)
            await wait_for(lambda: len(server.engine.core.requests) == 5, seconds=20)
            await trio.sleep(1.0)  # answers under way, waiting on full sockets
            for client in leavers[:3]:  # FIN, their sockets kept unread: the server's writes stall
                await client.half_close()
            for client in leavers[3:]:  # a reset: the server's writes fail
                await client.leave_abruptly()
            # Figure: all five counted out, their requests aborted, within 10 s (the send timeout is 2 s).
            await wait_for(lambda: hub.num_connections == 0 and not server.engine.core.requests, seconds=10)
        finally:
            for client in leavers[:3]:
                await client.leave_abruptly()

        writer = await RawRealtimeClient.connect(url)
        try:
            closed_s, num_sent = await _write_without_reading(writer, hub)
            # Figure: closed, its slot free and its request aborted within 20 s (the socket fills, then 2 s).
            await wait_for(lambda: hub.num_connections == 0 and not server.engine.core.requests
                           and server.all_kv_free, seconds=10)
        finally:
            await writer.stream.aclose()  # else a server without the fix waits on it at teardown
    assert closed_s < 20, f"the non-reading client was still open after {closed_s:.0f} s ({num_sent} events sent)"


async def _write_without_reading(writer: RawRealtimeClient, hub) -> tuple[float, int]:
    """Ask for a long answer, then write events (bounded: 40,000 or 40 s) until the server closes."""
    await writer.ask("hello", LONG)
    started, num_sent = time.monotonic(), 0
    with trio.move_on_after(40):
        while hub.num_connections and num_sent < 40_000:
            with trio.move_on_after(1):  # our own writes stall too once the server stops reading
                try:
                    await writer.send("input_text.ping", text="x")
                except trio.BrokenResourceError:
                    break
                num_sent += 1
    return time.monotonic() - started, num_sent


async def test_the_stream_buffer_keeps_a_reader_at_its_limit_and_drops_one_past_it(model_dir):
    """--max-stream-buffer-bytes is inclusive: output priced at exactly the limit waits; one byte
    more and the request is aborted, its reader getting what it holds, then the error."""
    deltas = [RequestDelta("req-held", 0, [7], "abc"), RequestDelta("req-held", 0, [8], "de")]
    limit = sum(delta_bytes(d) for d in deltas)
    async with open_engine(EngineConfig(model=str(model_dir), num_kv_blocks=64,
                                        max_stream_buffer_bytes=limit)) as engine:
        stream = engine._open_stream("req-held")  # a request whose reader never reads (no model step needed)
        engine._deliver(deltas, engine.stats)
        assert stream.num_bytes == limit and engine.num_slow_readers == 0  # at the limit: kept
        engine._deliver([RequestDelta("req-held", 0, [9], "f")], engine.stats)
        assert engine.num_slow_readers == 1 and "req-held" not in engine._streams  # past it: aborted
        got = [delta async for delta in stream]
    assert [d.text for d in got] == ["abc", "de", "f", ""] and got[-1].error == SLOW_READER_ERROR
