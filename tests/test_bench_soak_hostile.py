"""`rill bench soak --hostile-workers`: the hostile mix (slow readers, realtime leavers, fan-out, large
bodies) beside the normal traffic against a running server; every hostile kind is sent, none gets a
5xx, nothing is left behind, and the normal requests' latency is reported."""

from __future__ import annotations

from collections import Counter

from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.bench import build_parser
from rill.bench.soak import _result, scan_log, soak, summary
from rill.bench.soak_hostile import HOSTILE_KINDS, percentiles
from rill.sessions import StreamingInputConfig
from rill.transports.http import ServerConfig

ARGS = ["soak", "--seconds", "6", "--concurrency", "2", "--hostile-workers", "3", "--hostile-hold-s", "1",
        "--session-timeout-s", "2", "--sample-s", "0.5", "--request-timeout-s", "30", "--no-progress", "--url", "x"]


async def test_hostile_mix_beside_normal_traffic_leaves_nothing_and_reports_latency():
    args = build_parser().parse_args(ARGS)
    server = ServerConfig(max_body_bytes=args.max_body_bytes, served_model_names=["rill-tiny"],
                          streaming_input=StreamingInputConfig(session_timeout_s=args.session_timeout_s))
    async with running_server("rill-tiny", server) as running:
        out = await soak(args, running.url, None)
        assert running.all_kv_free and not running.engine.core.requests
    result = _result(args, out, True, scan_log(None))
    hostile = result["hostile"]["by_kind"]
    assert set(hostile) == set(HOSTILE_KINDS) and all(sum(c.values()) > 0 for c in hostile.values()), hostile
    assert not any("5xx" in c or "timeout" in c for c in hostile.values()), hostile
    assert set(hostile["large_body"]) <= {"413", "dropped"}  # refused, never read whole
    assert result["num_5xx"] == result["server_5xx"] == result["num_leaked"] == 0, result["problems"]
    assert result["passed"]
    latency = result["normal_latency_s"]
    assert latency["n"] > 0 and 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    assert "hostile mix (3 workers)" in summary(result) and "p99" in summary(result)


def test_percentiles_and_a_result_without_a_hostile_mix():
    assert percentiles([]) == {"n": 0, "p50": None, "p99": None, "max": None}
    assert percentiles([i / 100 for i in range(1, 101)]) == {"n": 100, "p50": 0.51, "p99": 1.0, "max": 1.0}
    args = build_parser().parse_args(["soak", "--seconds", "1"])
    metrics = {"rill_num_requests_running": 0.0, "rill_num_requests_waiting": 0.0, "rill_num_sessions_parked": 0.0,
               "rill_kv_cache_blocks": 10.0, "rill_kv_cache_free_blocks": 10.0}
    out = {"model": "m", "traffic_s": 1.0, "tally": {"chat": Counter({"2xx": 1})}, "metrics": metrics,
           "rss_series": [[0, 1.0]], "healthy": True, "problems": []}
    result = _result(args, out, True, scan_log(None))
    assert result["hostile"]["workers"] == 0 and result["normal_latency_s"]["n"] == 0 and result["passed"]
