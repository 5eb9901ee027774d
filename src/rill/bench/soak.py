"""`rill bench soak`: minutes of mixed traffic against `rill serve`; no 5xx, nothing left behind.

With no --url, `rill serve MODEL` runs as a subprocess on 127.0.0.1 and a free port (its log beside
the JSON, NAME-server.log), with --session-timeout-sec short so that abandoned Mode B sessions
expire before the end, and a small --max-body-bytes so that oversized bodies are cheap to send.
--concurrency workers each pick a kind by weight until the time is up (rill.bench.soak_traffic):
chat (JSON and SSE), completions, Mode A (whole and dropped mid-upload), Mode B (finished and read,
or deleted, or abandoned), realtime (read to the end, cancelled, dropped mid-response), client
disconnects mid-stream and bad inputs; each request has --request-timeout-s. --hostile-workers adds
the hostile mix of rill.bench.soak_hostile beside them (slow readers, realtime leavers, fan-out, large
bodies), and the normal requests' latency (p50, p99) is reported with the RSS during it.

Measured: requests by kind and outcome (2xx, each 4xx, 5xx, dropped on purpose, timeout,
connection error, an answer the protocol does not allow); the server's RSS (/proc/PID/status)
after a warm-up round of every kind, every --sample-s, and at the end; and once the traffic has
stopped and the sessions' timeout has passed, /metrics (requests running or waiting, parked
sessions, KV blocks in use, streaming sessions open) and the server's log (realtime connections
still open, ERROR lines, tracebacks). Exit status 1 when any 5xx happened (seen by a client or
counted by the server), anything was left, or the server died.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from rill.bench.common import add_common_args, progress, resolve_model, save_plot
from rill.bench.soak_hostile import HOSTILE_KINDS, HOLD_S, NORMAL_LATENCY_KINDS, Hostile, hostile_worker, percentiles
from rill.bench.soak_traffic import KINDS, Traffic

NAME = "soak"
STARTUP_TIMEOUT_S = 180.0
PROBLEM_OUTCOMES = ("5xx", "timeout", "connection_error", "unexpected")
# /metrics when the server could not be asked at the end: every gauge unknown (NaN is not 0: a leak)
UNREADABLE = {name: float("nan") for name in ("rill_num_requests_running", "rill_num_requests_waiting",
                                              "rill_num_sessions_parked", "rill_kv_cache_blocks",
                                              "rill_kv_cache_free_blocks", "rill_streaming_sessions_open")}


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--minutes", type=float, default=2.0, help="traffic time (default 2)")
    p.add_argument("--seconds", type=float, default=None, help="traffic time in seconds (overrides --minutes)")
    p.add_argument("--concurrency", type=int, default=8, help="workers sending requests (default 8)")
    p.add_argument("--model", default="rill-tiny", help="with no --url: the model `rill serve` runs (default rill-tiny)")
    p.add_argument("--url", default=None, help="a running server's base URL (default: start `rill serve` here)")
    p.add_argument("--pid", type=int, default=None, help="with --url: the server's process id, for its RSS")
    p.add_argument("--session-timeout-s", type=float, default=5.0,
                   help="the server's --session-timeout-sec; the final check waits this long (default 5)")
    p.add_argument("--max-body-bytes", type=int, default=256 << 10,
                   help="the server's --max-body-bytes; oversized bodies are sent just past it (default 256 KiB)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="the server's --num-kv-blocks (default: its own budget). The KV cache's pages come in "
                        "as blocks are first written, so a small cache keeps that growth out of the RSS figures")
    p.add_argument("--request-timeout-s", type=float, default=60.0, help="one request's time limit (default 60)")
    p.add_argument("--sample-s", type=float, default=2.0, help="RSS sampling interval (default 2)")
    p.add_argument("--settle-s", type=float, default=10.0,
                   help="after the session timeout, how long leaks may take to clear (default 10)")
    p.add_argument("--hostile-workers", type=int, default=0,
                   help="workers sending the hostile mix beside the normal traffic: slow readers, realtime "
                        "leavers, fan-out, large bodies (rill.bench.soak_hostile; default 0: none)")
    p.add_argument("--hostile-hold-s", type=float, default=HOLD_S,
                   help=f"how long a slow reader keeps its stream without reading (default {HOLD_S:g})")


# -- the server ----------------------------------------------------------------------------------


@contextmanager
def server_process(args, log_path: Path, extra_flags: tuple[str, ...] | list[str] = ()):
    """`rill serve` in a subprocess; yields (process, base URL) once it listens, then stops it."""
    cmd = [sys.executable, "-m", "rill", "serve", resolve_model(args.model, args.cache_dir, args.seed),
           "--host", "127.0.0.1", "--port", "0", "--served-model-name", args.model,
           "--session-timeout-sec", str(args.session_timeout_s), "--max-body-bytes", str(args.max_body_bytes),
           "--shutdown-grace-s", "2", "--log-level", "info"]
    if getattr(args, "num_kv_blocks", None) is not None:
        cmd += ["--num-kv-blocks", str(args.num_kv_blocks)]
    cmd += list(extra_flags)
    env = dict(os.environ)
    if args.threads is not None:  # torch in the server takes its intra-op thread count from this
        env["OMP_NUM_THREADS"] = str(args.threads)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        yield proc, _wait_listening(proc, log_path)
    finally:
        _stop(proc)


def _wait_listening(proc: subprocess.Popen, log_path: Path) -> str:
    """The URL from the server's 'serving MODEL at URL' log line."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        found = re.search(r"serving .* at (http://[0-9.]+:[0-9]+)", log_path.read_text(errors="replace"))
        if found:
            return found.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"rill serve exited with {proc.returncode}; see {log_path}")
        time.sleep(0.2)
    raise RuntimeError(f"rill serve did not listen within {STARTUP_TIMEOUT_S:.0f} s; see {log_path}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rss_mb(pid: int | None) -> float | None:
    """Resident set size of a process in MB (VmRSS), or None without a pid or once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, TypeError):
        return None
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(found.group(1)) / 1024 if found else None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: 'name{labels} value' lines -> {name{labels}: value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def leaks_of(metrics: dict[str, float]) -> dict[str, float]:
    """What must be 0 once the traffic has stopped and abandoned sessions have expired."""
    return {
        "requests_running": metrics["rill_num_requests_running"],
        "requests_waiting": metrics["rill_num_requests_waiting"],
        "sessions_parked": metrics["rill_num_sessions_parked"],
        "kv_blocks_in_use": metrics["rill_kv_cache_blocks"] - metrics["rill_kv_cache_free_blocks"],
        "streaming_sessions_open": metrics.get("rill_streaming_sessions_open", 0.0),
    }


def server_5xx(metrics: dict[str, float]) -> int:
    """5xx answers the server counted itself (rill_http_requests_total by endpoint and status)."""
    return int(sum(v for k, v in metrics.items() if k.startswith("rill_http_requests_total") and 'status="5' in k))


def scan_log(log_path: Path | None) -> dict:
    """ERROR lines and tracebacks in the server's log (the first few kept, for the report), and the
    realtime connections opened but not closed (/metrics has no gauge for them): read before the
    server stops, whose shutdown closes every connection."""
    if log_path is None:
        return {"errors": None, "tracebacks": None, "realtime_connections_open": None, "first": []}
    lines = log_path.read_text(errors="replace").splitlines()
    errors = [i for i, line in enumerate(lines) if " ERROR " in line or line.startswith("Traceback")]
    opened = sum(bool(re.search(r"realtime connection \S+ opened", line)) for line in lines)
    closed = sum(bool(re.search(r"realtime connection \S+ closed", line)) for line in lines)
    return {"errors": sum(" ERROR " in lines[i] for i in errors),
            "tracebacks": sum(lines[i].startswith("Traceback") for i in errors),
            "realtime_connections_open": opened - closed,
            "first": ["\n".join(lines[i:i + 12]) for i in errors[:3]]}


# -- the traffic ---------------------------------------------------------------------------------


async def run_one(traffic: Traffic, kind: str, rng: random.Random, timeout_s: float) -> str:
    """One request of `kind`, bounded by timeout_s; its outcome."""
    import httpx
    import trio
    from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError

    outcome = "timeout"
    with trio.move_on_after(timeout_s):
        try:
            return await KINDS[kind][0](traffic, rng)
        except ConnectionRejected as exc:  # a realtime handshake answered with an HTTP status
            traffic.sample(f"{kind} handshake", exc.status_code, repr(exc))
            return "5xx" if exc.status_code >= 500 else str(exc.status_code)
        except httpx.TimeoutException as exc:
            traffic.sample(kind, outcome, repr(exc))
            return outcome
        except (httpx.TransportError, HandshakeError, ConnectionClosed, OSError, trio.BrokenResourceError) as exc:
            outcome, detail = "connection_error", repr(exc)
        except Exception as exc:  # noqa: BLE001 - an answer the protocol does not allow (or a bug here)
            outcome, detail = "unexpected", repr(exc)
        traffic.sample(kind, outcome, detail)
        return outcome
    traffic.sample(kind, outcome, f"no answer within {timeout_s} s")
    return outcome


async def _worker(traffic: Traffic, tally: dict[str, Counter], rng: random.Random, end_s: float, timeout_s: float,
                  latencies: dict[str, list[float]]):
    import trio

    names = list(KINDS)
    weights = [KINDS[n][1] for n in names]
    while trio.current_time() < end_s:
        kind = rng.choices(names, weights)[0]
        started = trio.current_time()
        outcome = await run_one(traffic, kind, rng, timeout_s)
        tally[kind][outcome] += 1
        if outcome == "2xx":
            latencies[kind].append(trio.current_time() - started)


async def _sample(pid, series: list, tally: dict[str, Counter], start_s: float, args, bar) -> None:
    """RSS every sample_s, and the progress bar's time and counts."""
    import trio

    while True:
        elapsed = trio.current_time() - start_s
        series.append([round(elapsed, 2), rss_mb(pid)])
        counts = sum((c for c in tally.values()), Counter())
        bar.n = min(bar.total, int(elapsed))
        bar.set_postfix(requests=sum(counts.values()), **{k: counts[k] for k in PROBLEM_OUTCOMES})
        await trio.sleep(args.sample_s)


async def _settle(client, args) -> dict:
    """/metrics once leaks are all 0, or at the deadline (abandoned sessions expire in between)."""
    import trio

    deadline = trio.current_time() + args.session_timeout_s + args.settle_s
    while True:
        metrics = parse_metrics((await client.get("/metrics")).text)
        if not any(leaks_of(metrics).values()) or trio.current_time() > deadline:
            return metrics
        await trio.sleep(0.25)


async def soak(args, url: str, pid: int | None) -> dict:
    import httpx
    import trio

    duration_s = args.seconds if args.seconds is not None else args.minutes * 60
    limits = httpx.Limits(max_connections=2 * args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout_s, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        traffic = Traffic(client, url.replace("http://", "ws://") + "/v1/realtime", model, args.max_body_bytes)
        warm_rng = random.Random(args.seed)
        for kind in KINDS:  # a round of every kind, uncounted, before the first RSS figure
            await run_one(traffic, kind, warm_rng, args.request_timeout_s)
        traffic.samples.clear()
        tally: dict[str, Counter] = {kind: Counter() for kind in KINDS}
        hostile_tally: dict[str, Counter] = {kind: Counter() for kind in HOSTILE_KINDS}
        latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
        hostile = Hostile(url, model, args.hostile_hold_s)
        series: list = []
        start_s = trio.current_time()
        with progress(total=int(duration_s), desc="soak (s)", disable=args.no_progress) as bar:
            async with trio.open_nursery() as outer:
                outer.start_soon(_sample, pid, series, tally, start_s, args, bar)
                for i in range(args.hostile_workers):  # cancelled with the sampler once the normal traffic ends
                    outer.start_soon(hostile_worker, hostile, hostile_tally, random.Random(args.seed * 7000 + i),
                                     start_s + duration_s, args.request_timeout_s)
                async with trio.open_nursery() as workers:
                    for i in range(args.concurrency):
                        workers.start_soon(_worker, traffic, tally, random.Random(args.seed * 1000 + i + 1),
                                           start_s + duration_s, args.request_timeout_s, latencies)
                traffic_s = trio.current_time() - start_s
                outer.cancel_scope.cancel()
        try:
            metrics = await _settle(client, args)
            healthy = (await client.get("/health")).status_code == 200
        except httpx.TransportError:  # the server is gone: the result says so rather than a traceback
            metrics, healthy = None, False
        series.append([round(trio.current_time() - start_s, 2), rss_mb(pid)])
    return {"model": model, "traffic_s": traffic_s, "tally": tally, "metrics": metrics, "rss_series": series,
            "healthy": healthy, "problems": traffic.samples, "hostile_tally": hostile_tally, "latencies": latencies}


# -- results -------------------------------------------------------------------------------------


def run(args) -> dict:
    import trio

    if args.url:
        out = trio.run(soak, args, args.url.rstrip("/"), args.pid)
        return _result(args, out, True, scan_log(None))
    log_path = args.json.with_name(f"{args.json.stem}-server.log")
    with server_process(args, log_path) as (proc, url):
        out = trio.run(soak, args, url, proc.pid)
        return _result(args, out, proc.poll() is None, scan_log(log_path))


def _result(args, out: dict, alive: bool, log: dict) -> dict:
    tally, series = out["tally"], out["rss_series"]
    metrics = out["metrics"] or UNREADABLE
    by_outcome = sum(tally.values(), Counter())
    leaks = leaks_of(metrics)
    if log["realtime_connections_open"] is not None:
        leaks["realtime_connections_open"] = log["realtime_connections_open"]
    rss = [mb for _, mb in series if mb is not None]
    result = {
        "benchmark": NAME,
        "config": {"seconds": args.seconds if args.seconds is not None else args.minutes * 60,
                   "concurrency": args.concurrency, "model": args.model, "seed": args.seed,
                   "num_kv_blocks": args.num_kv_blocks, "session_timeout_s": args.session_timeout_s, "max_body_bytes": args.max_body_bytes,
                   "request_timeout_s": args.request_timeout_s, "weights": {k: w for k, (_, w) in KINDS.items()}},
        "model": out["model"], "url": args.url or "rill serve (subprocess)", "traffic_s": out["traffic_s"],
        "requests": sum(by_outcome.values()), "requests_per_s": sum(by_outcome.values()) / out["traffic_s"],
        "by_kind": {k: dict(c) for k, c in tally.items()}, "by_outcome": dict(by_outcome),
        "num_5xx": by_outcome["5xx"], "server_5xx": server_5xx(metrics),
        "rss_mb": {"start": rss[0] if rss else None, "end": rss[-1] if rss else None,
                   "growth": rss[-1] - rss[0] if rss else None, "peak": max(rss) if rss else None},
        "rss_series": series, "leaks": leaks, "num_leaked": sum(leaks.values()),
        "kv_cache_blocks": metrics["rill_kv_cache_blocks"],
        "engine": {k: metrics.get(f"rill_{k}_total") for k in ("requests_finished", "requests_aborted",
                                                               "generation_tokens", "prompt_tokens")},
        "server_alive": alive and out["healthy"], "server_log": log, "problems": out["problems"],
        "hostile": {"workers": args.hostile_workers, "hold_s": args.hostile_hold_s,
                    "by_kind": {k: dict(c) for k, c in out.get("hostile_tally", {}).items()}},
        "latency_s": {k: percentiles(v) for k, v in out.get("latencies", {}).items()},
        "normal_latency_s": percentiles([s for k in NORMAL_LATENCY_KINDS for s in out.get("latencies", {}).get(k, [])]),
    }
    hostile_5xx = sum(c.get("5xx", 0) for c in result["hostile"]["by_kind"].values())
    result["passed"] = (result["num_5xx"] == 0 and result["server_5xx"] == 0 and result["num_leaked"] == 0
                        and result["server_alive"] and hostile_5xx == 0)
    return result


def summary(r: dict) -> str:
    cols = ("2xx", "4xx", "dropped", "5xx", "timeout", "connection_error", "unexpected")
    heads = ("2xx", "4xx", "dropped", "5xx", "timeout", "conn_err", "other")
    lines = [f"{r['model']} ({r['url']}), {r['traffic_s']:.0f} s, {r['config']['concurrency']} workers: "
             f"{r['requests']} requests ({r['requests_per_s']:.1f}/s)",
             f"  {'kind':16s} {'requests':>8s} " + " ".join(f"{c:>8s}" for c in heads)]
    for kind, outcomes in r["by_kind"].items():
        row = {c: outcomes.get(c, 0) for c in cols}
        row["4xx"] = sum(n for o, n in outcomes.items() if o.startswith("4"))
        lines.append(f"  {kind:16s} {sum(outcomes.values()):8d} " + " ".join(f"{row[c]:8d}" for c in cols))
    four = sorted((o, n) for o, n in r["by_outcome"].items() if o.startswith("4"))
    lines.append("  4xx by status: " + (", ".join(f"{o}: {n}" for o, n in four) or "none"))
    if r["hostile"]["workers"]:
        lines.append(f"hostile mix ({r['hostile']['workers']} workers): " + "; ".join(
            f"{k} {dict(sorted(c.items()))}" for k, c in r["hostile"]["by_kind"].items()))
    lat = r["normal_latency_s"]
    if lat["n"]:
        lines.append(f"normal requests ({', '.join(NORMAL_LATENCY_KINDS)}): {lat['n']}, latency p50 "
                     f"{lat['p50'] * 1e3:.0f} ms, p99 {lat['p99'] * 1e3:.0f} ms, max {lat['max'] * 1e3:.0f} ms")
    rss = r["rss_mb"]
    if rss["start"] is not None:
        lines.append(f"RSS {rss['start']:.1f} MB after warm-up -> {rss['end']:.1f} MB at the end "
                     f"({rss['growth']:+.1f} MB, peak {rss['peak']:.1f})")
    lines.append("after the traffic: " + ", ".join(f"{k} {v:g}" for k, v in r["leaks"].items())
                 + f" (of {r['kv_cache_blocks']:g} KV blocks)")
    lines.append(f"5xx: {r['num_5xx']} seen, {r['server_5xx']} counted by the server; server log: "
                 f"{r['server_log']['errors']} ERROR lines, {r['server_log']['tracebacks']} tracebacks")
    lines.append("PASSED" if r["passed"] else "FAILED (5xx, a leak or a dead server; see 'problems' in the JSON)")
    return "\n".join(lines)


def plot(r: dict, path) -> None:
    def draw(axes):
        bars, rss = axes
        kinds = list(r["by_kind"])
        outcomes = sorted({o for c in r["by_kind"].values() for o in c})
        left = [0] * len(kinds)
        for outcome in outcomes:
            counts = [r["by_kind"][k].get(outcome, 0) for k in kinds]
            bars.barh(kinds, counts, left=left, label=outcome)
            left = [a + b for a, b in zip(left, counts)]
        bars.set_xlabel("requests")
        bars.legend(fontsize="small")
        points = [(t, mb) for t, mb in r["rss_series"] if mb is not None]
        rss.plot([t for t, _ in points], [mb for _, mb in points], marker=".")
        rss.set_xlabel("seconds since the warm-up")
        rss.set_ylabel("server RSS (MB)")

    title = f"rill bench soak: {r['model']}, {r['requests']} requests"
    if r["hostile"]["workers"]:
        title += f" beside {r['hostile']['workers']} hostile workers"
    if r["normal_latency_s"]["n"]:
        title += f"; normal requests' p99 {r['normal_latency_s']['p99'] * 1e3:.0f} ms"
    save_plot(path, draw, ncols=2, title=title)
