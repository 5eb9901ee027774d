"""`rill bench streaming-input`: time to first token when the prompt streams in, vs. sent whole.

--transport engine (default): both modes run on one engine (open_engine, the trio bridge, as the
server uses it), with the same prompt of --prompt-tokens random token ids, greedy, one output
token, alternating per repeat:

streamed: open_session, then --chunks chunks; after each append, wait until the engine has
          computed the chunk's KV (polling the session's progress, as a real stream's pauses
          would allow), then finish_input. Measured: finish_input -> first output token.
whole:    submit the whole prompt. Measured: submit -> first output token.

--transport a | b: the same over HTTP, against a server run here (hypercorn on 127.0.0.1, a free
port) and timed on the client from the request's bytes to the first SSE frame with text:

streamed: the prompt's ids as `tokens` chunks of a /v1/completions request, Mode A (NDJSON lines
          of one request) or Mode B (POST .../chunks, output read from .../events), waiting as
          above after each chunk; then end of input on its own (Mode A: an `end_of_input` line,
          Mode B: POST .../finish). Measured: sending end of input -> first token.
whole:    POST /v1/completions with the prompt's ids, streamed. Measured: request -> first token.

Prefix caching is off, so the whole-prompt run cannot reuse the streamed run's KV (or the
reverse). A warm-up round of both modes runs first and is not recorded.
Target (from the issue): streamed TTFT <= 1/20 of the whole-prompt TTFT.
"""

from __future__ import annotations

import random
import time

from rill.bench.common import add_common_args, progress, random_token_ids, resolve_model, save_plot, summarize_ms

NAME = "streaming-input"
TARGET_RATIO = 1 / 20
TRANSPORTS = {"engine": "on the engine", "a": "over HTTP, Mode A", "b": "over HTTP, Mode B"}
SESSIONS = "/v1/streaming_input/sessions"


def add_arguments(p) -> None:
    add_common_args(p, NAME)
    p.add_argument("--prompt-tokens", type=int, default=4000, help="prompt length (default 4000)")
    p.add_argument("--chunks", type=int, default=40, help="chunks the streamed prompt arrives in (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each mode (default 3)")
    p.add_argument("--model", default="random-small",
                   help="random-small | random-100m | rill-tiny | PATH (default random-small)")
    p.add_argument("--kv-cache-gb", type=float, default=2.0, help="KV budget in GiB (default 2)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up on one run after this many seconds")
    p.add_argument("--transport", choices=list(TRANSPORTS), default="engine",
                   help="engine: the trio bridge; a: Mode A over HTTP; b: Mode B over HTTP (default engine)")


def split(ids: list[int], num_chunks: int) -> list[list[int]]:
    """num_chunks contiguous, non-empty chunks of near-equal length."""
    num_chunks = max(1, min(num_chunks, len(ids)))
    bounds = [len(ids) * i // num_chunks for i in range(num_chunks + 1)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


async def _first_token_time(recv) -> float:
    """perf_counter() when the first delta carrying a token arrives; drains the stream."""
    first = None
    async with recv:
        async for delta in recv:
            if delta.error is not None:
                raise RuntimeError(f"request failed: {delta.error}")
            if delta.token_ids and first is None:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError("the request finished without producing a token")
    return first


async def _wait_computed(engine, request_id: str | None, num_sent: int) -> None:
    """Until the session holds num_sent tokens and has computed all but the held-back last one
    (request_id None: the one request the engine holds)."""
    import trio

    while True:
        requests = engine.core.requests  # read-only peek at the worker's state
        seqs = requests.get(request_id) if request_id else next(iter(list(requests.values())), None)
        seq = seqs[0] if seqs else None
        if seq is not None and seq.num_tokens >= num_sent and seq.num_computed_tokens >= num_sent - 1:
            return
        if not engine.is_alive:
            raise RuntimeError(f"engine died: {engine.dead!r}")
        await trio.sleep(0.0005)


async def streamed_ttft(engine, request_id: str, prompt: list[int], num_chunks: int, params) -> tuple[float, float]:
    """(seconds from finish_input to the first token, seconds spent streaming the chunks in)."""
    recv = engine.open_session(request_id, params)
    t_start = time.perf_counter()
    sent = 0
    for chunk in split(prompt, num_chunks):
        engine.append(request_id, chunk)
        sent += len(chunk)
        await _wait_computed(engine, request_id, sent)
    t_finish = time.perf_counter()
    engine.finish(request_id)
    first = await _first_token_time(recv)
    return first - t_finish, t_finish - t_start


async def whole_ttft(engine, request_id: str, prompt: list[int], params) -> float:
    """Seconds from submitting the whole prompt to its first token."""
    t0 = time.perf_counter()
    recv = engine.submit(request_id, prompt, params)
    return await _first_token_time(recv) - t0


# -- over HTTP ---------------------------------------------------------------------------------------


ONE_TOKEN = {"max_tokens": 1, "temperature": 0, "ignore_eos": True, "stream": True}


async def _first_text_time(lines) -> float:
    """perf_counter() at the first SSE frame with text; drains the stream."""
    import json

    first = None
    async for line in lines:
        if line.startswith("event: error"):
            raise RuntimeError("the server sent an error event")
        if first is None and line.startswith("data: {") and any(c.get("text") for c in json.loads(line[6:])["choices"]):
            first = time.perf_counter()
    if first is None:
        raise RuntimeError("the stream carried no text")
    return first


async def whole_http_ttft(client, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json={"prompt": prompt, **ONE_TOKEN}) as response:
        return await _first_text_time(response.aiter_lines()) - t0


async def mode_a_ttft(client, engine, prompt: list[int], num_chunks: int) -> tuple[float, float]:
    """Mode A: one NDJSON request; the body pauses after each chunk until its KV is computed."""
    import json

    chunks = split(prompt, num_chunks)
    times = {}

    async def body():
        yield json.dumps({"prompt": [], **ONE_TOKEN}).encode() + b"\n"
        times["start"] = time.perf_counter()
        sent = 0
        for chunk in chunks:
            yield json.dumps({"modality": "tokens", "payload": chunk}).encode() + b"\n"
            sent += len(chunk)
            await _wait_computed(engine, None, sent)
        times["end"] = time.perf_counter()
        yield b'{"end_of_input": true}\n'

    headers = {"Content-Type": "application/x-ndjson"}
    async with client.stream("POST", "/v1/completions", content=body(), headers=headers) as response:
        first = await _first_text_time(response.aiter_lines())
    return first - times["end"], times["end"] - times["start"]


async def mode_b_ttft(client, engine, prompt: list[int], num_chunks: int) -> tuple[float, float]:
    """Mode B: create, POST each chunk (pausing until its KV is computed), read the events."""
    import trio

    chunks = split(prompt, num_chunks)
    created = await client.post(SESSIONS, json={"prompt": [], **ONE_TOKEN,
                                                "streaming_input": {"api": "completions"}})
    session = f"{SESSIONS}/{created.raise_for_status().json()['session_id']}"
    t_start, sent = time.perf_counter(), 0
    for i, chunk in enumerate(chunks):
        (await client.post(f"{session}/chunks", json={"sequence_id": i, "modality": "tokens",
                                                       "payload": chunk})).raise_for_status()
        sent += len(chunk)
        await _wait_computed(engine, None, sent)
    async with client.stream("GET", f"{session}/events") as events, trio.open_nursery() as nursery:
        t_end = time.perf_counter()
        nursery.start_soon(client.post, f"{session}/finish")
        first = await _first_text_time(events.aiter_lines())
    await client.delete(session)
    return first - t_end, t_end - t_start


async def _serve(engine, nursery) -> str:
    """A server for `engine` on 127.0.0.1 and a free port; its base URL."""
    from hypercorn.trio import serve

    from rill.server import hypercorn_config
    from rill.transports.http import ServerConfig, create_app

    app = create_app(engine=engine, server=ServerConfig())
    binds = await nursery.start(serve, app, hypercorn_config("127.0.0.1", 0, 1.0))
    return binds[0]


# -- the runs -------------------------------------------------------------------------------------------


async def bench(args, model: str) -> dict:
    import trio

    from rill.config import EngineConfig
    from rill.engine.async_engine import open_engine
    from rill.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    config = EngineConfig(model=model, dtype="float32", kv_cache_bytes=int(args.kv_cache_gb * (1 << 30)),
                          enable_prefix_caching=False, seed=args.seed)
    runs = []
    async with open_engine(config) as engine, trio.open_nursery() as nursery:
        vocab = min(engine.tokenizer.vocab_size, engine.core.model_config.vocab_size)
        prompt = random_token_ids(random.Random(args.seed), args.prompt_tokens, vocab)
        engine.check_fits(len(prompt), 1)
        one_round = await _round_runner(args, engine, nursery, prompt, params)
        for i in progress(range(-1, args.repeats), desc="repeats", disable=args.no_progress):
            with trio.fail_after(args.timeout):
                ttft_streamed, streaming_s, ttft_whole = await one_round(i)
            if i >= 0:  # i == -1 is the warm-up round
                runs.append({"streamed_ttft_s": ttft_streamed, "whole_ttft_s": ttft_whole,
                             "streaming_s": streaming_s})
        nursery.cancel_scope.cancel()
    return {"runs": runs}


async def _round_runner(args, engine, nursery, prompt: list[int], params):
    """A function timing one round (streamed, then whole) over the chosen transport."""
    if args.transport == "engine":
        async def engine_round(i: int):
            streamed, streaming_s = await streamed_ttft(engine, f"stream-{i}", prompt, args.chunks, params)
            return streamed, streaming_s, await whole_ttft(engine, f"whole-{i}", prompt, params)

        return engine_round
    import httpx

    client = httpx.AsyncClient(base_url=await _serve(engine, nursery), timeout=args.timeout)
    streamed_http = mode_a_ttft if args.transport == "a" else mode_b_ttft

    async def http_round(i: int):
        streamed, streaming_s = await streamed_http(client, engine, prompt, args.chunks)
        return streamed, streaming_s, await whole_http_ttft(client, prompt)

    return http_round


def run(args) -> dict:
    import trio

    model = resolve_model(args.model, args.cache_dir, args.seed)
    runs = trio.run(bench, args, model)["runs"]
    streamed = summarize_ms([r["streamed_ttft_s"] for r in runs])
    whole = summarize_ms([r["whole_ttft_s"] for r in runs])
    return {
        "benchmark": NAME,
        "config": {"prompt_tokens": args.prompt_tokens, "chunks": args.chunks, "repeats": args.repeats,
                   "model": args.model, "seed": args.seed, "kv_cache_gb": args.kv_cache_gb,
                   "prefix_caching": False, "transport": args.transport},
        "target_ratio": TARGET_RATIO,
        "streamed_ttft": streamed,
        "whole_ttft": whole,
        "ratio": streamed["mean_ms"] / whole["mean_ms"],  # streamed / whole, lower is better
        "streaming_time": summarize_ms([r["streaming_s"] for r in runs]),
        "runs": runs,
    }


def summary(result: dict) -> str:
    c, s, w = result["config"], result["streamed_ttft"], result["whole_ttft"]
    how = TRANSPORTS[c["transport"]]
    return "\n".join([
        f"time to first token {how}, {c['prompt_tokens']}-token prompt, {c['repeats']} runs each, model {c['model']}:",
        f"  streamed in {c['chunks']} chunks: mean {s['mean_ms']:.2f} ms (min {s['min_ms']:.2f}, max {s['max_ms']:.2f}) "
        "after end of input",
        f"  whole prompt:          mean {w['mean_ms']:.2f} ms (min {w['min_ms']:.2f}, max {w['max_ms']:.2f}) after submit",
        f"  ratio streamed/whole: {result['ratio']:.4f} (1/{1 / result['ratio']:.1f}; target <= 1/20)",
    ])


def plot(result: dict, path) -> None:
    runs = result["runs"]

    def draw(axes):
        ax = axes[0]
        x = range(len(runs))
        ax.bar([i - 0.2 for i in x], [r["streamed_ttft_s"] * 1000 for r in runs], width=0.4, label="streamed, after end of input")
        ax.bar([i + 0.2 for i in x], [r["whole_ttft_s"] * 1000 for r in runs], width=0.4, label="whole prompt, after submit")
        ax.set_yscale("log")
        ax.set_xticks(list(x), [f"run {i + 1}" for i in x])
        ax.set_ylabel("time to first token (ms, log)")
        c = result["config"]
        ax.set_title(f"{TRANSPORTS[c['transport']]}, {c['prompt_tokens']}-token prompt, ratio {result['ratio']:.3f}")
        ax.legend()

    save_plot(path, draw)
