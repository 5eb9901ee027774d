"""`rill bench` smoke tests: each subcommand runs end to end at a tiny size and writes JSON + PNG.

No timing assertions: speed targets are what the benchmarks report, never what tests check.
"""

import argparse
import json

import pytest

from rill.bench import main
from rill.bench.common import percentile, summarize_ms
from rill.bench.streaming_input import split
from rill.bench.throughput import make_workload

pytest.importorskip("matplotlib")
pytest.importorskip("transformers")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One random-small model for the whole module (made on first use)."""
    return tmp_path_factory.mktemp("bench-models")


def run_bench(tmp_path, cache_dir, *argv) -> dict:
    out = tmp_path / "result.json"
    assert main([*argv, "--json", str(out), "--cache-dir", str(cache_dir), "--no-progress"]) == 0
    assert out.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)
    return json.loads(out.read_text())


def assert_timing(stats: dict, n: int | None = None) -> None:
    assert stats["n"] > 0 if n is None else stats["n"] == n
    for key in ("mean_ms", "p50_ms", "p99_ms", "min_ms", "max_ms"):
        assert stats[key] > 0


def test_scheduler_bench_times_the_core_and_the_bridge(tmp_path, cache_dir):
    # --no-gc-freeze: this runs in the test process, whose heap a freeze would pin for the rest of the run
    result = run_bench(tmp_path, cache_dir, "scheduler", "--num-seqs", "8", "--steps", "5", "--no-gc-freeze",
                       "--max-steps-ahead", "2")
    assert result["benchmark"] == "scheduler" and result["config"]["gc_freeze"] is False
    assert result["config"]["max_steps_ahead"] == 2
    assert_timing(result["core"], n=5)
    assert_timing(result["bridge"])
    assert_timing(result["bridge"]["delivery_latency"])
    # Every request's every token reached its channel.
    assert result["bridge"]["tokens_delivered"] > 8 * 5
    assert len(result["series_ms"]["core"]) == 5


def test_streaming_input_bench_compares_streamed_and_whole_ttft(tmp_path, cache_dir):
    result = run_bench(tmp_path, cache_dir, "streaming-input", "--prompt-tokens", "200", "--chunks", "4",
                       "--repeats", "2", "--kv-cache-gb", "0.01")
    assert result["config"]["prompt_tokens"] == 200 and result["config"]["chunks"] == 4
    assert_timing(result["streamed_ttft"], n=2)
    assert_timing(result["whole_ttft"], n=2)
    assert result["ratio"] > 0
    assert len(result["runs"]) == 2


def test_throughput_bench_runs_the_same_workload_on_rill_and_transformers(tmp_path, cache_dir):
    result = run_bench(tmp_path, cache_dir, "throughput", "--model", "random-small", "--num-requests", "4",
                       "--min-prompt", "4", "--max-prompt", "24", "--min-output", "2", "--max-output", "8",
                       "--hf-batch-size", "3", "--kv-cache-gb", "0.01")
    expected = result["workload"]["output_tokens"]
    assert result["workload"]["num_requests"] == 4
    for side in ("rill", "hf"):
        assert result[side]["output_tokens"] == expected  # both sides did exactly the workload's tokens
        assert result[side]["seconds"] > 0 and result[side]["tokens_per_s"] > 0
    assert result["hf"]["num_batches"] == 2
    assert result["hf"]["generated_tokens_incl_padding"] >= expected
    assert result["speedup"] > 0


def test_throughput_bench_can_skip_transformers(tmp_path, cache_dir):
    result = run_bench(tmp_path, cache_dir, "throughput", "--model", "random-small", "--num-requests", "2",
                       "--min-prompt", "4", "--max-prompt", "8", "--min-output", "2", "--max-output", "4",
                       "--skip-hf", "--kv-cache-gb", "0.01")
    assert result["hf"] is None and result["speedup"] is None
    assert result["rill"]["output_tokens"] == result["workload"]["output_tokens"]


def test_workload_is_fixed_by_the_seed_and_within_bounds():
    args = argparse.Namespace(num_requests=20, seed=3, min_prompt=5, max_prompt=9, min_output=2, max_output=4)
    a, b = make_workload(args, 100), make_workload(args, 100)
    assert a == b
    assert all(5 <= len(r.prompt_token_ids) <= 9 and 2 <= r.max_tokens <= 4 for r in a)
    assert all(3 <= t < 100 for r in a for t in r.prompt_token_ids)  # no special-token ids
    assert make_workload(argparse.Namespace(**{**vars(args), "seed": 4}), 100) != a


def test_split_keeps_every_token_in_order():
    ids = list(range(103))
    chunks = split(ids, 10)
    assert len(chunks) == 10 and all(chunks)
    assert [t for c in chunks for t in c] == ids
    assert split([1, 2], 5) == [[1], [2]]


def test_latency_summary():
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 101)), 99) == 99
    s = summarize_ms([0.001, 0.003])
    assert s["n"] == 2 and s["mean_ms"] == pytest.approx(2.0) and s["max_ms"] == pytest.approx(3.0)
    assert summarize_ms([])["mean_ms"] is None


def test_serve_bench_runs_clients_against_an_in_process_server(tmp_path, cache_dir):
    result = run_bench(tmp_path, cache_dir, "serve", "--concurrency", "1,3", "--requests-per-client", "2",
                       "--prompt-tokens", "16", "--max-tokens", "6", "--threads", "1")
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 3]
    for level, clients in zip(result["levels"], (1, 3)):
        assert level["requests"] == 2 * clients
        assert level["output_tokens"] == 6 * 2 * clients  # ignore_eos: every request ran to max_tokens
        assert 0 < level["ttft_p50_ms"] <= level["ttft_p99_ms"]
        assert 0 < level["itl_p50_ms"] <= level["itl_p99_ms"]


def test_serve_bench_spreads_clients_over_processes(tmp_path, cache_dir):
    """--client-processes: the same workload from several processes (one Python process parsing hundreds
    of streams was slower than a GPU server); every request is counted once, timed from one start."""
    result = run_bench(tmp_path, cache_dir, "serve", "--concurrency", "1,3", "--requests-per-client", "2",
                       "--prompt-tokens", "16", "--max-tokens", "6", "--threads", "1", "--client-processes", "2")
    assert result["config"]["client_processes"] == 2
    for level, clients in zip(result["levels"], (1, 3)):  # a level of one client runs in this process
        assert level["requests"] == 2 * clients and level["output_tokens"] == 6 * 2 * clients
        assert 0 < level["ttft_p50_ms"] <= level["ttft_p99_ms"] and 0 < level["wall_s"] < 60
    with pytest.raises(SystemExit, match="at least 1"):
        main(["serve", "--client-processes", "0", "--no-progress"])


def test_scheduler_bench_outputs_outlast_the_warm_up_at_1024_requests():
    # Regression: at 1,024 x 64-token prompts the requests that decode early take a step's budget from
    # the prefill, the warm-up ran past the outputs' length, and a timed step lost 32 finished requests.
    from argparse import Namespace

    from rill.bench.scheduler import _max_tokens

    args = Namespace(steps=300, num_seqs=1024, prompt_tokens=64)
    assert _max_tokens(args) >= 300 + 1024 * 64 // (2048 - 1024)
    assert _max_tokens(Namespace(steps=10, num_seqs=4000, prompt_tokens=16)) >= 10 + 4000 * 16 // 64


def test_a_random_qwen2_tokenizer_splits_numbers_as_qwen2_and_transformers_do():
    """vLLM's benchmark client sends text; transformers 5 (in vLLM, and so its server) tokenizes a qwen2
    directory with Qwen2's pre-tokenizer whatever tokenizer.json says, so the random Qwen2's tokenizer.json
    must say the same, or the two servers prefill different token counts for the same prompts."""
    from tokenizers import Regex, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from rill.bench.common import QWEN2_PATTERN, _train_tokenizer

    assert QWEN2_PATTERN == PRETOKENIZE_REGEX
    qwen2 = pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated")
    text = "pale jahi 971 344, it's 12:30\n\n  x"
    ours = _train_tokenizer(512, 0, qwen2=True).pre_tokenizer.pre_tokenize_str(text)
    assert [piece for piece, _ in ours] == [
        piece.replace(" ", "Ġ").replace("\n", "Ċ") for piece, _ in qwen2.pre_tokenize_str(text)]
    assert ("9", (10, 11)) in ours  # digits one by one
    llama = _train_tokenizer(512, 0).pre_tokenizer.pre_tokenize_str(text)
    assert ("Ġ971", (9, 13)) in llama  # the Llama-shaped random models keep GPT-2's rule
