"""`rill bench throughput`: output tokens per second on a fixed mixed workload.

The workload: --num-requests requests with prompts of random token ids and lengths drawn
uniformly in [--min-prompt, --max-prompt], each asking for a fixed number of output tokens
drawn in [--min-output, --max-output] (greedy, ignore_eos, so every request's length is fixed).
The same requests go to both sides, which load the same weights in float32:

rill: EngineCore with every request added at once (continuous batching, chunked prefill),
      stepped until all finish. Measured: wall time from the first add to the last token.
hf:   transformers `generate` on static batches of --hf-batch-size requests in workload order,
      left-padded, greedy, max_new_tokens = the batch's largest request. Only each request's
      own tokens count as output. Measured: wall time of all batches.
llama.cpp (with --llama-server or --llama-cpp-url): llama-server's /completion, every request at
      once, on continuous batching; see rill.bench.llamacpp for how it is matched to rill.

Model loading and one short warm-up generation on each side are not timed.
Target (from the issue): rill >= 2x the transformers output tokens/s.
"""

from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass
from pathlib import Path

from rill.bench import llamacpp
from rill.bench.common import add_common_args, progress, random_token_ids, resolve_model, save_plot

NAME = "throughput"
TARGET_SPEEDUP = 2.0


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    max_tokens: int


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--model", default="random-100m", help="random-100m | random-small | rill-tiny | PATH (default random-100m)")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--min-output", type=int, default=16)
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--hf-batch-size", type=int, default=16, help="static batch size for transformers (default 16)")
    p.add_argument("--skip-hf", action="store_true", help="run rill only")
    p.add_argument("--kv-cache-gb", type=float, default=2.0, help="rill's KV budget in GiB (default 2)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="rill's max running requests (default 256)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (both sides; default cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="both sides' weights and activations (default float32)")
    p.add_argument("--cuda-graphs", action="store_true", help="rill replays decode steps from CUDA graphs")
    llamacpp.add_arguments(p)


def make_workload(args, vocab_size: int) -> list[Request]:
    """Fixed by --seed: the same requests on every run and for both sides."""
    for lo, hi, name in ((args.min_prompt, args.max_prompt, "prompt"), (args.min_output, args.max_output, "output")):
        if not 1 <= lo <= hi:
            raise ValueError(f"need 1 <= --min-{name} <= --max-{name}, got {lo} and {hi}")
    rng = random.Random(args.seed)
    requests = []
    for _ in range(args.num_requests):
        prompt_len = rng.randint(args.min_prompt, args.max_prompt)
        requests.append(Request(random_token_ids(rng, prompt_len, vocab_size), rng.randint(args.min_output, args.max_output)))
    return requests


def run_rill(model: str, workload: list[Request], args) -> dict:
    """Every request added at once; EngineCore.step() until all are done."""
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore

    config = EngineConfig(model=model, dtype=args.dtype, device=args.device,
                          kv_cache_bytes=int(args.kv_cache_gb * (1 << 30)), max_num_seqs=args.max_num_seqs,
                          seed=args.seed, cuda_graphs=args.cuda_graphs)
    core = EngineCore(config)
    for r in workload:
        core.check_fits(len(r.prompt_token_ids), r.max_tokens)
    _drain(core, [Request(workload[0].prompt_token_ids[:8], 4)], "warmup", disable=True)  # not timed
    steps_before, preemptions_before = core.stats.num_steps, core.stats.num_preemptions
    t0 = time.perf_counter()
    tokens = _drain(core, workload, "rill", disable=args.no_progress)
    seconds = time.perf_counter() - t0
    out = {"output_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
           "steps": core.stats.num_steps - steps_before,
           "preemptions": core.stats.num_preemptions - preemptions_before,
           "num_kv_blocks": core.block_manager.num_blocks}
    del core
    gc.collect()
    return out


def _drain(core, workload: list[Request], name: str, disable: bool) -> int:
    """Add the requests, step until all finish; return the output tokens produced."""
    from rill.sampling_params import SamplingParams

    for i, r in enumerate(workload):
        params = SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True)
        core.add_request(f"{name}-{i}", r.prompt_token_ids, params)
    expected = sum(r.max_tokens for r in workload)
    # Each step computes at least one token; 4x covers recomputation after preemptions.
    max_steps = 4 * sum(len(r.prompt_token_ids) + r.max_tokens for r in workload) + 100
    tokens, finished = 0, 0
    with progress(total=expected, desc=f"{name} tokens", disable=disable) as bar:
        for _ in range(max_steps):
            for delta in core.step():
                if delta.error is not None:
                    raise RuntimeError(f"{delta.request_id} failed: {delta.error}")
                tokens += len(delta.token_ids)
                bar.update(len(delta.token_ids))
                finished += delta.finished
            if finished == len(workload):
                return tokens
    raise RuntimeError(f"rill did not finish {len(workload)} requests in {max_steps} steps")


def run_hf(model_dir: str, workload: list[Request], args) -> dict:
    """Static batches with transformers generate; counts each request's own tokens only."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    pad_id = 0
    batches = [workload[i:i + args.hf_batch_size] for i in range(0, len(workload), args.hf_batch_size)]
    _hf_generate(model, [Request(workload[0].prompt_token_ids[:8], 4)], pad_id)  # warm-up, not timed
    useful = generated = 0
    t0 = time.perf_counter()
    for batch in progress(batches, desc="hf batches", disable=args.no_progress):
        generated += _hf_generate(model, batch, pad_id)
        useful += sum(r.max_tokens for r in batch)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    del model
    gc.collect()
    return {"output_tokens": useful, "generated_tokens_incl_padding": generated, "seconds": seconds,
            "tokens_per_s": useful / seconds, "batch_size": args.hf_batch_size, "num_batches": len(batches)}


def _hf_generate(model, batch: list[Request], pad_id: int) -> int:
    """One left-padded greedy batch; returns the tokens generated (padding rows included)."""
    import torch

    width = max(len(r.prompt_token_ids) for r in batch)
    new = max(r.max_tokens for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, r in enumerate(batch):
        n = len(r.prompt_token_ids)
        ids[row, width - n:] = torch.tensor(r.prompt_token_ids)
        mask[row, width - n:] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=pad_id)
    return (out.shape[1] - width) * len(batch)


def run(args) -> dict:
    from rill.models.config import load_model_config
    from rill.models.loader import resolve_model_dir
    from rill.tokenizer import Tokenizer

    model = resolve_model(args.model, args.cache_dir, args.seed)
    model_dir = str(resolve_model_dir(model))
    vocab = min(Tokenizer.from_dir(model_dir).vocab_size, load_model_config(Path(model_dir)).vocab_size)
    workload = make_workload(args, vocab)
    with_llama = llamacpp.wanted(args)  # checks its paths before the other sides spend their minutes
    rill = run_rill(model, workload, args)
    hf = None if args.skip_hf else run_hf(model_dir, workload, args)
    llama = _run_llamacpp(model_dir, workload, args) if with_llama else None
    return {
        "benchmark": NAME,
        "config": {k: getattr(args, k) for k in ("model", "num_requests", "seed", "min_prompt", "max_prompt",
                                                 "min_output", "max_output", "hf_batch_size", "kv_cache_gb",
                                                 "max_num_seqs", "device", "dtype", "cuda_graphs")},
        "workload": {"num_requests": len(workload),
                     "prompt_tokens": sum(len(r.prompt_token_ids) for r in workload),
                     "output_tokens": sum(r.max_tokens for r in workload)},
        "target_speedup": TARGET_SPEEDUP,
        "rill": rill,
        "hf": hf,
        "speedup": None if hf is None else rill["tokens_per_s"] / hf["tokens_per_s"],
        "llamacpp": llama,
        "speedup_vs_llamacpp": rill["tokens_per_s"] / llama["tokens_per_s"] if llama and "error" not in llama else None,
    }


def _run_llamacpp(model_dir: str, workload: list[Request], args) -> dict:
    """The llama.cpp side, or {"error": ...} when it fails: the other sides' figures still count."""
    import torch

    from rill.models.config import load_model_config

    kv_bytes_per_token = load_model_config(Path(model_dir), dtype="float32").kv_bytes_per_token
    try:
        return llamacpp.run_llamacpp(model_dir, workload, args, kv_bytes_per_token, torch.get_num_threads())
    except llamacpp.LlamaCppError as e:
        return {"error": str(e)}


def summary(result: dict) -> str:
    w, rill, hf = result["workload"], result["rill"], result["hf"]
    lines = [
        f"throughput, {w['num_requests']} requests ({w['prompt_tokens']} prompt / {w['output_tokens']} output tokens), "
        f"model {result['config']['model']}:",
        f"  rill:         {rill['tokens_per_s']:.1f} output tokens/s ({rill['seconds']:.2f} s, {rill['steps']} steps, "
        f"{rill['preemptions']} preemptions)",
    ]
    if hf is not None:
        lines.append(f"  transformers: {hf['tokens_per_s']:.1f} output tokens/s ({hf['seconds']:.2f} s, "
                     f"{hf['num_batches']} batches of {hf['batch_size']})")
        lines.append(f"  speedup: {result['speedup']:.2f}x (target >= {TARGET_SPEEDUP}x)")
    if result.get("llamacpp"):
        lines.append(_llamacpp_line(result))
    return "\n".join(lines)


def _llamacpp_line(result: dict) -> str:
    llama = result["llamacpp"]
    if "error" in llama:
        return f"  llama.cpp:    failed: {llama['error']}"
    slots = f", {llama['parallel']} slots x {llama['ctx_per_slot']} tokens" if "parallel" in llama else ""
    return (f"  llama.cpp:    {llama['tokens_per_s']:.1f} output tokens/s ({llama['seconds']:.2f} s{slots}); "
            f"rill / llama.cpp {result['speedup_vs_llamacpp']:.2f}x")


def plot(result: dict, path) -> None:
    sides = [("rill", result["rill"])] + ([("transformers", result["hf"])] if result["hf"] else [])
    if result.get("speedup_vs_llamacpp") is not None:
        sides.append(("llama.cpp", result["llamacpp"]))

    def draw(axes):
        ax = axes[0]
        values = [side["tokens_per_s"] for _, side in sides]
        bars = ax.bar([name for name, _ in sides], values, color=["tab:blue", "tab:orange", "tab:green"][: len(sides)])
        ax.bar_label(bars, fmt="%.1f")
        ax.set_ylabel("output tokens / s")
        title = f"{result['workload']['num_requests']} requests, {result['config']['model']}"
        if result["speedup"] is not None:
            title += f", speedup {result['speedup']:.2f}x"
        if result.get("speedup_vs_llamacpp") is not None:
            title += f", vs llama.cpp {result['speedup_vs_llamacpp']:.2f}x"
        ax.set_title(title)

    save_plot(path, draw)
