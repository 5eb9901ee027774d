"""`rill bench`: benchmarks that print a short summary and write JSON results plus a PNG plot.

    rill bench scheduler        per-step engine overhead with a no-op model (core and trio bridge)
    rill bench streaming-input  time to first token after streamed input vs. the whole prompt
    rill bench throughput       output tokens/s: rill's continuous batching vs. transformers generate
    rill bench serve            concurrent streaming clients against a server: latency vs. concurrency
    rill bench structured       engine step time at batch 1/16/64 with and without a JSON schema constraint
    rill bench tool-calls       decode tokens/s with and without the tool_choice "auto" grammar, and the calls it mends
    rill bench soak             minutes of mixed traffic against `rill serve`: no 5xx, no leaks, RSS growth
    rill bench scale            open sessions and concurrent SSE streams one process holds, memory per session
    rill bench transcribe       speech to text: rill vs. transformers and faster-whisper, real-time factor
    rill bench kv-memory        KV bytes of a 32k-token Gemma-3-shaped sequence: per-layer windows vs full attention
    rill bench voice            speech over /v1/realtime: transcript lag, end of speech to first token, streams
    rill bench speak            speech out: first audio and audio s/s at 1/8/16 concurrent vs kokoro's KPipeline
    rill bench turn-detection   semantic_vad vs server_vad on spoken questions, whole and cut: false commits, latency
    rill bench vision           a picture + question: vision encoder images/s, requests/s vs. transformers
    rill bench live-video       frames streamed over /v1/realtime, a question at the end: first token vs. whole clip
    rill bench cpu-attention    one layer's CPU decode attention: rill's C kernel vs the torch reference
    rill bench cpu-linear       float32 linear layers on the CPU: rill's C kernel vs oneDNN, decode and prefill rows
    rill bench roofline         engine decode and prefill steps as a % of the device's bandwidth and FLOP floors

Speed targets are reported here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import importlib

from rill.bench.common import apply_threads, png_path, write_json

# subcommand -> (module under rill.bench, help)
COMMANDS = {
    "scheduler": ("scheduler", "per-step overhead of scheduling and bookkeeping, no model"),
    "streaming-input": ("streaming_input", "TTFT after streamed input vs. the whole prompt at once"),
    "throughput": ("throughput", "output tokens/s vs. Hugging Face transformers generate"),
    "serve": ("serve", "concurrent streaming clients against a server: TTFT, inter-token latency, tokens/s"),
    "structured": ("structured", "engine step time with and without a JSON schema constraint, rill-tiny"),
    "tool-calls": ("tool_calls", "decode tokens/s with and without the tool_choice \"auto\" grammar over the Agents "
                   "SDK's tools, rill-tiny at temperature 1.0; the calls each side got wrong"),
    "soak": ("soak", "minutes of mixed traffic against rill serve: errors by kind, 5xx, leaks, RSS growth"),
    "scale": ("scale", "10,000 open sessions and 1,000 concurrent SSE streams in one rill serve: memory, errors"),
    "transcribe": ("transcribe", "speech to text at batch 1 and 16 concurrent: rill, transformers, faster-whisper"),
    "kv-memory": ("kv_memory", "KV bytes one long sequence holds: per-layer windows vs full attention, no model"),
    "voice": ("voice", "spoken questions over /v1/realtime: transcript lag, first answer token, concurrent streams"),
    "speak": ("speak", "speech out at 1, 8 and 16 concurrent requests: time to first audio and audio s/s, rill's "
              "Kokoro vs the kokoro package's KPipeline; the default voice's first audio as text streams in"),
    "turn-detection": ("turn_detection", "semantic_vad vs server_vad on held-out spoken questions, whole and cut "
                       "mid-phrase: false commits, end of speech to commit p50/p95"),
    "vision": ("vision", "a picture + question at 1 and 16 concurrent, and the vision encoder: rill vs. transformers"),
    "live-video": ("live_video", "a clip streamed at 2 fps over /v1/realtime, a question at its end: first token "
                   "vs. the whole clip in one request; frames/s sustained"),
    "cpu-attention": ("cpu_attention", "one layer's CPU decode attention: the C kernel vs the torch reference, "
                      "and the time to read the KV once"),
    "cpu-linear": ("cpu_linear", "float32 linear layers on the CPU at decode and prefill rows: the C kernel vs "
                   "oneDNN's packed GEMM, and the time to read the weights once"),
    "roofline": ("roofline", "engine decode steps and prefill against the device's copy-bandwidth and matmul floors"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rill bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, (module, text) in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=importlib.import_module(f"rill.bench.{module}").__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(module=module)
        importlib.import_module(f"rill.bench.{module}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bench = importlib.import_module(f"rill.bench.{args.module}")
    apply_threads(args)
    result = bench.run(args)
    import torch  # loaded by every benchmark already

    result["torch_threads"] = torch.get_num_threads()  # numbers depend on it; see --threads
    print(bench.summary(result))
    json_file = write_json(args.json, result)
    print(f"wrote {json_file}")
    _plot_or_say_why_not(bench, result, png_path(args))
    return 0 if result.get("passed", True) else 1  # soak fails on a 5xx or a leak


def _plot_or_say_why_not(bench, result: dict, png_file) -> None:
    """The PNG is optional (matplotlib is the `bench` extra): without it, say so instead of a
    traceback after minutes of measuring, and keep the exit status of the measurement."""
    try:
        bench.plot(result, png_file)
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] != "matplotlib":
            raise
        print(f"skipped {png_file}: matplotlib is not installed (pip install 'rill[bench]' for the plot)")
        return
    print(f"wrote {png_file}")
