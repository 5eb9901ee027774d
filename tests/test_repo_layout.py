"""bench-results/ holds results only (issue 54): the scripts that make them live in benchmarks/, and the
training recipes' interim weights never enter the tree (only the shipped weights, inside the package)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_SUFFIXES = {".json", ".jsonl", ".png", ".log", ".txt"}


def tracked(*paths: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return [Path(line) for line in out.stdout.splitlines()]


def test_bench_results_holds_only_result_files():
    files = tracked("bench-results")
    assert files, "bench-results/ should hold the measured results"
    strays = [str(f) for f in files if f.suffix not in RESULT_SUFFIXES]
    assert not strays, f"scripts and weights belong elsewhere (benchmarks/, the package): {strays}"


def test_no_weights_outside_the_package_assets():
    weights = [f for f in tracked(".") if f.suffix in {".safetensors", ".bin", ".pt", ".gguf"}]
    strays = [str(f) for f in weights if not str(f).startswith("src/rill/assets/")]
    assert not strays, f"only the shipped models' weights belong in the tree: {strays}"


def test_every_benchmark_script_has_a_line_in_its_readme():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = [f.name for f in tracked("benchmarks") if f.suffix in {".py", ".sh"}]
    assert scripts
    assert [name for name in scripts if f"`{name}" not in readme] == []
