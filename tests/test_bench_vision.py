"""`rill bench vision` at a tiny size: the default model (rill-tiny-vision, or its random-weight stand-in
in a build without it) and a random Qwen2.5-VL directory; every side answers the same pictures, rill's greedy
answers equal transformers', and the JSON + PNG come out. No timing assertions: speed is what the
benchmark reports."""

import json

import pytest

from helpers_vision import make_vl_model_dir
from rill.bench import main
from rill.bench import vision_set

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N = 3
MODES = ("batch1", "concurrent")


def run_bench(tmp_path, *argv) -> dict:
    out = tmp_path / "vision.json"
    assert main(["vision", "--n", str(N), "--concurrency", "2", "--max-tokens", "4", "--threads", "1",
                 "--json", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress", *argv]) == 0
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    return json.loads(out.read_text())


def assert_side_ran(side: dict, concurrency: int = 2) -> None:
    for mode in MODES:
        run = side[mode]
        assert run["requests"] == N == len(run["texts"]) and run["seconds"] > 0 and run["requests_per_s"] > 0
        assert run["latency"]["n"] == N and run["latency"]["p50_ms"] > 0
        assert run["agree_with_transformers"] == 1.0  # greedy, the same model: the same answers
    assert side["concurrent"].get("clients", side["concurrent"].get("batch_size")) == concurrency


@pytest.mark.slow
def test_vision_bench_default_model_runs_every_side_on_the_same_pictures(tmp_path, capsys):
    result = run_bench(tmp_path, "--rounds", "2")
    config = result["config"]
    shipped = (vision_set.SHIPPED_DIR / "config.json").is_file()
    assert config["model"] == "rill-tiny-vision" and config["random_weights"] is not shipped
    if not shipped:  # the stand-in says what it is, in the JSON and on stdout
        assert config["note"] == vision_set.RANDOM_NOTE and config["model_dir"].startswith(str(tmp_path / "cache"))
        assert f"note: {vision_set.RANDOM_NOTE}" in capsys.readouterr().out
    assert config["rounds"] == 2 and result["target_speedup"] == 2.0
    sides = result["sides"]
    assert set(sides) == {"rill", "rill_http", "transformers"}
    for side in sides.values():
        assert_side_ran(side)
        assert {side[m]["round"] for m in MODES} <= {0, 1}
    # The server runs the same engine: the same answers. Each round draws new pictures and each side
    # keeps its fastest round, so texts compare only within one round (agreement with transformers,
    # checked above over every round, covers the rest).
    for mode in MODES:
        if sides["rill_http"][mode]["round"] == sides["rill"][mode]["round"]:
            assert sides["rill_http"][mode]["texts"] == sides["rill"][mode]["texts"]
    encoder = result["encoder"]
    for name in ("rill", "transformers"):
        assert encoder[name]["batch1"]["images_per_call"] == 1 and encoder[name]["concurrent"]["images_per_call"] == 2
        assert all(encoder[name][m]["images_per_s"] > 0 for m in MODES)
    assert encoder["max_abs_diff"] < 1e-3  # the same vision tower in both
    assert set(result["speedups"]) == {"encoder_rill_vs_transformers", "rill_vs_transformers",
                                       "rill_http_vs_transformers"}
    assert all(v > 0 for s in result["speedups"].values() for v in s.values())
    assert set(result["target_met"]) == {"rill_vs_transformers", "rill_http_vs_transformers"}


@pytest.mark.slow
def test_vision_bench_runs_a_qwen2_5_vl_directory(tmp_path):
    model = make_vl_model_dir(tmp_path / "qwen2_5_vl", "qwen2_5_vl")
    result = run_bench(tmp_path, "--model", str(model), "--skip-http")
    assert result["config"]["random_weights"] is False and result["config"]["note"] is None
    assert result["sides"]["rill_http"] == {"status": "n/a", "reason": "skipped"}
    assert "rill_http_vs_transformers" not in result["speedups"]
    for name in ("rill", "transformers"):
        assert_side_ran(result["sides"][name])


def test_picture_sets_share_no_picture_so_no_cache_serves_one():
    from rill.bench.vision import picture_sets

    rounds = picture_sets(0, 3, 2)
    pngs = [p.png for r in rounds for key in ("batch1", "concurrent") for p in r[key]] + [rounds[0]["warmup"][0].png]
    assert len(pngs) == 13 and len(set(pngs)) == 13
    assert rounds[1]["warmup"] == rounds[0]["warmup"]  # untimed, and the same every round
    families = [p.family for p in rounds[0]["batch1"] + rounds[0]["concurrent"]]
    assert set(families) == {"colour", "count", "number", "left_of"}


def test_a_model_directory_without_config_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no model at"):
        vision_set.resolve_model(str(tmp_path), tmp_path / "cache", 0)


def test_vision_bench_takes_a_dtype_for_every_side(tmp_path):
    """--dtype (and --device, for a GPU) reach rill's engine, its vision tower and transformers:
    bfloat16 on the CPU here. Greedy answers may part in bfloat16, so only that every side answered."""
    model = make_vl_model_dir(tmp_path / "qwen2_5_vl", "qwen2_5_vl")
    result = run_bench(tmp_path, "--model", str(model), "--skip-http", "--dtype", "bfloat16")
    assert result["config"]["dtype"] == "bfloat16" and result["config"]["device"] == "cpu"
    for name in ("rill", "transformers"):
        for mode in MODES:
            assert result["sides"][name][mode]["requests"] == N
    assert result["encoder"]["max_abs_diff"] == result["encoder"]["max_abs_diff"]  # compared, and not NaN
