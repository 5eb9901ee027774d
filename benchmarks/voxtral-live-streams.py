"""Issue 56: how many real-time Voxtral Realtime streams one speech worker keeps up with on CPU, the encoder
passes batched across streams (VoxtralCausal's default) or run stream by stream (the path before), for a
random-weight Voxtral of rill-tiny-causal's shape (rill.tiny_causal.model SHAPES["base"]: d_model 192,
3 encoder + 3 decoder layers, 64 mel bins; nothing downloaded, nothing trained).

The speech worker's loop, in this process on THREADS torch threads: N streams (rill.speech.causal's
LiveStreams over VoxtralCausal) are each sent CHUNK_MS of audio every CHUNK_MS of wall time, as microphones
send it (each stream at its own phase), and the worker steps whenever audio is queued, as the speech worker
does. After each step, a stream's backlog is the audio it has been sent and not yet run. N streams keep up
when the p95 backlog over the clip's second half stays under KEEP_UP_MS (a worker that falls behind real
time lets it grow with the clip's length); busy is the share of wall time spent stepping. Then, as fast
as the worker goes (x_realtime): N streams sent a worker step's worth each (max_frames: 480 ms), stepped
until done, over and over: audio seconds each stream gets through per wall second, above 1 for N streams
to keep up (a loaded worker takes that much per step; smaller steps cost more per second of audio).

    THREADS=2 STREAMS=1,8,16,24,32 CLIP_S=8 .venv/bin/python benchmarks/voxtral-live-streams.py
Writes bench-results/voxtral-live-streams.json and .png. The code before the encoder was batched (commit
3b5cae7^) measured by the same script, its src/ put first on the path:
    git archive 3b5cae7^ src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src MODES="per stream" OUT=voxtral-live-streams-before THREADS=1 ... (as above)
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers_voxtral import synthetic_audio  # noqa: E402
from rill.bench.common import percentile, save_plot  # noqa: E402
from rill.speech.causal import MAX_FRAMES_PER_STEP, LiveStreams  # noqa: E402
from rill.speech.voxtral_realtime.config import AudioSpec, VoxtralSpec  # noqa: E402
from rill.speech.voxtral_realtime.features import MelFrontEnd  # noqa: E402
from rill.speech.voxtral_realtime.live import VoxtralCausal  # noqa: E402
from rill.speech.voxtral_realtime.loader import VoxtralModel, VoxtralRuntime, _rebuild_buffers  # noqa: E402
from rill.speech.voxtral_realtime.tekken import Tekken  # noqa: E402
from rill.tiny_causal.model import SHAPES, config  # noqa: E402

RATE, VOCAB = 16_000, 1200
KEEP_UP_MS = float(os.environ.get("KEEP_UP_MS", "500"))
# rill-tiny-causal's audio section: 64 mel bins, 2 frames of left padding, a 480 ms delay.
AUDIO = AudioSpec(RATE, 160, 400, SHAPES["base"]["mels"], 1.5, 12.5, 2, 480.0)


def random_runtime() -> VoxtralRuntime:
    spec = VoxtralSpec.from_json(config(VOCAB, "base").to_dict(), Path("tiny-causal-base"))
    torch.manual_seed(0)
    with torch.device("meta"):
        model = VoxtralModel(spec)
    model = model.to_empty(device="cpu").float()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.05)
    _rebuild_buffers(model, spec)
    pieces = (b"",) * 1000 + tuple(bytes([97 + i % 26]) for i in range(VOCAB - 1000))
    tekken = Tekken(pieces, {"<s>": 1, "</s>": 2, "[STREAMING_PAD]": 32}, 1000, {})
    return VoxtralRuntime(Path("tiny-causal-base"), "tiny-causal-base-random", spec, AUDIO, model.eval(),
                          MelFrontEnd(AUDIO, torch.device("cpu")), tekken, torch.device("cpu"))


def run(runtime: VoxtralRuntime, n: int, clip_s: float, chunk_s: float, batched: bool) -> dict:
    causal = VoxtralCausal(runtime)
    causal.batch_encoder = batched
    live = LiveStreams(causal)
    audio = synthetic_audio(clip_s, seed=5, rate=RATE)
    piece, pieces = int(chunk_s * RATE), int(clip_s / chunk_s)
    phases = [chunk_s * i / n for i in range(n)]  # streams send at their own moments
    sent = [0] * n
    for i in range(n):
        live.open(str(i), RATE)
    backlogs, busy, steps = [], 0.0, 0
    start = time.perf_counter()
    while True:
        now = time.perf_counter() - start
        for i in range(n):
            while sent[i] < pieces and phases[i] + sent[i] * chunk_s <= now:
                live.feed(str(i), audio[sent[i] * piece : (sent[i] + 1) * piece])
                sent[i] += 1
        if live.has_work():
            t = time.perf_counter()
            live.step()
            busy += time.perf_counter() - t
            steps += 1
            now = time.perf_counter() - start
            if clip_s / 2 < now < clip_s:
                backlogs += [_backlog_s(live, str(i), now - phases[i], sent[i], pieces, chunk_s) for i in range(n)]
        elif min(sent) == pieces:
            break
        else:
            wake = min(phases[i] + sent[i] * chunk_s for i in range(n) if sent[i] < pieces)
            time.sleep(max(0.0, wake - (time.perf_counter() - start)))
    wall = time.perf_counter() - start
    p95 = percentile(backlogs, 95) if backlogs else 0.0
    return {"streams": n, "encoder": "batched" if batched else "per stream", "wall_s": round(wall, 2),
            "steps": steps, "busy": round(busy / wall, 3), "backlog_p95_ms": round(1000 * p95),
            "backlog_max_ms": round(1000 * max(backlogs, default=0.0)), "keeps_up": p95 * 1000 < KEEP_UP_MS,
            "max_encoder_rows": getattr(causal, "max_encoder_rows", 0), "max_decoder_rows": causal.max_rows}


def speed(runtime: VoxtralRuntime, n: int, audio_s: float, chunk_s: float, batched: bool) -> float:
    """As fast as the worker goes: every stream sent a worker step's worth (max_frames), then steps until
    none has work, over and over. Audio seconds each stream gets through per wall second: N streams keep up when it is above 1."""
    causal = VoxtralCausal(runtime)
    causal.batch_encoder = batched
    live = LiveStreams(causal)
    audio = synthetic_audio(audio_s + 1, seed=6, rate=RATE)
    piece = int(chunk_s * RATE)
    for i in range(n):
        live.open(str(i), RATE)
    rounds = [audio[k * piece : (k + 1) * piece] for k in range(int((audio_s + 1) / chunk_s))]
    for k, pcm in enumerate(rounds):
        if k == int(1 / chunk_s):  # the first second (the prompt's positions) is not timed
            start = time.perf_counter()
        for i in range(n):
            live.feed(str(i), pcm)
        while live.has_work():
            live.step()
    return round(audio_s / (time.perf_counter() - start), 2)


def _backlog_s(live: LiveStreams, name: str, elapsed: float, sent: int, pieces: int, chunk_s: float) -> float:
    """Audio a microphone has produced by now and the worker has not run: still unsent (the loop was
    stepping when it was due) or queued in the stream."""
    due = min(pieces, max(0, int(elapsed // chunk_s) + 1))
    stream = live.streams.get(name)
    queued = stream._queue.size / RATE if stream is not None else 0.0
    return (due - sent) * chunk_s + queued


def plot(result: dict, path: Path) -> None:
    def draw(axes):
        for mode, style in (("per stream", "s--"), ("batched", "o-")):
            rows = [r for r in result["runs"] if r["encoder"] == mode]
            axes[0].plot([r["streams"] for r in rows], [r["x_realtime"] for r in rows], style, label=f"encoder {mode}")
        if "before" in result:
            rows = result["before"]["runs"]
            axes[0].plot([r["streams"] for r in rows], [r["x_realtime"] for r in rows], "x:",
                         label="before (stream by stream, conv1d, repeated GQA keys)")
        axes[0].axhline(1.0, color="red", linestyle=":", label="real time")
        axes[0].set_xlabel("concurrent streams")
        axes[0].set_ylabel("audio s per wall s, each stream")
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=7)

    save_plot(path, draw, title=f"Voxtral Realtime (rill-tiny-causal 'base' shape, random weights) live streams, "
                                f"{result['threads']} threads")


def main() -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    streams = [int(x) for x in os.environ.get("STREAMS", "1,8,16,24,32").split(",")]
    clip_s, chunk_s = float(os.environ.get("CLIP_S", "8")), float(os.environ.get("CHUNK_MS", "100")) / 1000
    runtime = random_runtime()
    modes = [m == "batched" for m in os.environ.get("MODES", "per stream,batched").split(",")]
    runs = []
    for n in streams:
        for batched in modes:
            runs.append(run(runtime, n, clip_s, chunk_s, batched))
            runs[-1]["x_realtime"] = speed(runtime, n, min(clip_s, 4.8), MAX_FRAMES_PER_STEP * 0.08, batched)
            print(json.dumps(runs[-1]), flush=True)
    kept = {mode: max([r["streams"] for r in runs if r["encoder"] == mode and r["keeps_up"]], default=0)
            for mode in ("per stream", "batched")}
    fast = {mode: max([r["streams"] for r in runs if r["encoder"] == mode and r["x_realtime"] >= 1.0], default=0)
            for mode in ("per stream", "batched")}
    result = {"shape": "rill-tiny-causal base (random weights)", "threads": torch.get_num_threads(),
              "params_m": round(sum(p.numel() for p in runtime.model.parameters()) / 1e6, 2), "clip_s": clip_s,
              "chunk_ms": chunk_s * 1000, "keep_up_ms": KEEP_UP_MS, "most_streams_kept_up": kept,
              "most_streams_at_least_real_time": fast, "runs": runs}
    out = ROOT / "bench-results" / f"{os.environ.get('OUT', 'voxtral-live-streams')}.json"
    before = ROOT / "bench-results" / "voxtral-live-streams-before.json"
    if out != before and before.exists():  # the code before the encoder was batched (see the docstring)
        result["before"] = json.loads(before.read_text())
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))


if __name__ == "__main__":
    main()
