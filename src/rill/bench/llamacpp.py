"""llama.cpp's `llama-server` as the third side of `rill bench throughput`.

The workload goes to llama-server's native `/completion` endpoint as token-id prompts (greedy,
ignore_eos, no prompt cache), every request sent at once, as rill gets them. Measured: wall time
from the first request sent to the last reply, after one untimed warm-up request.

Matched to rill: float32 weights (an f32 GGUF), a float32 K/V cache (-ctk/-ctv f32) of the same
bytes as rill's --kv-cache-gb, split into --parallel slots that each hold the workload's longest
request (llama.cpp reserves a slot's whole context up front; rill pages its KV), and -t/-tb set to
torch's intra-op thread count. With --llama-server this module starts the binary on 127.0.0.1 and a
free port and stops it afterwards; with --llama-cpp-url it uses a running server as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rill.bench.common import default_cache_dir, progress

LLAMA_MAX_SEQ = 256  # llama.cpp's compile-time cap on parallel sequences (src/llama-cparams.h)
SLOT_ALIGN = 256  # llama.cpp pads context sizes to 256 tokens
STARTUP_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 4 * 3600.0
POLL_INTERVAL_S = 0.2

# convert_hf_to_gguf.py with two patches that keep every token id as it is. It raises on a
# ByteLevel BPE whose pre-tokenizer hash it does not know (the random models' tokenizers are
# trained here, so none is known): the patch names it "gpt-2", the pre-tokenizer llama.cpp would
# use for text. The workload sends token ids, never text, so the choice changes no id. And it
# imports sentencepiece before looking for a tokenizer.model; without that file the patch answers
# FileNotFoundError, as the converter does when sentencepiece is installed.
_CONVERT_BOOTSTRAP = """
import runpy, sys
from pathlib import Path
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, str(Path(script).parent))
sys.path.insert(1, str(Path(script).parent / "gguf-py"))
from conversion.base import TextModel
known_pre, spm_vocab = TextModel.get_vocab_base_pre, TextModel._create_vocab_sentencepiece
def get_vocab_base_pre(self, tokenizer):
    try:
        return known_pre(self, tokenizer)
    except NotImplementedError:
        print("rill: unknown BPE pre-tokenizer hash; writing 'gpt-2' (token ids unchanged)", file=sys.stderr)
        return "gpt-2"
def create_vocab_sentencepiece(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return spm_vocab(self)
TextModel.get_vocab_base_pre, TextModel._create_vocab_sentencepiece = get_vocab_base_pre, create_vocab_sentencepiece
runpy.run_path(script, run_name="__main__")
"""


class LlamaCppError(RuntimeError):
    """The llama.cpp side failed (conversion, server start, or a request); the message says how."""


@dataclass(frozen=True)
class SlotPlan:
    """llama-server's slots: --parallel slots of ctx_per_slot tokens each (-c is their product)."""

    parallel: int
    ctx_per_slot: int

    @property
    def ctx_size(self) -> int:
        return self.parallel * self.ctx_per_slot


def add_arguments(p) -> None:
    g = p.add_argument_group("llama.cpp side (optional)")
    g.add_argument("--llama-server", type=Path, default=None, help="a llama-server binary to start on 127.0.0.1")
    g.add_argument("--llama-cpp-url", default=None, help="a running llama-server's base URL instead")
    g.add_argument("--llama-gguf", type=Path, default=None,
                   help="the GGUF for --llama-server (default: convert --model with --llama-convert)")
    g.add_argument("--llama-convert", type=Path, default=None,
                   help="llama.cpp's convert_hf_to_gguf.py; the GGUF is cached under --cache-dir/gguf")
    g.add_argument("--llama-outtype", choices=("f32", "f16"), default="f32", help="GGUF weights (default f32, as rill)")
    g.add_argument("--llama-parallel", type=int, default=None,
                   help="llama-server slots (default: as many as rill's KV bytes hold at the longest request)")


def wanted(args) -> bool:
    """True when a llama.cpp side was asked for; raises LlamaCppError on a path that cannot work,
    before the other sides spend their minutes."""
    if args.llama_server is None:
        return args.llama_cpp_url is not None
    for path in (args.llama_server, args.llama_gguf, args.llama_convert):
        if path is not None and not path.is_file():
            raise LlamaCppError(f"{path}: no such file")
    if not os.access(args.llama_server, os.X_OK):
        raise LlamaCppError(f"{args.llama_server}: not executable")
    return True


# -- requests and replies (no I/O) ---------------------------------------------------------------


def completion_body(prompt_token_ids: Sequence[int], max_tokens: int) -> dict:
    """A native /completion request for exactly max_tokens greedy tokens after these token ids."""
    return {"prompt": list(prompt_token_ids), "n_predict": max_tokens, "ignore_eos": True, "temperature": 0,
            "cache_prompt": False, "return_tokens": True, "stream": False}


def parse_completion(reply: dict, max_tokens: int) -> int:
    """The output tokens of a /completion reply; raises LlamaCppError unless all max_tokens came back."""
    if "error" in reply:
        raise LlamaCppError(f"llama-server error: {reply['error']}")
    num_tokens = reply.get("tokens_predicted")
    if reply.get("truncated") or num_tokens != max_tokens or len(reply.get("tokens", ())) != max_tokens:
        raise LlamaCppError(f"asked for {max_tokens} tokens, got tokens_predicted={num_tokens}, "
                            f"{len(reply.get('tokens', ()))} token ids, stop_type={reply.get('stop_type')!r}, "
                            f"truncated={reply.get('truncated')}")
    return num_tokens


def plan_slots(kv_bytes: int, kv_bytes_per_token: int, longest_request: int, num_requests: int) -> SlotPlan:
    """As many slots as kv_bytes holds when every slot fits the longest request, at most one per request."""
    ctx_per_slot = -(-longest_request // SLOT_ALIGN) * SLOT_ALIGN
    fit = kv_bytes // (kv_bytes_per_token * ctx_per_slot)
    if fit < 1:
        raise LlamaCppError(f"{kv_bytes} KV bytes hold no slot of {ctx_per_slot} tokens")
    return SlotPlan(min(fit, num_requests, LLAMA_MAX_SEQ), ctx_per_slot)


def server_command(binary: Path, gguf: Path, port: int, plan: SlotPlan, threads: int,
                   kv_type: str = "f32") -> list[str]:
    """llama-server on 127.0.0.1: continuous batching over plan.parallel slots, no prompt cache, no web UI."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(plan.parallel), "-c", str(plan.ctx_size), "--no-kv-unified", "-cb",
            "-t", str(threads), "-tb", str(threads), "-ctk", kv_type, "-ctv", kv_type,
            "--cache-ram", "0", "--no-webui", "-fit", "off"]


# -- HTTP ----------------------------------------------------------------------------------------


def post_json(url: str, body: dict, timeout_s: float = REQUEST_TIMEOUT_S) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        raise LlamaCppError(f"POST {url}: HTTP {e.code}: {e.read()[:500]!r}") from e
    except (urllib.error.URLError, OSError) as e:
        raise LlamaCppError(f"POST {url}: {e}") from e


def get_json(url: str, timeout_s: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.load(response)


def run_workload(url: str, workload: Sequence, *, disable_progress: bool = False) -> dict:
    """Every request at once; the server queues what its slots cannot take yet."""
    first = workload[0]
    parse_completion(post_json(f"{url}/completion", completion_body(first.prompt_token_ids[:8], 4)), 4)  # warm-up
    tokens = 0
    total = sum(r.max_tokens for r in workload)
    pool = ThreadPoolExecutor(max_workers=len(workload))
    # No `with`: on a failure, return at once (the caller stops the server, which ends the rest).
    try:
        with progress(total=total, desc="llama.cpp tokens", disable=disable_progress) as bar:
            t0 = time.perf_counter()
            for future in as_completed([pool.submit(_complete, url, r) for r in workload]):
                num_tokens = future.result()
                tokens += num_tokens
                bar.update(num_tokens)
            seconds = time.perf_counter() - t0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {"output_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def _complete(url: str, request) -> int:
    body = completion_body(request.prompt_token_ids, request.max_tokens)
    return parse_completion(post_json(f"{url}/completion", body), request.max_tokens)


# -- the server process --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(command: list[str], port: int, log_path: Path,
                   startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[str]:
    """Start the command, yield its base URL once /health answers 200, and always stop it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log, _sigterm_unwinds():
        try:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as e:
            raise LlamaCppError(f"cannot start {command[0]}: {e}") from e
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, proc, log_path, startup_timeout_s)
            yield url
        finally:
            _stop(proc)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Python's default SIGTERM (`timeout`, `kill`) exits without running finally blocks, which would
    leave the server running; while this is active SIGTERM raises SystemExit instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LlamaCppError(f"llama-server exited with {proc.returncode}; log {log_path}:\n{_tail(log_path)}")
        try:
            if get_json(f"{url}/health", timeout_s=2.0).get("status") == "ok":
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass  # still loading (503) or not listening yet
        time.sleep(POLL_INTERVAL_S)
    raise LlamaCppError(f"llama-server not healthy after {timeout_s:.0f} s; log {log_path}:\n{_tail(log_path)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: Path, num_lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])


def server_version(binary: Path) -> str:
    """`llama-server --version`'s first line, e.g. 'version: 1 (0c1e570)'."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    lines = (out.stdout + out.stderr).strip().splitlines()
    return lines[0] if lines else ""


# -- the model -----------------------------------------------------------------------------------


def gguf_path(model_dir: Path, outtype: str, cache_dir: Path | None) -> Path:
    """Where the converted model is cached: named for the directory, its absolute path and the outtype."""
    digest = hashlib.sha1(str(model_dir.resolve()).encode()).hexdigest()[:8]
    return (cache_dir or default_cache_dir()) / "gguf" / f"{model_dir.name}-{digest}-{outtype}.gguf"


def convert_to_gguf(model_dir: Path, convert_script: Path, out: Path, outtype: str) -> Path:
    """Convert once (into a temporary file, then renamed); later calls reuse the file."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}-", suffix=".gguf", dir=out.parent)
    os.close(fd)
    command = [sys.executable, "-c", _CONVERT_BOOTSTRAP, str(convert_script), str(model_dir),
               "--outtype", outtype, "--outfile", tmp]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise LlamaCppError(f"{convert_script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


# -- the side ------------------------------------------------------------------------------------


def run_llamacpp(model_dir: str, workload: Sequence, args, kv_bytes_per_token: int, threads: int) -> dict:
    """The llama.cpp side: a running server (--llama-cpp-url) or one started here (--llama-server)."""
    if args.llama_cpp_url:
        url = args.llama_cpp_url.rstrip("/")
        return {"url": url, "props": _props(url), **run_workload(url, workload, disable_progress=args.no_progress)}
    gguf = args.llama_gguf or _converted(Path(model_dir), args)
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in workload)
    plan = plan_slots(int(args.kv_cache_gb * (1 << 30)), kv_bytes_per_token, longest, len(workload))
    if args.llama_parallel is not None:
        plan = SlotPlan(args.llama_parallel, plan.ctx_per_slot)
    port = free_port()
    command = server_command(args.llama_server, gguf, port, plan, threads)
    with running_server(command, port, args.json.with_suffix(".llama-server.log")) as url:
        measured = run_workload(url, workload, disable_progress=args.no_progress)
    return {"version": server_version(args.llama_server), "gguf": str(gguf), "threads": threads, **asdict(plan),
            "kv_type": "f32", "command": command, **measured}


def _converted(model_dir: Path, args) -> Path:
    if args.llama_convert is None:
        raise LlamaCppError("--llama-server needs --llama-gguf FILE or --llama-convert convert_hf_to_gguf.py")
    return convert_to_gguf(model_dir, args.llama_convert, gguf_path(model_dir, args.llama_outtype, args.cache_dir),
                           args.llama_outtype)


def _props(url: str) -> dict:
    try:
        props = get_json(f"{url}/props")
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    return {k: props.get(k) for k in ("build_info", "total_slots", "model_path")}
