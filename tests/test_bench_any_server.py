"""Issue 33's "Also": `rill bench serve --base-url` drives a running OpenAI-compatible server by its
URL and served name, and a benchmark without matplotlib prints its summary and JSON, says why the PNG
was skipped, and exits 0 (it used to die with a traceback after minutes of measuring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.bench import _plot_or_say_why_not, build_parser
from rill.bench.serve import _bench_url
from rill.transports.http import ServerConfig

# matplotlib made unimportable the way a missing extra is: `import matplotlib` raises
# ModuleNotFoundError (None in sys.modules), whatever the venv has installed.
WITHOUT_MATPLOTLIB = ("import sys; sys.modules['matplotlib'] = None; "
                      "from rill.bench import main; sys.exit(main(sys.argv[1:]))")


def run_without_matplotlib(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, *argv], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_bench_without_matplotlib_prints_its_summary_and_says_the_png_was_skipped(tmp_path):
    out = tmp_path / "scheduler.json"
    done = run_without_matplotlib("scheduler", "--num-seqs", "4", "--steps", "3", "--threads", "1",
                                  "--json", str(out), "--cache-dir", str(tmp_path), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(out.read_text())
    assert result["benchmark"] == "scheduler" and result["config"]["gc_freeze"] is True  # as rill serve does
    assert not out.with_suffix(".png").exists()
    lines = done.stdout.splitlines()
    assert f"wrote {out}" in lines
    skipped = f"skipped {out.with_suffix('.png')}: matplotlib is not installed (pip install 'rill[bench]' for the plot)"
    assert skipped in lines
    assert lines.index(f"wrote {out}") > 0  # the summary came first


class FailingPlot:
    """Fault injection: a benchmark whose plot misses a module other than matplotlib."""

    @staticmethod
    def plot(result, path):
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")


def test_an_import_error_other_than_matplotlib_still_fails(tmp_path):
    # Only the plotting extra's absence is forgiven; a broken dependency elsewhere is not.
    with pytest.raises(ModuleNotFoundError, match="numpy"):
        _plot_or_say_why_not(FailingPlot, {}, tmp_path / "x.png")


async def test_serve_bench_drives_a_running_server_by_base_url_and_served_name():
    args = build_parser().parse_args(["serve", "--base-url", "unused", "--model", "other-name", "--concurrency", "2",
                                      "--requests-per-client", "1", "--prompt-tokens", "8", "--max-tokens", "4",
                                      "--no-progress"])
    assert args.url == "unused"  # --url is the same option
    server = ServerConfig(served_model_names=["first-name", "other-name"])
    async with running_server("rill-tiny", server) as running:
        out = await _bench_url(running.url, args, [2], None)
        assert running.all_kv_free
    assert out["model"] == "other-name" and out["url"] == running.url
    [level] = out["levels"]
    assert level["requests"] == 2 and level["output_tokens"] == 2 * 4


async def test_serve_bench_refuses_a_model_the_server_does_not_serve():
    args = build_parser().parse_args(["serve", "--base-url", "unused", "--model", "missing", "--no-progress"])
    async with running_server("rill-tiny", ServerConfig(served_model_names=["rill-tiny"])) as running:
        with pytest.raises(SystemExit, match="not 'missing'"):
            await _bench_url(running.url, args, [1], None)
