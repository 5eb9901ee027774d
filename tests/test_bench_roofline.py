"""`rill bench roofline` on the CPU at tiny shapes: the run end to end (ceilings, decode cells, prefill, the
profile of the cells that miss, JSON + PNG), and the floors' arithmetic against hand counts."""

import json
import random
from types import SimpleNamespace

import pytest
import torch

from rill.bench import main
from rill.bench import roofline_parts as parts
from rill.bench.common import make_random_model_dir
from rill.engine.model_runner import ModelRunner
from rill.engine.sampler import Sampler
from rill.models.loader import load


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return make_random_model_dir("random-small", tmp_path_factory.mktemp("cache"))


def test_roofline_runs_on_the_cpu_and_reports_each_cell_against_its_floor(small_dir, tmp_path):
    out = tmp_path / "roofline.json"
    argv = ["roofline", "--model", str(small_dir), "--device", "cpu", "--batch-sizes", "1,64", "--contexts", "16,40",
            "--prefill-tokens", "48", "--steps", "2", "--warmup", "0", "--repeats", "2", "--copy-mb", "8",
            "--matmul-size", "256", "--profile-cells", "1", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["device"] == "cpu" and r["dtype"] == "float32" and r["copy"]["bytes_per_s"] > 0
    assert [(d["batch"], d["context"]) for d in r["decode"]] == [(1, 16), (1, 40), (64, 16), (64, 40)]
    unpacked = parts.model_counts(load(small_dir, dtype="float32")[3])  # the runner packs (and empties) weights
    assert r["params"] == unpacked["params"]
    for d in r["decode"]:
        assert d["weight_bytes"] == parts.weight_bytes(unpacked, d["batch"])
        assert d["bandwidth_floor_s"] == pytest.approx((d["weight_bytes"] + d["kv_bytes"]) / r["copy"]["bytes_per_s"])
        assert d["flop_floor_s"] == pytest.approx(d["flops"] / r["matmul"]["flop_per_s"])
        assert d["floor_s"] == max(d["bandwidth_floor_s"], d["flop_floor_s"])
        assert d["pct_of_floor"] == pytest.approx(100 * d["floor_s"] / d["median_s"])
    (p,) = r["prefill"]
    assert p["tokens"] == 48 and p["floor_s"] == pytest.approx(p["flops"]["total"] / r["matmul"]["flop_per_s"])
    # the verdicts follow the cells (which way they go depends on how this machine runs a 256 x 256 product)
    worst = min(d["pct_of_floor"] for d in r["decode"] if d["batch"] >= 64)
    assert r["targets"]["decode"]["met"] == (worst >= 70)
    assert r["targets"]["prefill"]["met"] == (p["pct_of_floor"] >= 60)
    if worst < 70:  # a missed batch-64 cell is profiled first
        assert [c["cell"][:2] for c in r["profiles"]] == [["decode", 64]]
    assert all(c["top"] and 0 <= c["gap_share"] <= 1 for c in r["profiles"])
    assert out.with_suffix(".png").stat().st_size > 0


def test_the_floors_count_what_a_step_must_read_and_compute(small_dir):
    _, cfg, _, model = load(small_dir, dtype="float32")
    h, v, layers = 64, 512, 2  # random-small: 4 heads of 16, 2 KV heads, intermediate 128, untied head
    matrices = layers * (h * h + 2 * (h * 32) + h * h + 3 * h * 128)  # q, k, v, o, gate, up, down
    counts = parts.model_counts(model)
    assert counts["params"] == matrices + 2 * v * h + layers * 2 * h + h
    assert parts.weight_bytes(counts, batch=3) == 4 * (matrices + v * h + 3 * h + layers * 2 * h + h)
    assert parts.kv_bytes(cfg, 100) == layers * 100 * 2 * 2 * 16 * 4
    flops = parts.prefill_flops(counts, cfg, 10)
    assert flops["linear"] == 2 * 10 * matrices and flops["lm_head"] == 2 * v * h
    assert flops["attention"] == layers * 4 * 4 * 16 * 55  # 55 query-key pairs in a causal 10 x 10
    assert parts.decode_flops(counts, cfg, 3, 100) == 3 * (2 * (matrices + v * h) + layers * 4 * 4 * 16 * 100)
    slid = SimpleNamespace(num_kv_heads=1, head_dim=1, dtype=torch.float32, layer_windows=(4, None))
    assert parts.kv_bytes(slid, 10) == (4 + 10) * 2 * 4  # the sliding layer reads its window only


def test_decode_batches_give_each_sequence_blocks_of_its_own(small_dir):
    _, cfg, _, model = load(small_dir, dtype="float32")
    runner = ModelRunner(model, 3 * 3 + 1, 16, Sampler((), cfg.vocab_size))
    batch, seqs = parts.decode_batch(runner, 3, 40, cfg.vocab_size, random.Random(0))
    tables = [s.block_table for s in seqs]
    assert tables == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and batch.num_new_tokens == [1, 1, 1]
    assert all(s.num_computed_tokens == 39 for s in seqs)
    assert len(runner.execute(batch, seqs)) == 3  # the step runs and samples one token per sequence
