"""The sides of `rill bench speak` (rill.bench.speak says what each runs and measures).

    rill_level      clients on rill's speech-out worker (rill.tts.worker) with a voice backend
    KPipelineSide   the kokoro package: KPipeline.generate_from_tokens on KModel, one thread a client
    stream_level    text streamed a word at a time over WS /v1/audio/speech/stream to `rill serve`
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from rill.bench.common import percentile

SAMPLE_RATE = 24_000


def _ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"n": 0}
    ms = [1000 * s for s in seconds]
    return {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95), "mean": statistics.fmean(ms)}


def _level(name: str, clients: int, wall_s: float, requests: list[dict]) -> dict:
    audio_s = sum(r["audio_s"] for r in requests)
    return {"side": name, "concurrent": clients, "requests": len(requests), "wall_s": wall_s, "audio_s": audio_s,
            "audio_s_per_s": audio_s / wall_s if wall_s > 0 else None,
            "first_audio_ms": _ms([r["first_s"] for r in requests]),
            "rtf_p50": percentile([r["wall_s"] / r["audio_s"] for r in requests if r["audio_s"] > 0], 50)}


# -- rill: the speech-out worker ----------------------------------------------------------------------------


async def rill_level(out, texts: list[str], clients: int, rounds: int, voice: str) -> dict:
    import trio

    from rill.tts.clauses import split_text

    requests: list[dict] = []

    async def client(k: int) -> None:
        for r in range(rounds):
            clauses = split_text(texts[(k * rounds + r) % len(texts)])
            start, first, num_samples = time.perf_counter(), None, 0
            async for samples in out.speak(_aiter(clauses), voice=voice, speed=1.0):
                first = first if first is not None else time.perf_counter() - start
                num_samples += len(samples)
            requests.append({"first_s": first, "wall_s": time.perf_counter() - start,
                             "audio_s": num_samples / out.backend.sample_rate})

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(clients):
            nursery.start_soon(client, k)
    return _level("rill", clients, time.perf_counter() - start, requests)


async def _aiter(items):
    for item in items:
        yield item


# -- the kokoro package: KPipeline ---------------------------------------------------------------------------


class KPipelineSide:
    """KPipeline.generate_from_tokens on KModel, from phonemes made up front (see the module's docstring)."""

    def __init__(self, model_dir: Path, voice_file: Path):
        from kokoro import KModel, KPipeline

        weights = next(iter(sorted(model_dir.glob("*.pth"))))
        self.model = KModel(repo_id="hexgrad/Kokoro-82M", config=str(model_dir / "config.json"),
                            model=str(weights)).eval()
        self.pipeline = KPipeline(lang_code="e", repo_id="hexgrad/Kokoro-82M", model=self.model)
        self.voice = str(voice_file)
        self.pipeline.load_voice(self.voice)  # loaded once, before the clock starts

    def say(self, phonemes: str) -> np.ndarray:
        import torch

        with torch.inference_mode():
            (result,) = list(self.pipeline.generate_from_tokens(phonemes, voice=self.voice, speed=1))
        return result.audio.numpy()

    def level(self, phonemes: list[list[str]], clients: int, rounds: int) -> dict:
        requests: list[dict] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            for r in range(rounds):
                start, first, num_samples = time.perf_counter(), None, 0
                for ps in phonemes[(k * rounds + r) % len(phonemes)]:
                    num_samples += len(self.say(ps))
                    first = first if first is not None else time.perf_counter() - start
                with lock:
                    requests.append({"first_s": first, "wall_s": time.perf_counter() - start,
                                     "audio_s": num_samples / SAMPLE_RATE})

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return _level("kpipeline", clients, time.perf_counter() - start, requests)


# -- the default voice: text streaming in over the WebSocket ----------------------------------------------


async def stream_level(url: str, texts: list[str], streams: int, piece_s: float) -> dict:
    """`streams` clients at once, each sending one text a word every piece_s over /v1/audio/speech/stream;
    first text piece to first audio frame, and when the first clause's text was complete."""
    import trio
    from trio_websocket import open_websocket_url

    from rill.tts.clauses import ClauseSplitter

    out: list[dict] = []

    async def client(k: int) -> None:
        text = texts[k % len(texts)]
        words = text.split(" ")
        async with open_websocket_url(url) as ws:
            await ws.send_message('{"type": "session.config", "voice": "alloy", "response_format": "pcm"}')
            first_piece = time.perf_counter()
            timing = {}

            async def read() -> None:
                while True:
                    message = await ws.get_message()
                    if isinstance(message, bytes) and "first_s" not in timing:
                        timing["first_s"] = time.perf_counter() - first_piece
                    elif isinstance(message, str) and '"session.done"' in message:
                        return

            splitter = ClauseSplitter()  # the server's own rule: when its first clause was complete
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                for i, word in enumerate(words):
                    piece = word if i == 0 else " " + word
                    await ws.send_message('{"type": "input.text", "text": %s}' % _json_str(piece))
                    if splitter.feed(piece):
                        timing.setdefault("clause_s", time.perf_counter() - first_piece)
                    await trio.sleep(piece_s)
                await ws.send_message('{"type": "input.done"}')
            out.append(timing)

    async with trio.open_nursery() as nursery:
        for k in range(streams):
            nursery.start_soon(client, k)
    firsts = [t["first_s"] for t in out if "first_s" in t]
    after = [t["first_s"] - t["clause_s"] for t in out if "first_s" in t and "clause_s" in t]
    return {"streams": streams, "first_audio_ms": _ms(firsts), "after_first_clause_ms": _ms(after)}


def _json_str(text: str) -> str:
    return json.dumps(text)
