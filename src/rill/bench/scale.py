"""`rill bench scale`: how many open streaming sessions and concurrent SSE streams one process holds.

With no --url, `rill serve MODEL` runs as a subprocess on 127.0.0.1 (its caps on open sessions
raised to --sessions). Three phases:
1. open --sessions Mode B sessions (each created with a short first chunk, so it is prefilled and
   holds KV until idle sessions yield it), --concurrency at a time, and keep them open;
2. with all of them open, run --streams streaming chat requests at once (each --max-tokens tokens),
   every one on its own connection;
3. delete the sessions, wait for the engine to settle, and read /metrics.

Measured: the server's RSS at rest, with the sessions open and after the streams (so the memory
one open session costs: the RSS growth over the sessions), sessions refused, streams that ended
without their [DONE] or with an error, the time each phase took, and what /metrics says is left
(requests, KV blocks, sessions: all must be 0). Exit status 1 when anything failed or leaked.
"""

from __future__ import annotations

import time
from pathlib import Path

from rill.bench.common import add_common_args, progress, save_plot
from rill.bench.soak import leaks_of, parse_metrics, rss_mb, server_process

NAME = "scale"
SESSIONS = "/v1/streaming_input/sessions"


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--sessions", type=int, default=10_000, help="Mode B sessions held open (default 10000)")
    p.add_argument("--streams", type=int, default=1_000, help="concurrent SSE streams (default 1000)")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens each stream generates (default 16)")
    p.add_argument("--concurrency", type=int, default=64, help="sessions created at a time (default 64)")
    p.add_argument("--model", default="rill-tiny", help="the model `rill serve` runs (default rill-tiny)")
    p.add_argument("--session-timeout-s", type=float, default=3600.0,
                   help="the server's --session-timeout-sec: long, so that no session expires mid-run")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="the server's --max-body-bytes")
    p.add_argument("--timeout-s", type=float, default=600.0, help="one request's time limit (default 600)")


def server_flags(args) -> list[str]:
    cap = str(args.sessions + 16)
    # A keep-alive timeout past the phases' pauses, so that pooled connections are not closed under
    # the client as it reuses them (hypercorn's default is 5 s).
    return ["--max-open-sessions", cap, "--max-open-sessions-per-key", cap, "--keep-alive-timeout-s", "75"]


async def open_sessions(client, n: int, concurrency: int, bar) -> tuple[list[str], int]:
    import trio

    ids, refused, limiter = [], 0, trio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        nonlocal refused
        async with limiter:
            body = {"messages": [{"role": "user", "content": f"Caption {i}:"}],
                    "chunk": {"sequence_id": 0, "payload": " the speaker said"}}
            response = await client.post(SESSIONS, json=body)
        if response.status_code == 201:
            ids.append(response.json()["session_id"])
        else:
            refused += 1
        bar.update(1)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return ids, refused


async def run_streams(client, n: int, max_tokens: int, bar) -> dict:
    import trio

    outcomes = {"done": 0, "error": 0, "incomplete": 0}

    async def one(i: int) -> None:
        body = {"messages": [{"role": "user", "content": f"What is {i} + {i}?"}], "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True}
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                lines = [line async for line in response.aiter_lines() if line]
            ok = response.status_code == 200 and lines[-1] == "data: [DONE]" and "event: error" not in lines
            outcomes["done" if ok else "incomplete"] += 1
        except Exception:  # noqa: BLE001 - counted: a connection error or a timeout
            outcomes["error"] += 1
        bar.update(1)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return outcomes


async def scale(args, url: str, pid: int | None) -> dict:
    import httpx
    import trio

    limits = httpx.Limits(max_connections=args.streams + args.concurrency + 16, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout_s, limits=limits) as client:
        await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 2})  # warm-up
        out = {"rss_mb": {"rest": rss_mb(pid)}, "seconds": {}}
        start = time.monotonic()
        with progress(total=args.sessions, desc="open sessions", disable=args.no_progress) as bar:
            ids, out["sessions_refused"] = await open_sessions(client, args.sessions, args.concurrency, bar)
        out["seconds"]["open_sessions"], out["sessions_open"] = time.monotonic() - start, len(ids)
        await _until_prefilled(client, args.timeout_s)  # every first chunk is in, idle sessions parked
        out["seconds"]["prefill_first_chunks"] = time.monotonic() - start - out["seconds"]["open_sessions"]
        out["rss_mb"]["sessions_open"] = rss_mb(pid)
        start = time.monotonic()
        with progress(total=args.streams, desc="streams", disable=args.no_progress) as bar:
            out["stream_outcomes"] = await run_streams(client, args.streams, args.max_tokens, bar)
        out["seconds"]["streams"], out["rss_mb"]["after_streams"] = time.monotonic() - start, rss_mb(pid)
        with progress(total=len(ids), desc="delete sessions", disable=args.no_progress) as bar:
            limiter = trio.CapacityLimiter(args.concurrency)  # httpx's pool is quadratic in queued requests
            async with trio.open_nursery() as nursery:
                for session_id in ids:
                    nursery.start_soon(_delete, client, session_id, bar, limiter)
        out["leaks"] = await _settled_leaks(client)
    return out


async def _until_prefilled(client, timeout_s: float) -> None:
    import trio

    with trio.move_on_after(timeout_s):
        while parse_metrics((await client.get("/metrics")).text)["rill_num_requests_waiting"]:
            await trio.sleep(1.0)


async def _delete(client, session_id: str, bar, limiter) -> None:
    import httpx

    async with limiter:
        for attempt in range(3):  # DELETE is idempotent: retry a pooled connection the server had just closed
            try:
                await client.delete(f"{SESSIONS}/{session_id}")
                break
            except httpx.RemoteProtocolError:
                if attempt == 2:
                    raise
    bar.update(1)


async def _settled_leaks(client, wait_s: float = 30.0) -> dict:
    import trio

    deadline = time.monotonic() + wait_s
    while True:
        leaks = leaks_of(parse_metrics((await client.get("/metrics")).text))
        if not any(leaks.values()) or time.monotonic() > deadline:
            return leaks
        await trio.sleep(0.5)


def run(args) -> dict:
    import trio

    log_path = Path(args.json).with_name(f"{NAME}-server.log")
    with server_process(args, log_path, server_flags(args)) as (proc, url):
        out = trio.run(scale, args, url, proc.pid)
    rss = out["rss_mb"]
    per_session_kb = None
    if rss["rest"] is not None and out["sessions_open"]:
        per_session_kb = (rss["sessions_open"] - rss["rest"]) * 1024 / out["sessions_open"]
    failed = out["sessions_refused"] + out["stream_outcomes"]["error"] + out["stream_outcomes"]["incomplete"]
    return {"benchmark": NAME, "model": args.model, "sessions": args.sessions, "streams": args.streams,
            "max_tokens": args.max_tokens, **out, "kb_per_open_session": per_session_kb,
            "passed": failed == 0 and not any(out["leaks"].values())}


def summary(r: dict) -> str:
    rss, s = r["rss_mb"], r["stream_outcomes"]
    per = "-" if r["kb_per_open_session"] is None else f"{r['kb_per_open_session']:.1f} KB"
    return (f"{r['sessions_open']} sessions open ({r['sessions_refused']} refused) in "
            f"{r['seconds']['open_sessions']:.1f} s; {r['streams']} streams at once: {s['done']} done, "
            f"{s['incomplete']} incomplete, {s['error']} errors in {r['seconds']['streams']:.1f} s\n"
            f"RSS {rss['rest']:.0f} MB at rest, {rss['sessions_open']:.0f} MB with the sessions open "
            f"({per} a session), {rss['after_streams']:.0f} MB after the streams; left: {r['leaks']}; "
            f"{'passed' if r['passed'] else 'FAILED'}")


def plot(r: dict, path) -> None:
    rss = r["rss_mb"]
    if None in rss.values():
        return

    def draw(axes):
        labels = ["at rest", f"{r['sessions_open']} sessions", f"+ {r['streams']} streams"]
        axes[0].bar(labels, [rss["rest"], rss["sessions_open"], rss["after_streams"]], color="#4477aa")
        axes[0].set_ylabel("server RSS (MB)")

    save_plot(path, draw, title=f"rill serve {r['model']}: {r['kb_per_open_session']:.1f} KB per open session")
