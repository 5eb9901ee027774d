"""SIGTERM within the grace, whatever clients do (issue 52, item 8): a real `rill serve` (rill-tiny)
on 127.0.0.1 with streams that outlast --shutdown-grace-s and one client that stopped reading.
Before the fix the streams got neither an error event nor [DONE] (0 of 20), and the process waited
for the non-reading client to close its socket, well past the grace."""

from __future__ import annotations

import re
import signal
import time

import httpx
import trio

from helpers_hostile import RawRealtimeClient, post_and_never_read
from helpers_server import parse_sse
from test_server_ops import rill_serve_process

GRACE_S = 4.0
NUM_READERS = 6
LONG = {"messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 20_000,
        "ignore_eos": True, "stream": True}


async def test_sigterm_ends_running_streams_with_an_error_event_and_exits_within_the_grace(tmp_path):
    # No send timeout and no stream buffer bound: only the grace may end the non-reader's stream.
    flags = ["--shutdown-grace-s", str(GRACE_S), "--send-timeout-s", "0", "--max-stream-buffer-bytes", "0",
             "--ws-port", "0", "--speech-model", "none", "--num-kv-blocks", "1024"]  # the last --num-kv-blocks wins
    async with rill_serve_process("rill-tiny", tmp_path, flags) as (process, url, stderr_path):
        hostile = await post_and_never_read(url, "/v1/chat/completions", LONG)
        ws_url = re.search(r"(ws://127\.0\.0\.1:\d+)", stderr_path.read_text())[1]
        # realtime clients that never read, on both listeners
        realtime = [await RawRealtimeClient.connect(u) for u in (url.replace("http", "ws") + "/v1/realtime", ws_url)]
        try:
            for client in realtime:
                await client.ask("Count to a thousand.", 20_000)
                await _fill_with_errors(client)
            raws, exit_s = await _readers_then_sigterm(process, url)
        finally:
            await hostile.aclose()
            for client in realtime:
                await client.leave_abruptly()
    log = stderr_path.read_text()
    ends = [parse_sse(raw)[-1] for raw in raws]
    # Figures: every reader's stream ends with the shutdown's error event; the process exits 0 within
    # the grace plus 5 s (the engine's and the interpreter's own shutdown, on a busy 2-core machine),
    # the non-reader notwithstanding (before the fix: not until that client closed its socket).
    assert [end.event for end in ends] == ["error"] * NUM_READERS, [e for e in ends if e.event != "error"]
    assert {end.json["error"]["code"] for end in ends} == {"server_shutdown"}
    assert process.returncode == 0, log
    assert exit_s < GRACE_S + 5, f"exited {exit_s:.1f} s after SIGTERM (grace {GRACE_S} s): {log[-2000:]}"


async def _readers_then_sigterm(process, url: str) -> tuple[list[str], float]:
    """Streams that read everything; SIGTERM once each has content. Their raw SSE, and the seconds
    from the signal to the process's exit."""
    raws = [""] * NUM_READERS
    started = [trio.Event() for _ in range(NUM_READERS)]

    async def read(i: int, client: httpx.AsyncClient) -> None:
        try:
            async with client.stream("POST", "/v1/chat/completions", json=LONG) as response:
                async for text in response.aiter_text():
                    raws[i] += text
                    if '"content"' in raws[i]:
                        started[i].set()
        except httpx.RemoteProtocolError:  # cut mid-stream (what happened before the fix)
            raws[i] += "data: (the connection was cut)\n\n"

    with trio.fail_after(120):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client, trio.open_nursery() as nursery:
            for i in range(NUM_READERS):
                nursery.start_soon(read, i, client)
            for event in started:
                await event.wait()
            await trio.sleep(1.0)  # the non-reader's socket is full by now
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
    with trio.move_on_after(GRACE_S + 10):  # bounded: the assertion on the time then fails
        await process.wait()
    return raws, time.monotonic() - signalled


async def _fill_with_errors(client: RawRealtimeClient) -> None:
    """Events the server answers with an error event each (a second response.create while one runs),
    until the server's writes to this client stall: bounded, 3,000 events or 5 s."""
    with trio.move_on_after(5):
        for _ in range(3_000):
            await client.send("response.create")
