"""Issue 56: transcript lag and concurrent streams of Kyutai STT served live over /v1/realtime.

rill's app (rill-tiny as the chat model, unused by these sessions) and the speech worker with a random-
weight Kyutai STT of SHAPE (nothing downloaded) run in this process on 127.0.0.1; N websocket clients
open GA transcription sessions (turn_detection null) and each sends CLIP_S of audio as a microphone
does (the 100 ms that ends at t is sent at t), then commits, and reads the deltas.

Lag, per text token that reaches the wire: random weights write arbitrary words, so a token is placed
in time by the model's own alignment rather than by words: the token sampled at decoder step p has heard
the audio up to p * 80 ms (less the silence prefix), and under Delayed Streams Modeling it writes what
was said `delay` before that. A delta's arrival is matched to the token that completes it (the stream's
text equals the offline transcript of the same samples, pinned by tests/test_kyutai_live.py), and
  lag           = arrival - the moment the audio it writes about (t = p * 80 ms - delay) had been sent
  lag - delay   = arrival - the moment the audio step p heard had been sent: what serving adds
N streams keep up when lag - delay stays under KEEP_UP_MS at p95 (a worker that falls behind real
time lets it grow with the clip's length).

    SHAPE=small STREAMS=1,4,8,16,24 CLIP_S=10 .venv/bin/python benchmarks/kyutai-live-lag.py
    SHAPE=1b STREAMS=1 CLIP_S=6 .venv/bin/python benchmarks/kyutai-live-lag.py
Writes bench-results/kyutai-live-<shape>.json and .png.
"""
import base64
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
_spec = importlib.util.spec_from_file_location("kyutai_speed", ROOT / "benchmarks" / "kyutai-stream-speed.py")
speed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(speed)

from helpers_kyutai import save_tokenizer, synthetic_audio  # noqa: E402
from rill.bench.common import percentile, save_plot  # noqa: E402
from rill.speech.kyutai.config import KyutaiSpec, PaddingSpec  # noqa: E402
from rill.speech.kyutai.decoder import KyutaiDecoder  # noqa: E402
from rill.speech.kyutai.loader import KyutaiRuntime, _rebuild_buffers  # noqa: E402
from rill.speech.kyutai.mimi import MimiEncoder  # noqa: E402
from rill.speech.kyutai.stream import KyutaiStream  # noqa: E402
from rill.tokenizer import Tokenizer  # noqa: E402

RATE, CHUNK_S, DELAY_S, DECODER_STD = 16_000, 0.1, 0.5, 0.3
KEEP_UP_MS = float(os.environ.get("KEEP_UP_MS", "1000"))
SMALL_MIMI = dict(model_type="mimi", hidden_size=128, num_filters=8, num_hidden_layers=2, intermediate_size=512,
                  num_attention_heads=4, num_key_value_heads=4, codebook_size=2048, codebook_dim=64,
                  num_quantizers=8, vector_quantization_hidden_dimension=64, sliding_window=250, upsample_groups=128)
SHAPES = {
    "small": dict(vocab_size=1001, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, ffn_dim=1024,
                  sliding_window=375, num_codebooks=8, codebook_vocab_size=2049, audio_pad_token_id=1001 + 8 * 2049,
                  codec_config=SMALL_MIMI),
    "1b": dict(**speed.SHAPES["1b"], codec_config=speed.MIMI),
}


def random_runtime(shape: str, tokenizer_dir: Path) -> KyutaiRuntime:
    config = dict(model_type="kyutai_speech_to_text", bos_token_id=SHAPES[shape]["vocab_size"] - 1, **SHAPES[shape])
    spec = KyutaiSpec.from_json(config, Path(shape))
    torch.manual_seed(0)
    with torch.device("meta"):
        mimi, decoder = MimiEncoder(spec.codec), KyutaiDecoder(spec)
    mimi, decoder = mimi.to_empty(device="cpu").float(), decoder.to_empty(device="cpu").float()
    with torch.no_grad():
        for p in mimi.parameters():
            p.normal_(std=0.02)
        for p in decoder.parameters():  # large enough that greedy paths wander over the vocabulary
            p.normal_(std=DECODER_STD) if p.dim() == 2 else p.fill_(1.0)
        for books in (mimi.semantic, mimi.acoustic):
            books.embed.normal_()
    _rebuild_buffers(mimi, decoder, spec)
    save_tokenizer(tokenizer_dir, spec.vocab_size)
    return KyutaiRuntime(Path(shape), f"kyutai-{shape}-random", spec, PaddingSpec(24_000, 0.0, DELAY_S), mimi.eval(),
                         decoder.eval(), Tokenizer.from_dir(tokenizer_dir), torch.device("cpu"))


def wire(audio: np.ndarray) -> np.ndarray:
    """PCM16 round trip: the samples the server decodes."""
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768.0


def token_ends(runtime: KyutaiRuntime, audio: np.ndarray) -> list[int]:
    """Offline: for each token (step p = its index), the transcript's length once its text is in."""
    stream = KyutaiStream(runtime, RATE)
    got = stream.feed(wire(audio))
    pieces = got.pieces + stream.finish().pieces
    ends, total = [], 0
    for piece in pieces:
        total += len(piece.lstrip()) if total == 0 else len(piece)
        ends.append(total)
    return ends


async def one_stream(url: str, audio: np.ndarray, ends: list[int], runtime, out: list) -> None:
    from trio_websocket import open_websocket_url

    frame_s = runtime.frame_size / runtime.sampling_rate
    arrivals = []
    async with open_websocket_url(url) as ws:
        await ws.get_message()  # session.created
        await ws.send_message(json.dumps({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))
        start = trio.current_time()
        step = int(CHUNK_S * RATE)

        async def read() -> None:
            while True:
                event = json.loads(await ws.get_message())
                if event["type"] == "conversation.item.input_audio_transcription.delta":
                    arrivals.append((trio.current_time(), event["delta"]))
                elif event["type"] in ("conversation.item.input_audio_transcription.completed", "error"):
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for k, i in enumerate(range(0, len(audio), step)):
                await trio.sleep_until(start + (k + 1) * CHUNK_S)
                pcm = (np.clip(audio[i:i + step], -1, 1) * 32767).astype("<i2").tobytes()
                await ws.send_message(json.dumps({"type": "input_audio_buffer.append",
                                                  "audio": base64.b64encode(pcm).decode()}))
            await ws.send_message(json.dumps({"type": "input_audio_buffer.commit"}))
    clip_s, received = len(audio) / RATE, 0
    for arrived, text in arrivals:
        received += len(text)
        p = next((i for i, end in enumerate(ends) if end >= received), len(ends) - 1)
        heard_s = p * frame_s - runtime.padding.silence_prefix_s  # audio step p had heard
        if heard_s > clip_s:
            continue  # written from the commit's padding, not from audio a client sent
        sent_at = start + math.ceil(max(heard_s, 0.0) / CHUNK_S) * CHUNK_S
        out.append(arrived - sent_at)


async def serve_and_measure(runtime, streams: list[int], clip_s: float) -> list[dict]:
    from hypercorn.trio import serve as hypercorn_serve

    from rill.config import EngineConfig
    from rill.engine.async_engine import open_engine
    from rill.server import hypercorn_config
    from rill.speech.async_speech import AsyncSpeechEngine
    from rill.speech.kyutai.core import KyutaiCore
    from rill.transports.http import ServerConfig, create_app
    from rill.transports.realtime.driver import RealtimeConfig

    server = ServerConfig(realtime=RealtimeConfig(audio_rate_hz=RATE))
    speech = AsyncSpeechEngine(KyutaiCore(runtime), trio.lowlevel.current_trio_token(), runtime.name)
    audios = [synthetic_audio(clip_s, seed=100 + i, rate=RATE) for i in range(max(streams))]
    ends = [token_ends(runtime, a) for a in audios]
    results = []
    async with open_engine(EngineConfig(model="rill-tiny", num_kv_blocks=64)) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: trio.to_thread.run_sync(speech.run_worker, limiter=trio.CapacityLimiter(1)))
        app = create_app(engine=engine, server=server, speech=speech)
        binds = await nursery.start(hypercorn_serve, app, hypercorn_config("127.0.0.1", 0, 1.0, server))
        url = binds[0].replace("http://", "ws://") + "/v1/realtime"
        for n in streams:
            lags: list[float] = []
            t = time.perf_counter()
            async with trio.open_nursery() as clients:
                for i in range(n):
                    clients.start_soon(one_stream, url, audios[i], ends[i], runtime, lags)
            row = {"streams": n, "wall_s": round(time.perf_counter() - t, 1), "tokens": len(lags),
                   "lag_minus_delay_ms": _ms(lags), "lag_ms": _ms([x + DELAY_S for x in lags]),
                   "max_batch": speech.core.live.max_batch}
            row["keeps_up"] = bool(lags) and percentile(lags, 95) * 1000 < KEEP_UP_MS
            print(json.dumps(row), flush=True)
            results.append(row)
        speech.shutdown()
        nursery.cancel_scope.cancel()
    return results


def _ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"n": 0}
    return {"n": len(seconds), "p50": round(1000 * percentile(seconds, 50)),
            "p95": round(1000 * percentile(seconds, 95)), "max": round(1000 * max(seconds))}


def plot(result: dict, path: Path) -> None:
    rows = result["concurrency"]

    def draw(axes):
        n = [r["streams"] for r in rows]
        for key, style in (("p50", "o-"), ("p95", "s--")):
            axes[0].plot(n, [r["lag_ms"].get(key) for r in rows], style, label=f"causal lag {key}")
        axes[0].axhline(446, color="gray", linestyle=":", label="Whisper live lag p50 (446 ms)")
        axes[0].axhline(KEEP_UP_MS + DELAY_S * 1000, color="red", linestyle=":", label="keep-up bound + delay")
        axes[0].set_xlabel("concurrent streams")
        axes[0].set_ylabel("transcript lag, ms (delay included)")
        axes[0].legend(fontsize=7)

    save_plot(path, draw, title=f"Kyutai STT ({result['shape']}, random weights) live over /v1/realtime, "
                                f"{result['threads']} threads")


def main() -> None:
    shape = os.environ.get("SHAPE", "small")
    streams = [int(x) for x in os.environ.get("STREAMS", "1,4,8,16,24").split(",")]
    clip_s = float(os.environ.get("CLIP_S", "12"))
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))  # 2 threads on 2 shared cores contend
    with tempfile.TemporaryDirectory() as tmp:
        runtime = random_runtime(shape, Path(tmp))
    params = sum(p.numel() for m in (runtime.mimi, runtime.decoder) for p in m.parameters())
    rows = trio.run(serve_and_measure, runtime, streams, clip_s)
    result = {"shape": shape, "params_m": round(params / 1e6, 1), "threads": torch.get_num_threads(),
              "clip_s": clip_s, "delay_ms": DELAY_S * 1000, "chunk_ms": CHUNK_S * 1000, "keep_up_ms": KEEP_UP_MS,
              "concurrency": rows, "most_streams_kept_up": max([r["streams"] for r in rows if r["keeps_up"]], default=0),
              "whisper_live_path": {"lag_p50_ms": 446, "lag_p95_ms": "800-1600", "source": "rill bench voice (README)"}}
    out = ROOT / "bench-results" / f"kyutai-live-{shape}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "concurrency"}))


if __name__ == "__main__":
    main()
