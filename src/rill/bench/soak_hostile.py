"""The hostile mix of `rill bench soak --hostile-workers N`: clients that misbehave beside the normal
traffic (issue 52), each written at the socket level, as such a client would be:

- slow_reader: an SSE stream of n=4 long answers whose client reads the status line and then never
  reads again, for --hostile-hold-s; the server must bound what waits for it, not the client;
- realtime_leaver: a /v1/realtime client that asks for an answer and closes its TCP connection at
  once, with no close handshake (its slot, task and conversation must go);
- fan_out: one small completions request asking for 32 prompts x n=8 (256 sequences) or for
  100 prompts x n=256 (25,600, the issue's request);
- large_body: a POST that declares 64 MiB and sends as fast as the server takes it for up to 2 s.

Each returns its outcome as the normal kinds do ("2xx", a 4xx status, "5xx", "dropped"); a hostile
client that gets no answer before it leaves is "dropped". The normal traffic's latency during the mix
is what the soak reports (rill.bench.soak).
"""

from __future__ import annotations

import json
import random
from urllib.parse import urlsplit

HOLD_S = 10.0  # --hostile-hold-s: how long a slow reader keeps its stream without reading
LARGE_BODY_BYTES = 64 << 20
LARGE_BODY_SEND_S = 2.0
CHUNK = b"x" * (64 << 10)


class Hostile:
    """What the hostile kinds need: where the server is, the model, how long a slow reader holds."""

    def __init__(self, url: str, model: str, hold_s: float = HOLD_S):
        parts = urlsplit(url)
        self.host, self.port, self.model, self.hold_s = parts.hostname, parts.port, model, hold_s

    async def connect(self):
        import trio

        return await trio.open_tcp_stream(self.host, self.port)

    def request(self, method: str, path: str, body: bytes, length: int | None = None) -> bytes:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body) if length is None else length}\r\n\r\n")
        return head.encode() + body


def _status(head: bytes) -> str:
    """The outcome of a response's first bytes: "2xx", the 4xx status, "5xx", or "dropped" (none)."""
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return "dropped"
    status = int(parts[1])
    return "2xx" if status < 300 else "5xx" if status >= 500 else str(status)


async def slow_reader(h: Hostile, rng: random.Random) -> str:
    import trio

    body = json.dumps({"model": h.model, "prompt": rng.choice(["Count:", "Story:", "List:"]), "n": 4,
                       "max_tokens": 4000, "ignore_eos": True, "stream": True}).encode()
    stream = await h.connect()
    async with stream:
        await stream.send_all(h.request("POST", "/v1/completions", body))
        head = await stream.receive_some(256)  # the answer has started; from here on nothing is read
        await trio.sleep(h.hold_s)
    return _status(head)


async def realtime_leaver(h: Hostile, rng: random.Random) -> str:
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Message, Request

    ws = WSConnection(ConnectionType.CLIENT)
    stream = await h.connect()
    async with stream:
        await stream.send_all(ws.send(Request(host=f"{h.host}:{h.port}", target="/v1/realtime")))
        ws.receive_data(await stream.receive_some(4096))
        if not any(isinstance(e, AcceptConnection) for e in ws.events()):
            return "dropped"
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
        for event in ({"type": "conversation.item.create", "item": item}, {"type": "response.create"}):
            await stream.send_all(ws.send(Message(data=json.dumps(event))))
    return "dropped"  # the socket closes here, mid-answer, with no close frame


async def fan_out(h: Hostile, rng: random.Random) -> str:
    """Half the time 32 prompts x n=8 (256 sequences: within the cap, fair admission keeps the rest
    served), half the time the issue's 100 x n=256 (25,600: past --max-sequences-per-request)."""
    prompts, n = (32, 8) if rng.random() < 0.5 else (100, 256)
    body = json.dumps({"model": h.model, "prompt": ["What is 2 + 2?"] * prompts, "n": n, "max_tokens": 8}).encode()
    stream = await h.connect()
    async with stream:
        await stream.send_all(h.request("POST", "/v1/completions", body))
        return _status(await stream.receive_some(256))


async def large_body(h: Hostile, rng: random.Random) -> str:
    import trio

    stream = await h.connect()
    head = b""
    async with stream:
        await stream.send_all(h.request("POST", "/v1/chat/completions", b"", length=LARGE_BODY_BYTES))
        with trio.move_on_after(LARGE_BODY_SEND_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_body, stream)
                head = await stream.receive_some(256)  # the server answers (413) or closes
                nursery.cancel_scope.cancel()
    return _status(head)


async def _send_body(stream) -> None:
    import trio

    sent = 0
    try:
        while sent < LARGE_BODY_BYTES:
            await stream.send_all(CHUNK)
            sent += len(CHUNK)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the server closed the connection rather than read the body: what it should do


HOSTILE_KINDS = {  # name -> (coroutine, weight)
    "slow_reader": (slow_reader, 2), "realtime_leaver": (realtime_leaver, 2), "fan_out": (fan_out, 1),
    "large_body": (large_body, 1),
}


# -- running them beside the normal traffic, and the normal traffic's latency ------------------------------

NORMAL_LATENCY_KINDS = ("chat", "chat_stream", "completion")  # short requests, each read to its end


async def run_hostile(h: Hostile, kind: str, rng: random.Random, timeout_s: float) -> str:
    """One hostile request; a connection the server reset or closed is "dropped" (what it may do to
    such a client), never a problem. Bounded by timeout_s beyond the slow reader's hold."""
    import trio

    with trio.move_on_after(timeout_s + h.hold_s):
        try:
            return await HOSTILE_KINDS[kind][0](h, rng)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return "dropped"
    return "timeout"


async def hostile_worker(h: Hostile, tally: dict, rng: random.Random, end_s: float, timeout_s: float) -> None:
    import trio

    names = list(HOSTILE_KINDS)
    weights = [HOSTILE_KINDS[n][1] for n in names]
    while trio.current_time() < end_s:
        kind = rng.choices(names, weights)[0]
        tally[kind][await run_hostile(h, kind, rng, timeout_s)] += 1


def percentiles(values: list[float]) -> dict:
    """n, p50, p99 and max of latencies in seconds (None when there are none)."""
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)

    return {"n": len(ordered), "p50": at(0.50), "p99": at(0.99), "max": round(ordered[-1], 4)}
