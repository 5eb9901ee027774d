"""Streaming input from the outside: `rill serve` flags become the server's settings, and
`rill bench streaming-input` runs over HTTP in both modes (tiny sizes; no timing asserted)."""

from __future__ import annotations

import json

import pytest

from rill.bench import main as bench_main
from rill.cli import build_parser
from rill.sessions import OutputMode
from rill.sessions.config import StartKind, from_args


def test_serve_flags_and_rill_variables_set_the_streaming_input_settings(monkeypatch):
    monkeypatch.setenv("RILL_MAX_CHUNK_BYTES", "1234")
    args = build_parser().parse_args(["serve", "--start-policy", "on_min_length:16", "--output-mode",
                                      "respond_per_chunk", "--max-open-sessions-per-key", "4",
                                      "--session-timeout-sec", "30", "--no-streaming-input"])
    config = from_args(args)
    assert config.start_policy.kind is StartKind.ON_MIN_LENGTH and config.start_policy.min_tokens == 16
    assert config.output_mode is OutputMode.RESPOND_PER_CHUNK and config.max_open_sessions_per_key == 4
    assert config.session_timeout_s == 30 and config.max_chunk_bytes == 1234 and not config.enabled
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--start-policy", "whenever"])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One random-small model for the module (made on first use)."""
    return tmp_path_factory.mktemp("bench-models")


@pytest.mark.parametrize("transport", ["a", "b"])
def test_the_streaming_input_bench_runs_over_http(tmp_path, cache_dir, transport):
    pytest.importorskip("matplotlib")
    pytest.importorskip("transformers")
    out = tmp_path / "result.json"
    argv = ["streaming-input", "--transport", transport, "--prompt-tokens", "48", "--chunks", "3", "--repeats", "1",
            "--kv-cache-gb", "0.01", "--threads", "1", "--json", str(out), "--cache-dir", str(cache_dir),
            "--no-progress"]
    assert bench_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["config"]["transport"] == transport and len(result["runs"]) == 1
    run = result["runs"][0]
    assert run["streamed_ttft_s"] > 0 and run["whole_ttft_s"] > 0 and result["ratio"] > 0
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
