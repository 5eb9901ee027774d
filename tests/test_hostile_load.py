"""Issue 52, items 3-5: what one hostile client on 127.0.0.1 can make the server hold or wait for.

- Bodies refused unread: keyless 16 MiB bodies get their 401 without being buffered (RSS), and
  the bytes of bodies being read are bounded server-wide (503 past --max-body-bytes-in-flight).
- Fan-out: prompts x n past --max-sequences-per-request is a 400; a request at the cap does
  not keep a 4-token chat waiting for all its sequences (fair admission).
- Multi-megabyte prompts: refused from their length in characters when they cannot fit, and
  otherwise tokenized off the trio thread, so /health answers meanwhile.
Every client is bounded in count and time.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401
from rill.transports.body_gate import BUDGET_KEY
from rill.transports.http import ServerConfig

KEY = "sk-test"
MIB = 1 << 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # positions enough that a 1 MB prompt passes the character bound and must be tokenized
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2", max_position_embeddings=1 << 18)


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and (code is None or error["code"] == code)
    return error


async def post_raw(port: int, path: str, length: int, chunk: bytes, headers: str = "",
                   hold: trio.Event | None = None) -> bytes:
    """POST `length` bytes of `chunk` repeated; the status line, or b"" if the server closed first.
    With `hold`, send the first chunk only, then wait for it before the rest."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {length}\r\n\r\n").encode()
    answer = bytearray()

    async def send_body() -> None:
        try:
            await stream.send_all(head)
            for i, start in enumerate(range(0, length, len(chunk))):
                if i == 1 and hold is not None:
                    await hold.wait()
                await stream.send_all(chunk[: length - start])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the server closed the connection rather than read the rest

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(send_body)
        while b"\r\n" not in answer:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                break
            answer += data
        nursery.cancel_scope.cancel()
    return bytes(answer.split(b"\r\n", 1)[0])


# -- item 3: bodies ------------------------------------------------------------------------------------


async def test_keyless_16_mib_bodies_get_401_without_being_buffered(model_dir):
    """Before: each 401 still buffered its body while the keep-alive mend waited for it (+13.6 MB a
    connection). Now the body stays in the socket: 12 such connections add well under 48 MB."""
    async with running_server(model_dir, ServerConfig(api_key=KEY)) as server:
        port = int(server.url.rsplit(":", 1)[1])
        chunk = b"x" * MIB
        before = rss_bytes()
        statuses = []

        async def one() -> None:
            statuses.append(await post_raw(port, "/v1/chat/completions", 16 * MIB, chunk))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(one)
        growth = rss_bytes() - before
        assert statuses == [b"HTTP/1.1 401 "] * 12, statuses
        assert growth < 48 * MIB, f"RSS grew {growth / MIB:.0f} MiB for 12 refused bodies"
        await wait_for(lambda: server.app.extensions[BUDGET_KEY].num_bytes == 0, 5)


async def test_bodies_past_the_in_flight_budget_get_503_unread_and_the_budget_comes_back(model_dir):
    config = ServerConfig(api_key=KEY, max_body_bytes_in_flight=8 * MIB)
    async with running_server(model_dir, config) as server:
        port, budget = int(server.url.rsplit(":", 1)[1]), server.app.extensions[BUDGET_KEY]
        auth, chunk, release = f"Authorization: Bearer {KEY}\r\n", b" " * MIB, trio.Event()
        statuses = []

        async def one(hold) -> None:
            statuses.append(await post_raw(port, "/v1/chat/completions", 4 * MIB, chunk, auth, hold))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(2):  # at the limit: two 4 MiB bodies hold all 8 MiB while they arrive
                    nursery.start_soon(one, release)
                await wait_for(lambda: budget.num_bytes == 8 * MIB)
                for _ in range(4):  # past it: refused at once, while the first two still hold
                    nursery.start_soon(one, None)
                await wait_for(lambda: len(statuses) == 4)
                release.set()
        assert sorted(statuses) == [b"HTTP/1.1 400 "] * 2 + [b"HTTP/1.1 503 "] * 4  # 400: blanks are no JSON
        await wait_for(lambda: budget.num_bytes == 0, 5)  # given back as each exchange ends
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}) as client:
            big = await client.post("/v1/completions", content=b" " * (9 * MIB),
                                    headers={"Content-Type": "application/json"})
            assert "max-body-bytes-in-flight" in assert_error(big, 503)["message"]
            ok = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert ok.status_code == 200


# -- item 4: fan-out -----------------------------------------------------------------------------------


async def test_fan_out_is_capped_and_a_request_at_the_cap_does_not_starve_a_short_chat(model_dir):
    """Before: no cap (100 prompts x n=256 was 25,339 sequences) and FIFO admission, so a chat
    waited for every sequence ahead of it. Now: 400 past the cap, and the chat runs at once."""
    config = ServerConfig(max_sequences_per_request=32)
    async with running_server(model_dir, config, max_num_seqs=8, num_kv_blocks=1024) as server, \
            httpx.AsyncClient(base_url=server.v1, timeout=120) as client:
        big = {"prompt": ["one", "two", "three", "four"], "n": 8, "max_tokens": 48, "ignore_eos": True}
        with trio.fail_after(5):
            past = await client.post("/completions", json={**big, "prompt": big["prompt"] + ["five"]})
        error = assert_error(past, 400, "too_many_sequences")
        assert error["param"] == "prompt" and "40 sequences" in error["message"]
        times = {}

        async def timed(name: str, path: str, body: dict) -> None:
            start = time.monotonic()
            response = await client.post(path, json=body)
            assert response.status_code == 200, response.text
            times[name] = time.monotonic() - start

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(timed, "big", "/completions", big)  # at the cap: 4 x 8 = 32 sequences
                await wait_for(lambda: len(server.engine.core.scheduler.running) == 8, 30)
                chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True}
                nursery.start_soon(timed, "chat", "/chat/completions", chat)
        # FIFO would run the chat after four waves of eight; fair admission, within a step or two
        assert times["chat"] < times["big"] / 3, times
        assert server.all_kv_free


# -- item 5: long prompts ------------------------------------------------------------------------------


async def ping_health(client: httpx.AsyncClient, latencies: list[float], stop: trio.Event) -> None:
    while not stop.is_set():
        start = time.monotonic()
        assert (await client.get("/health")).status_code == 200
        latencies.append(time.monotonic() - start)
        await trio.sleep(0.05)


async def attack_with_health(server, body: bytes) -> tuple[httpx.Response, float, list[float]]:
    latencies, stop = [], trio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ping_health, client, latencies, stop)
                await wait_for(lambda: latencies)
                start = time.monotonic()
                response = await client.post("/v1/chat/completions", content=body,
                                             headers={"Content-Type": "application/json"})
                elapsed = time.monotonic() - start
                stop.set()
    return response, elapsed, latencies


def chat_body(num_chars: int) -> bytes:
    text = ("the quick brown fox jumps over 12 lazy dogs " * (num_chars // 44 + 1))[:num_chars]
    return json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()


async def test_a_4_mb_prompt_that_cannot_fit_is_refused_from_its_length_at_once(model_dir):
    """Before: tokenized whole on the trio thread (seconds per MB) before its 400."""
    async with running_server(model_dir, max_model_len=512) as server:
        response, elapsed, latencies = await attack_with_health(server, chat_body(4_000_000))
        error = assert_error(response, 400, "context_length_exceeded")
        assert "characters" in error["message"] and error["param"] == "messages"
        assert elapsed < 1.5 and max(latencies) < 0.5, (elapsed, max(latencies))


async def test_health_answers_while_a_1_mb_prompt_is_tokenized(model_dir):
    """A prompt the character bound cannot refuse (the context is 262,144 tokens) is tokenized in a
    worker thread with the GIL released: /health keeps answering (before: it waited ~3 s)."""
    async with running_server(model_dir) as server:
        response, elapsed, latencies = await attack_with_health(server, chat_body(1_000_000))
        error = assert_error(response, 400, "context_length_exceeded")  # ~477k tokens: counted, then refused
        assert "characters" not in error["message"]  # tokenized, not refused from its length
        assert max(latencies) < 1.0, f"/health took up to {max(latencies):.2f} s while tokenizing ({elapsed:.1f} s)"
        ok = await httpx.AsyncClient(base_url=server.v1).post("/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert ok.status_code == 200
