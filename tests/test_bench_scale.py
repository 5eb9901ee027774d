"""`rill bench scale` on a small scale against a real `rill serve` subprocess: every session opens,
every stream ends with [DONE], the memory per session is measured and nothing is left behind."""

from __future__ import annotations

import json

import pytest

from rill.bench import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_scale_opens_every_session_ends_every_stream_and_leaves_nothing(tmp_path):
    pytest.importorskip("matplotlib")  # the PNG
    out = tmp_path / "scale.json"
    assert main(["scale", "--sessions", "40", "--streams", "20", "--max-tokens", "4", "--no-progress",
                 "--json", str(out), "--threads", "1"]) == 0
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    result = json.loads(out.read_text())
    assert result["sessions_open"] == 40 and result["sessions_refused"] == 0
    assert result["stream_outcomes"] == {"done": 20, "error": 0, "incomplete": 0}
    assert not any(result["leaks"].values()) and result["passed"]
    assert result["rss_mb"]["sessions_open"] > 0 and result["kb_per_open_session"] is not None
