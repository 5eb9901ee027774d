"""`rill bench serve`: concurrent streaming clients against an OpenAI-compatible server.

At each concurrency level C (--concurrency 1,4,16,64), C clients each send --requests-per-client
streaming `/v1/completions` requests one after the other: a prompt of --prompt-tokens random
token ids and exactly --max-tokens output tokens (`ignore_eos`). Measured per request on the
client side: time to first token (request sent -> first text frame), inter-token latency (gaps
between frames, per output token), and at each level the output tokens per second of all
clients together. With no --base-url a server (`rill serve` in this process, on 127.0.0.1 and a free
port) runs --model; with --base-url (or --url) the benchmark drives that OpenAI-compatible server,
rill or another (vLLM, llama.cpp's server), so one command measures both sides of a comparison.
Only fields vLLM also accepts are sent (`ignore_eos`, `skip_special_tokens`, prompts as token ids).
"""

from __future__ import annotations

import json
import random
import time

from rill.bench.common import add_common_args, percentile, progress, random_token_ids, resolve_model, save_plot

NAME = "serve"
DEFAULT_MODEL = "random-small"  # with no --base-url
DEFAULT_VOCAB = 256  # prompt ids are drawn below this: ids every byte-level vocabulary has
STARTUP_S = 5.0  # --client-processes: the processes' start (spawned, importing httpx and trio) before a level's clock


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--base-url", "--url", dest="url", default=None,
                   help="a running OpenAI-compatible server's base URL, e.g. http://127.0.0.1:8000 "
                        "(default: start rill here)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--model", default=None,
                   help="with no --base-url: random-small | random-100m | random-qwen2-100m | rill-tiny | PATH "
                        "(default random-small); with --base-url the served model's name "
                        "(default: the first of /v1/models)")
    p.add_argument("--concurrency", default="1,4,16,64", help="comma-separated client counts (default 1,4,16,64)")
    p.add_argument("--requests-per-client", type=int, default=4, help="requests each client sends per level")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=None, help=f"prompt token ids are drawn below this (default {DEFAULT_VOCAB})")
    p.add_argument("--timeout", type=float, default=600.0, help="give up on one level after this many seconds")
    p.add_argument("--client-processes", type=int, default=1,
                   help="spread each level's clients over this many processes (default 1); one process "
                        "streaming hundreds of responses can be slower than the server it measures")
    p.add_argument("--device", default="cpu", help="the in-process server's device: cpu | cuda (default cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the in-process server's dtype (default float32)")
    p.add_argument("--cuda-graphs", action="store_true", help="the in-process server replays decode from CUDA graphs")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="the in-process server sends a stream's tokens in groups of this many (default 1)")


# -- one client ----------------------------------------------------------------------------------


async def stream_one(client, url: str, body: dict) -> dict:
    """One streaming request: TTFT, per-token gaps and output tokens, timed on the client."""
    t0 = time.perf_counter()
    first, last, gaps, num_tokens = None, None, [], 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                if line.startswith("event: error"):
                    raise RuntimeError("the server sent an error event")
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                num_tokens = chunk["usage"]["completion_tokens"]
            if not chunk["choices"] or not chunk["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
    if first is None:
        raise RuntimeError("the stream carried no text")
    return {"ttft_s": first - t0, "gaps_s": gaps, "num_tokens": num_tokens, "e2e_s": last - t0}


async def run_level(url: str, headers: dict, model: str, concurrency: int, args, vocab_size: int, bar) -> dict:
    import trio

    rng = random.Random(args.seed + concurrency)
    bodies = [[_body(args, model, rng, vocab_size) for _ in range(args.requests_per_client)]
              for _ in range(concurrency)]
    processes = min(args.client_processes, concurrency)
    if processes == 1:
        t0 = time.perf_counter()
        results = await run_clients(url, headers, bodies, args.timeout, bar.update)
        return _level_summary(concurrency, results, time.perf_counter() - t0)
    # Clients dealt round-robin to processes of their own (one Python process parsing hundreds of streams is
    # the limit before a GPU server is: 2026-11-27, H200). Each starts at one wall-clock moment, after its
    # imports; the level's time runs from that moment to the last process's last token.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    start_at = time.time() + STARTUP_S
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = [pool.submit(_client_process, url, headers, bodies[i::processes], args.timeout, start_at)
                for i in range(processes)]
        done = await trio.to_thread.run_sync(lambda: [job.result() for job in jobs])
    if start_at < min(t for _, t, _ in done):
        raise RuntimeError(f"a client process started late: raise STARTUP_S ({STARTUP_S} s)")
    results = [r for rs, _, _ in done for r in rs]
    bar.update(len(results))
    return _level_summary(concurrency, results, max(end for _, _, end in done) - start_at)


async def run_clients(url: str, headers: dict, bodies: list[list[dict]], timeout: float, done=lambda n: None):
    """One client per list of bodies, all at once, each sending its requests one after the other."""
    import httpx
    import trio

    results: list[dict] = []
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))

    async def client_task(client, mine):
        for body in mine:
            results.append(await stream_one(client, url, body))
            done(1)

    async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits) as client:
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                for mine in bodies:
                    nursery.start_soon(client_task, client, mine)
    return results


def _client_process(url: str, headers: dict, bodies: list[list[dict]], timeout: float, start_at: float):
    """A client process's share of a level: waits for start_at, runs its clients; returns their
    results and when it started and ended (wall clock)."""
    import httpx  # noqa: F401  (imported before the clock starts)
    import trio

    started = time.time()
    time.sleep(max(0.0, start_at - started))
    results = trio.run(run_clients, url, headers, bodies, timeout)
    return results, started, time.time()


def _body(args, model: str, rng: random.Random, vocab_size: int) -> dict:
    return {
        "model": model, "prompt": random_token_ids(rng, args.prompt_tokens, vocab_size), "max_tokens": args.max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        # Random prompts can lead a trained model into special tokens only; keep them as text so
        # every token is seen (and timed) by the client.
        "skip_special_tokens": False,
    }


def _level_summary(concurrency: int, results: list[dict], wall_s: float) -> dict:
    ttft_ms = [r["ttft_s"] * 1000 for r in results]
    itl_ms = [g * 1000 for r in results for g in r["gaps_s"]]
    num_tokens = sum(r["num_tokens"] for r in results)
    return {
        "concurrency": concurrency, "requests": len(results), "wall_s": wall_s,
        "output_tokens": num_tokens, "output_tokens_per_s": num_tokens / wall_s,
        "ttft_p50_ms": percentile(ttft_ms, 50), "ttft_p99_ms": percentile(ttft_ms, 99),
        "itl_p50_ms": percentile(itl_ms, 50) if itl_ms else None,
        "itl_p99_ms": percentile(itl_ms, 99) if itl_ms else None,
    }


# -- the server, when none is given -------------------------------------------------------------


async def bench(args, levels: list[int]) -> dict:
    import trio

    if args.url:
        return await _bench_url(args.url.rstrip("/"), args, levels, args.vocab_size)
    from rill.config import EngineConfig
    from rill.server import serve
    from rill.transports.http import ServerConfig

    name = args.model or DEFAULT_MODEL
    config = EngineConfig(model=resolve_model(name, args.cache_dir, args.seed), dtype=args.dtype, seed=args.seed,
                          device=args.device, cuda_graphs=args.cuda_graphs, stream_interval=args.stream_interval)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, ServerConfig(api_key=args.api_key, served_model_names=[name]), "127.0.0.1", 0, 1.0,
            shutdown_trigger=stop.wait, task_status=task_status))
        try:
            return await _bench_url(binds[0], args, levels, args.vocab_size)
        finally:
            stop.set()


async def _bench_url(url: str, args, levels: list[int], vocab_size: int | None) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(headers=headers) as client:
        response = await client.get(f"{url}/v1/models")
        response.raise_for_status()
        served = [card["id"] for card in response.json()["data"]]
    if args.model is not None and args.model not in served:
        raise SystemExit(f"{url} serves {served}, not {args.model!r}")
    model = args.model or served[0]
    total = sum(levels) * args.requests_per_client
    out = []
    with progress(total=total, desc="requests", disable=args.no_progress) as bar:
        for c in levels:
            out.append(await run_level(url, headers, model, c, args, vocab_size or DEFAULT_VOCAB, bar))
    return {"model": model, "url": url if args.url else "in-process", "levels": out}


def run(args) -> dict:
    import trio

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.client_processes < 1:
        raise SystemExit(f"--client-processes must be at least 1, not {args.client_processes}")
    result = trio.run(bench, args, levels)
    return {
        "benchmark": NAME,
        "config": {"concurrency": levels, "requests_per_client": args.requests_per_client,
                   "client_processes": args.client_processes,
                   "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                   "model": args.model or (None if args.url else DEFAULT_MODEL), "seed": args.seed,
                   "device": args.device, "dtype": args.dtype, "cuda_graphs": args.cuda_graphs,
                   "stream_interval": args.stream_interval},
        **result,
    }


def summary(result: dict) -> str:
    c = result["config"]
    spread = f", clients in {c['client_processes']} processes" if c.get("client_processes", 1) > 1 else ""
    lines = [f"{result['model']} ({result['url']}), prompt {c['prompt_tokens']} tokens, output {c['max_tokens']} tokens"
             f"{spread}:",
             "  clients  requests  out tok/s  TTFT p50 / p99 ms   ITL p50 / p99 ms"]
    for lv in result["levels"]:
        lines.append(f"  {lv['concurrency']:7d}  {lv['requests']:8d}  {lv['output_tokens_per_s']:9.1f}  "
                     f"{lv['ttft_p50_ms']:8.1f} / {lv['ttft_p99_ms']:7.1f}  {lv['itl_p50_ms']:8.2f} / {lv['itl_p99_ms']:7.2f}")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    levels = result["levels"]
    xs = [lv["concurrency"] for lv in levels]

    def draw(axes):
        lat, tput = axes
        for key, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
                           ("itl_p50_ms", "inter-token p50"), ("itl_p99_ms", "inter-token p99")):
            lat.plot(xs, [lv[key] for lv in levels], marker="o", label=label)
        lat.set_xscale("log", base=2)
        lat.set_yscale("log")
        lat.set_xlabel("concurrent streaming clients")
        lat.set_ylabel("latency (ms, log)")
        lat.legend()
        tput.plot(xs, [lv["output_tokens_per_s"] for lv in levels], marker="o")
        tput.set_xscale("log", base=2)
        tput.set_xlabel("concurrent streaming clients")
        tput.set_ylabel("output tokens / s")

    save_plot(path, draw, ncols=2, title=f"rill bench serve: {result['model']}")
