"""`rill bench soak`: a few seconds of every kind of traffic against `rill serve` (a real subprocess)
and against a running server given by URL; the result names every kind and outcome, no 5xx, no
leak. The pieces that decide pass or fail (metrics, the server's log) are pinned on their own."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.bench import build_parser, main
from rill.bench.soak import _result, leaks_of, parse_metrics, scan_log, server_5xx, soak
from rill.bench.soak_traffic import KINDS
from rill.sessions import StreamingInputConfig
from rill.transports.http import ServerConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHORT = ["--seconds", "4", "--concurrency", "4", "--session-timeout-s", "2", "--sample-s", "0.5",
         "--request-timeout-s", "30", "--no-progress"]


def assert_clean(result: dict) -> None:
    assert result["num_5xx"] == 0 and result["server_5xx"] == 0, result["problems"]
    assert result["num_leaked"] == 0 and not any(result["leaks"].values()), result["leaks"]
    assert not {"timeout", "connection_error", "unexpected"} & set(result["by_outcome"]), result["problems"]
    assert result["passed"] and result["server_alive"]


def test_soak_against_rill_serve_sends_every_kind_and_leaves_nothing_behind(tmp_path):
    pytest.importorskip("matplotlib")  # the `bench` extra: the PNG
    out = tmp_path / "soak.json"
    assert main(["soak", *SHORT, "--json", str(out), "--threads", "1"]) == 0
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    result = json.loads(out.read_text())
    assert result["benchmark"] == "soak" and result["model"] == "rill-tiny"
    assert set(result["by_kind"]) == set(KINDS)
    assert result["requests"] == sum(result["by_outcome"].values()) > len(KINDS)
    assert set(result["by_kind"]["bad_input"]) <= {"400", "404", "405", "413"}  # never a 2xx, never a 5xx
    assert_clean(result)
    assert result["leaks"]["realtime_connections_open"] == 0
    assert result["rss_mb"]["start"] > 0 and result["rss_mb"]["end"] > 0
    assert len(result["rss_series"]) >= 4
    # The warm-up round sends every kind once, drops and disconnects included, so both counters move.
    assert result["engine"]["requests_finished"] > 0 and result["engine"]["requests_aborted"] > 0
    assert result["server_log"]["tracebacks"] == 0
    assert (tmp_path / "soak-server.log").read_text().count("serving rill-tiny at http://127.0.0.1:")


async def test_soak_against_a_running_server_by_url_reports_no_rss(tmp_path):
    args = build_parser().parse_args(["soak", *SHORT, "--seconds", "2", "--url", "unused"])
    server = ServerConfig(max_body_bytes=args.max_body_bytes, served_model_names=["rill-tiny"],
                          streaming_input=StreamingInputConfig(session_timeout_s=args.session_timeout_s))
    async with running_server("rill-tiny", server) as running:
        out = await soak(args, running.url, None)
        assert running.all_kv_free and not running.engine.core.requests
    result = _result(args, out, True, scan_log(None))
    assert_clean(result)
    assert result["rss_mb"] == {"start": None, "end": None, "growth": None, "peak": None}
    assert "realtime_connections_open" not in result["leaks"] and result["server_log"]["errors"] is None


METRICS = """# HELP rill_num_requests_running Sequences in the running batch.
rill_num_requests_running 1.0
rill_num_requests_waiting 0.0
rill_num_sessions_parked 0.0
rill_kv_cache_free_blocks 90.0
rill_kv_cache_blocks 100.0
rill_streaming_sessions_open 2.0
rill_http_requests_total{endpoint="/v1/completions",status="200"} 7.0
rill_http_requests_total{endpoint="/v1/completions",status="500"} 1.0
rill_http_requests_total{endpoint="/v1/chat/completions",status="503"} 2.0
"""


def test_metrics_left_over_after_the_traffic_are_leaks_and_5xx_are_counted():
    metrics = parse_metrics(METRICS)
    assert leaks_of(metrics) == {"requests_running": 1, "requests_waiting": 0, "sessions_parked": 0,
                                 "kv_blocks_in_use": 10, "streaming_sessions_open": 2}
    assert server_5xx(metrics) == 3


def test_a_traceback_or_an_unclosed_realtime_connection_in_the_log_is_reported(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("x INFO rill.realtime: realtime connection sess_a opened (1 open)\n"
                   "x INFO rill.realtime: realtime connection sess_b opened (2 open)\n"
                   "x INFO rill.realtime: realtime connection sess_a closed\n"
                   "x ERROR rill.server: boom\nTraceback (most recent call last):\n  File 'x.py'\nValueError\n")
    scanned = scan_log(log)
    assert scanned["realtime_connections_open"] == 1
    assert scanned["errors"] == 1 and scanned["tracebacks"] == 1
    assert "ValueError" in scanned["first"][0]


def test_a_5xx_or_a_leak_fails_the_soak():
    args = build_parser().parse_args(["soak", "--seconds", "1"])
    clean = parse_metrics(METRICS.replace("running 1.0", "running 0.0").replace("free_blocks 90.0", "free_blocks 100.0")
                          .replace("open 2.0", "open 0.0").replace('status="500"} 1.0', 'status="500"} 0.0')
                          .replace('status="503"} 2.0', 'status="503"} 0.0'))
    out = {"model": "m", "traffic_s": 1.0, "tally": {"chat": Counter({"2xx": 3})}, "metrics": clean,
           "rss_series": [[0, 100.0], [1, 101.0]], "healthy": True, "problems": []}
    assert _result(args, out, True, scan_log(None))["passed"]
    assert not _result(args, {**out, "tally": {"chat": Counter({"2xx": 2, "5xx": 1})}}, True, scan_log(None))["passed"]
    assert not _result(args, {**out, "metrics": parse_metrics(METRICS)}, True, scan_log(None))["passed"]
    assert not _result(args, out, False, scan_log(None))["passed"]
