"""`rill bench kv-memory`: the block manager's KV bytes of one Gemma-3-shaped sequence against a
full-attention model of the same shape, written as JSON and a PNG (no model, no weights)."""

import json

from rill.bench import main


def test_kv_memory_reports_the_local_layers_holding_only_their_window(tmp_path):
    out = tmp_path / "kv.json"
    assert main(["kv-memory", "--shapes", "gemma-3-4b", "--length", "8192", "--chunk", "1024", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    hybrid, full = row["per_layer_windows"], row["full_attention"]
    token_layer_bytes = 2 * 4 * 256 * 2  # K and V, 4 KV heads of 256, bfloat16
    assert full["held_bytes"] == 8192 * 34 * token_layer_bytes
    # 5 global layers keep all 8192 tokens; 6 groups of 5 local layers (one slot padded) keep the window
    assert hybrid["held_bytes"] == (5 * 8192 + 30 * 1024) * token_layer_bytes
    assert hybrid["peak_bytes"] > hybrid["held_bytes"]  # a prefill chunk is held whole while computed
    assert row["ratio"] < 0.3 and [p[0] for p in hybrid["points"]] == list(range(1024, 8193, 1024))
    assert out.with_suffix(".png").stat().st_size > 0
