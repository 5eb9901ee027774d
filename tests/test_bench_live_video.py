"""`rill bench live-video` at a tiny size on a random-weight Qwen2-VL directory: both sides answer, the
JSON has every figure, the PNG comes out (or is skipped with a clear line without matplotlib), the
progress bars show. No timing assertions: speed is what the benchmark reports."""

import json

import pytest

from helpers_server import one_torch_thread  # noqa: F401
from helpers_vision import make_vl_model_dir
from rill.bench import main
from rill.bench.live_video import draw_clip

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


def test_live_video_bench_streams_frames_and_compares_with_the_whole_clip(model_dir, tmp_path, capsys):
    out = tmp_path / "live-video.json"
    assert main(["live-video", "--model", str(model_dir), "--seconds", "2", "--size", "84x56", "--rounds", "2",
                 "--speed", "8", "--burst-frames", "6", "--max-tokens", "3", "--threads", "1",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    config = result["config"]
    assert config["frames"] == 4 and config["random_weights"] is False and config["note"] is None
    first = result["first_token_ms"]
    assert len(first["live"]) == len(first["whole"]) == 2 and all(v > 0 for v in first["live"] + first["whole"])
    assert result["ratio_live_over_whole"] == pytest.approx(first["live_p50"] / first["whole_p50"])
    assert result["target_ratio"] == 0.1 and isinstance(result["target_met"], bool)
    assert result["sustained_frames_per_s"] > 0 and result["frames_dropped_in_live_rounds"] == 0
    assert all(result["answers"]["live"]) and all(result["answers"]["whole"])
    captured = capsys.readouterr()
    assert "question -> first token" in captured.out and "live-video: live and whole rounds" in captured.err
    png = out.with_suffix(".png")
    if png.exists():
        assert png.read_bytes().startswith(PNG_MAGIC)
    else:
        assert "matplotlib is not installed" in captured.out


def test_the_clip_is_drawn_anew_for_each_seed_and_the_light_flashes():
    a, b = draw_clip(8, (84, 56), 1), draw_clip(8, (84, 56), 2)
    assert a[0].shape == (56, 84, 3) and not np_equal(a, b)
    reds = [bool(((f[..., 0] > 200) & (f[..., 1] < 60)).any()) for f in a + b]
    assert any(reds) and not all(reds)


def np_equal(a, b) -> bool:
    return all((x == y).all() for x, y in zip(a, b))
