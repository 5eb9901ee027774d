"""The llama.cpp side of `rill bench throughput`, without llama.cpp.

CI has no llama-server binary and no llama.cpp sources, so two fakes stand in for them and are
named so: FAKE_LLAMA_SERVER (a few lines of http.server speaking /health and /completion) and
FAKE_CONVERTER (a convert_hf_to_gguf.py whose TextModel fails the way the real one does on an
unknown tokenizer). Everything else here is the real code.
"""

import argparse
import signal
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest

from rill.bench import llamacpp
from rill.bench.llamacpp import LlamaCppError, SlotPlan
from rill.bench.throughput import Request, summary

# What llama-server's /completion returns without streaming (tools/server/server-task.cpp,
# to_json_non_oaicompat), trimmed to the fields that matter here.
CANNED_REPLY = {
    "index": 0, "content": "zo ba", "tokens": [17, 250, 9], "id_slot": 3, "stop": True,
    "tokens_predicted": 3, "tokens_evaluated": 40, "truncated": False, "stop_type": "limit",
    "stopping_word": "", "tokens_cached": 42, "timings": {"predicted_n": 3, "prompt_n": 40},
}

FAKE_LLAMA_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"status": "ok"})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["n_predict"] if body["ignore_eos"] and not body["cache_prompt"] else 1
        self.reply({"tokens": [5] * n, "tokens_predicted": n, "truncated": False, "stop_type": "limit"})
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

FAKE_CONVERTER = {
    "conversion/__init__.py": "",
    "conversion/base.py": """
class TextModel:
    def __init__(self, dir_model):
        self.dir_model = dir_model
    def get_vocab_base_pre(self, tokenizer):
        raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")
    def _create_vocab_sentencepiece(self):
        raise ModuleNotFoundError("No module named 'sentencepiece'")
""",
    "convert_hf_to_gguf.py": """
import sys
from pathlib import Path
from conversion.base import TextModel
model = TextModel(Path(sys.argv[1]))
try:
    model._create_vocab_sentencepiece()
except FileNotFoundError:
    pass
out = Path(sys.argv[sys.argv.index("--outfile") + 1])
out.write_text(model.get_vocab_base_pre(None) + " " + sys.argv[sys.argv.index("--outtype") + 1])
""",
}


def bench_args(**given) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    llamacpp.add_arguments(parser)
    return parser.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in given.items()])


def test_wanted_only_with_a_server_or_url_and_refuses_a_missing_binary_up_front(tmp_path):
    assert not llamacpp.wanted(bench_args())
    assert llamacpp.wanted(bench_args(llama_cpp_url="http://127.0.0.1:8080"))
    assert llamacpp.wanted(bench_args(llama_server=sys.executable))
    with pytest.raises(LlamaCppError, match="no such file"):
        llamacpp.wanted(bench_args(llama_server=tmp_path / "llama-server"))
    with pytest.raises(LlamaCppError, match="no such file"):
        llamacpp.wanted(bench_args(llama_server=sys.executable, llama_gguf=tmp_path / "m.gguf"))


def test_completion_body_asks_for_exact_greedy_tokens_after_the_ids():
    body = llamacpp.completion_body((5, 6, 7), 12)
    assert body["prompt"] == [5, 6, 7]
    assert body["n_predict"] == 12
    assert body["ignore_eos"] is True and body["temperature"] == 0
    assert body["cache_prompt"] is False and body["stream"] is False and body["return_tokens"] is True


def test_parse_completion_counts_the_tokens_of_a_canned_reply():
    assert llamacpp.parse_completion(CANNED_REPLY, 3) == 3


@pytest.mark.parametrize("change", [
    {"tokens_predicted": 2, "tokens": [1, 2], "stop_type": "eos"},
    {"truncated": True},
    {"tokens": [1, 2]},
])
def test_parse_completion_rejects_a_reply_short_of_max_tokens(change):
    with pytest.raises(LlamaCppError, match="asked for 3 tokens"):
        llamacpp.parse_completion({**CANNED_REPLY, **change}, 3)


def test_parse_completion_reports_the_servers_error():
    with pytest.raises(LlamaCppError, match="context size"):
        llamacpp.parse_completion({"error": {"code": 400, "message": "exceeds the context size"}}, 3)


def test_plan_slots_gives_llamacpp_rills_kv_bytes_in_slots_that_fit_the_longest_request():
    # random-100m in float32: 2 * 12 layers * 4 KV heads * 64 dims * 4 bytes per token.
    plan = llamacpp.plan_slots(2 << 30, 24_576, 1024 + 256, 200)
    assert plan == SlotPlan(parallel=68, ctx_per_slot=1280)
    assert plan.ctx_size * 24_576 <= 2 << 30


def test_plan_slots_rounds_slots_up_and_caps_them_at_one_per_request():
    assert llamacpp.plan_slots(2 << 30, 2_560, 300, 10) == SlotPlan(parallel=10, ctx_per_slot=512)
    with pytest.raises(LlamaCppError, match="no slot"):
        llamacpp.plan_slots(1 << 20, 24_576, 1280, 10)


def test_server_command_binds_localhost_with_rills_threads_and_a_float32_cache():
    command = llamacpp.server_command(Path("/bin/llama-server"), Path("m.gguf"), 4321, SlotPlan(4, 512), threads=2)
    for lone in ("--no-kv-unified", "-cb", "--no-webui"):
        assert lone in command
        command.remove(lone)
    flags = dict(zip(command[1::2], command[2::2]))  # the rest are flag-value pairs
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "4321"
    assert flags["-np"] == "4" and flags["-c"] == "2048"
    assert flags["-t"] == flags["-tb"] == "2"
    assert flags["-ctk"] == flags["-ctv"] == "f32"
    assert flags["--cache-ram"] == "0"


def test_gguf_path_differs_per_model_directory_and_outtype(tmp_path):
    a, b = tmp_path / "a" / "model", tmp_path / "b" / "model"
    paths = {llamacpp.gguf_path(d, t, tmp_path) for d in (a, b) for t in ("f32", "f16")}
    assert len(paths) == 4
    assert all(p.parent == tmp_path / "gguf" and p.name.startswith("model-") for p in paths)


def write_fake_converter(root: Path, **replace: str) -> Path:
    """FAKE_CONVERTER's files under root (with any file's text replaced); returns the script."""
    for name, text in {**FAKE_CONVERTER, **replace}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "convert_hf_to_gguf.py"


def test_convert_with_a_fake_converter_names_an_unknown_pre_tokenizer_gpt2_and_skips_a_missing_sentencepiece(tmp_path):
    script = write_fake_converter(tmp_path / "llama.cpp")
    out = tmp_path / "gguf" / "m.gguf"
    assert llamacpp.convert_to_gguf(tmp_path, script, out, "f32") == out
    assert out.read_text() == "gpt-2 f32"
    assert [p.name for p in out.parent.iterdir()] == ["m.gguf"]  # no temporary file left


def test_convert_failure_of_a_fake_converter_carries_its_stderr(tmp_path):
    script = write_fake_converter(tmp_path, **{"convert_hf_to_gguf.py": "raise SystemExit('no such architecture')"})
    with pytest.raises(LlamaCppError, match="no such architecture"):
        llamacpp.convert_to_gguf(tmp_path, script, tmp_path / "gguf" / "m.gguf", "f32")


def test_workload_against_fake_llama_server_counts_every_token_and_stops_it(tmp_path):
    port = llamacpp.free_port()
    command = [sys.executable, "-c", FAKE_LLAMA_SERVER, "--port", str(port)]
    workload = [Request([3, 4, 5], 7), Request([6] * 20, 2), Request([9], 30)]
    with llamacpp.running_server(command, port, tmp_path / "server.log") as url:
        result = llamacpp.run_workload(url, workload, disable_progress=True)
    assert result["output_tokens"] == 39
    assert result["tokens_per_s"] > 0
    with pytest.raises((urllib.error.URLError, OSError)):
        llamacpp.get_json(f"{url}/health", timeout_s=2.0)


BENCH_HOLDING_A_SERVER = """
import sys, time
from pathlib import Path
from rill.bench import llamacpp
with llamacpp.running_server(sys.argv[3:], int(sys.argv[1]), Path(sys.argv[2])):
    print("up", flush=True)
    time.sleep(600)
"""


def test_sigterm_to_the_benchmark_stops_the_fake_server_too(tmp_path):
    port = llamacpp.free_port()
    server = [sys.executable, "-c", FAKE_LLAMA_SERVER, "--port", str(port)]
    bench = subprocess.Popen([sys.executable, "-c", BENCH_HOLDING_A_SERVER, str(port), str(tmp_path / "log"), *server],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout.readline() == "up\n"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        bench.kill()
    with pytest.raises((urllib.error.URLError, OSError)):
        llamacpp.get_json(f"http://127.0.0.1:{port}/health", timeout_s=2.0)


def test_a_fake_server_that_exits_at_start_fails_with_its_log(tmp_path):
    command = [sys.executable, "-c", "print('error: failed to load model'); raise SystemExit(1)"]
    with pytest.raises(LlamaCppError, match="failed to load model"):
        with llamacpp.running_server(command, llamacpp.free_port(), tmp_path / "server.log"):
            pass


def test_summary_reports_llamacpp_beside_rill_or_what_failed():
    result = {
        "workload": {"num_requests": 2, "prompt_tokens": 10, "output_tokens": 8}, "config": {"model": "m"},
        "rill": {"tokens_per_s": 40.0, "seconds": 0.2, "steps": 5, "preemptions": 0}, "hf": None,
        "llamacpp": {"tokens_per_s": 20.0, "seconds": 0.4, "parallel": 2, "ctx_per_slot": 256},
        "speedup_vs_llamacpp": 2.0,
    }
    line = "llama.cpp:    20.0 output tokens/s (0.40 s, 2 slots x 256 tokens); rill / llama.cpp 2.00x"
    assert line in summary(result)
    result.update(llamacpp={"error": "llama-server exited with 1"}, speedup_vs_llamacpp=None)
    assert "llama.cpp:    failed: llama-server exited with 1" in summary(result)
