"""The sides of `rill bench vision`: one picture and its question in, the answer's text out.

Each side gets the same PNG bytes and questions, decodes them, processes the picture and renders the
turn inside the timed region (that is part of serving a request), and decodes greedily for exactly
`max_tokens` tokens (min_tokens = max_tokens in rill, min_new_tokens = max_new_tokens in transformers:
both mask the end-of-sequence token until then), so every request costs the same on every side.

    rill           EngineCore in this process: at most `clients` requests in flight, the next one
                   added (decoded, processed, placeholders expanded) as soon as one finishes.
    rill-http      `rill serve` in this process; `clients` httpx clients, each posting the next
                   picture as a data: URL to /v1/chat/completions as soon as its last answer came.
    transformers   AutoModelForImageTextToText.generate on static batches of `clients` pictures
                   (left-padded), inputs built as Qwen2VLProcessor builds them.
"""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import Collection
from pathlib import Path

from rill.bench.common import progress
from rill.bench.vision_set import Picture, messages

HTTP_TIMEOUT_S = 600.0


def _score(texts: list[str], latencies: list[float], seconds: float) -> dict:
    from rill.bench.common import summarize_ms

    return {"requests": len(texts), "seconds": seconds, "requests_per_s": len(texts) / seconds,
            "latency": summarize_ms(latencies), "texts": texts}


# -- rill in process -----------------------------------------------------------------------------


class RillEngine:
    def __init__(self, model_dir: Path, max_tokens: int, clients: int, seed: int, device: str = "cpu",
                 dtype: str = "float32") -> None:
        from rill.config import EngineConfig
        from rill.engine.core import EngineCore
        from rill.sampling_params import SamplingParams

        self.core = EngineCore(EngineConfig(model=str(model_dir), dtype=dtype, device=device, max_num_seqs=clients,
                                            seed=seed))
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens, min_tokens=max_tokens)
        self.ids = (f"bench-{i}" for i in itertools.count())

    def add(self, picture: Picture) -> str:
        """Decode, process, render and add one request; its id."""
        core = self.core
        text = core.tokenizer.apply_chat_template(messages(picture.question), add_generation_prompt=True)
        prompt = core.tokenizer.encode(text, add_special_tokens=False)
        ids, items = core.mm_inputs.expand(prompt, [core.mm_inputs.item("image", picture.image())])
        request_id = next(self.ids)
        core.add_request(request_id, ids, self.params, items)
        return request_id

    def run(self, pictures: list[Picture], clients: int, bar=None) -> dict:
        """`clients` requests in flight until every picture is answered."""
        texts: dict[str, str] = {}
        started: dict[str, float] = {}
        latencies: list[float] = []
        order, pending = [], iter(pictures)
        t0 = time.perf_counter()
        while True:
            while len(started) - len(latencies) < clients and (picture := next(pending, None)) is not None:
                order.append(self.add(picture))
                started[order[-1]] = time.perf_counter()
            if not self.core.has_work:
                break
            for delta in self.core.step():
                if delta.error is not None:
                    raise RuntimeError(f"{delta.request_id} failed: {delta.error}")
                texts[delta.request_id] = texts.get(delta.request_id, "") + delta.text
                if delta.finished:
                    latencies.append(time.perf_counter() - started[delta.request_id])
                    if bar is not None:
                        bar.update(1)
        return _score([texts[r].strip() for r in order], latencies, time.perf_counter() - t0)


def run_rill(engine: RillEngine, sets: dict, args) -> dict:
    engine.run(sets["warmup"], 1)  # not timed
    out = {}
    for mode, clients in (("batch1", 1), ("concurrent", args.concurrency)):
        with progress(total=len(sets[mode]), desc=f"rill {clients} in flight", disable=args.no_progress) as bar:
            out[mode] = engine.run(sets[mode], clients, bar) | {"clients": clients}
    return out


# -- rill over HTTP ------------------------------------------------------------------------------


def run_rill_http(model_dir: Path, sets: dict, args) -> dict:
    import trio

    return trio.run(_serve_and_post, model_dir, sets, args)


async def _serve_and_post(model_dir: Path, sets: dict, args) -> dict:
    import trio

    from rill.config import EngineConfig
    from rill.server import serve
    from rill.transports.http import ServerConfig

    config = EngineConfig(model=str(model_dir), dtype=args.dtype, device=args.device, seed=args.seed)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, ServerConfig(), "127.0.0.1", 0, 1.0, shutdown_trigger=stop.wait, task_status=task_status))
        try:
            return await _post_all(binds[0], str(model_dir), sets, args)
        finally:
            stop.set()


def chat_body(model: str, picture: Picture, max_tokens: int) -> dict:
    url = "data:image/png;base64," + base64.b64encode(picture.png).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": picture.question}]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "min_tokens": max_tokens}


async def _post_all(url: str, model: str, sets: dict, args) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, limits=limits) as client:
        async def post(picture: Picture) -> str:
            response = await client.post(f"{url}/v1/chat/completions", json=chat_body(model, picture, args.max_tokens))
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
            return response.json()["choices"][0]["message"]["content"].strip()

        await post(sets["warmup"][0])  # not timed
        out = {}
        for mode, clients in (("batch1", 1), ("concurrent", args.concurrency)):
            with progress(total=len(sets[mode]), desc=f"rill-http {clients} clients", disable=args.no_progress) as bar:
                out[mode] = await _clients(post, sets[mode], clients, bar) | {"clients": clients}
    return out


async def _clients(post, pictures: list[Picture], clients: int, bar) -> dict:
    """`clients` tasks, each posting the next picture as soon as its last answer came back."""
    import trio

    texts: list[str | None] = [None] * len(pictures)
    latencies: list[float] = []
    pending = iter(range(len(pictures)))

    async def client():
        for i in pending:  # shared: each index goes to exactly one client
            t = time.perf_counter()
            texts[i] = await post(pictures[i])
            latencies.append(time.perf_counter() - t)
            bar.update(1)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
    return _score(texts, latencies, time.perf_counter() - t0)


# -- transformers --------------------------------------------------------------------------------


class TransformersVL:
    """A Qwen2-VL-family model in transformers, with its tokenizer and image processor."""

    def __init__(self, model_dir: Path, device: str = "cpu", dtype: str = "float32",
                 eos_token_ids: Collection[int] | None = None) -> None:
        """eos_token_ids: the end tokens rill stops at (EngineCore.eos_token_ids), which min_new_tokens must
        hold back here too; a random directory's generation config names none, and transformers would then
        emit <|im_end|> where rill, held by min_tokens, takes the next best token."""
        import torch
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.image_processor = AutoImageProcessor.from_pretrained(model_dir)
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        self.merge = self.model.config.vision_config.spatial_merge_size
        self.eos_token_ids = sorted(eos_token_ids) if eos_token_ids else None

    def generate(self, pictures: list[Picture], max_tokens: int) -> list[str]:
        """One static batch, left-padded, greedy, exactly max_tokens new tokens per row."""
        torch, config = self.torch, self.model.config
        processed = self.image_processor(images=[p.image() for p in pictures], return_tensors="pt")
        rows = [self._ids(p.question, grid) for p, grid in zip(pictures, processed["image_grid_thw"].tolist())]
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0  # masked out anyway
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        types = (ids == config.image_token_id).long()  # 1 marks image tokens (2 would be video)
        dev = self.model.device
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), mm_token_type_ids=types.to(dev),
                                      pixel_values=processed["pixel_values"].to(dev, self.model.dtype),
                                      image_grid_thw=processed["image_grid_thw"].to(dev),
                                      max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                                      eos_token_id=self.eos_token_ids)
        return [self.tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]

    def _ids(self, question: str, grid: list[int]) -> list[int]:
        """The rendered turn with <|image_pad|> repeated once per merged token, as Qwen2VLProcessor does."""
        text = self.tokenizer.apply_chat_template(messages(question), add_generation_prompt=True, tokenize=False)
        count = grid[0] * grid[1] * grid[2] // self.merge**2
        text = text.replace("<|image_pad|>", "<|image_pad|>" * count, 1)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def run_transformers(hf: TransformersVL, sets: dict, args) -> dict:
    hf.generate(sets["warmup"], args.max_tokens)  # not timed
    out = {}
    for mode, size in (("batch1", 1), ("concurrent", args.concurrency)):
        pictures, texts, latencies = sets[mode], [], []
        t0 = time.perf_counter()
        for start in progress(range(0, len(pictures), size), desc=f"transformers batch {size}",
                              disable=args.no_progress):
            t = time.perf_counter()
            texts += hf.generate(pictures[start : start + size], args.max_tokens)
            latencies += [time.perf_counter() - t] * len(pictures[start : start + size])
        out[mode] = _score(texts, latencies, time.perf_counter() - t0) | {"batch_size": size}
    return out
