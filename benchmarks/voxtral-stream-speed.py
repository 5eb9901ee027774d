"""Issue 56: one VoxtralStream's speed on CPU, random weights of the real Voxtral Mini 4B Realtime shape
(no download; transformers' VoxtralRealtimeConfig defaults are the released model's shape).

Audio is fed in CHUNK_MS pieces, as a realtime client sends it; reported: audio seconds per wall second
(the real-time factor's inverse: how many such streams one set of THREADS threads keeps up with, each
stream stepped on its own, no batching across streams), ms per 80 ms frame (front end + encoder and decoder
apart), and the per-stream state in MB once both sliding windows are full. LAYERS_SCALE < 1 builds fewer
layers of the same widths (when the whole model does not fit in memory): two such runs give the cost per
layer and the fixed cost (embeddings, head), and so the whole model's by a straight line.

    DTYPE=bfloat16 THREADS=1 SECONDS=4 .venv/bin/python benchmarks/voxtral-stream-speed.py
"""
import json, os, time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from rill.speech.voxtral_realtime.config import AudioSpec, VoxtralSpec  # noqa: E402
from rill.speech.voxtral_realtime.features import MelFrontEnd  # noqa: E402
from rill.speech.voxtral_realtime.loader import VoxtralModel, VoxtralRuntime, _rebuild_buffers  # noqa: E402
from rill.speech.voxtral_realtime.stream import VoxtralStream  # noqa: E402
from rill.speech.voxtral_realtime.tekken import Tekken  # noqa: E402

# tekken.json's audio section as the released model ships it (480 ms delay, 32 frames of left padding).
AUDIO = AudioSpec(16000, 160, 400, 128, 1.5, 12.5, 32, 480.0)


def random_runtime(dtype: torch.dtype, scale: float) -> VoxtralRuntime:
    from transformers import VoxtralRealtimeConfig

    spec = VoxtralSpec.from_json(VoxtralRealtimeConfig().to_dict(), Path("voxtral"))
    spec = replace(spec, encoder=replace(spec.encoder, num_layers=max(1, round(spec.encoder.num_layers * scale))),
                   decoder=replace(spec.decoder, num_layers=max(1, round(spec.decoder.num_layers * scale))))
    torch.manual_seed(0)
    with torch.device("meta"):
        model = VoxtralModel(spec)
    model = model.to_empty(device="cpu").to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.02)
    _rebuild_buffers(model, spec)
    pieces = (b"",) * 1000 + tuple(bytes([i % 256]) for i in range(spec.vocab_size - 1000))
    tekken = Tekken(pieces, {"<s>": 1, "</s>": 2, "[STREAMING_PAD]": 32}, 1000, {})
    return VoxtralRuntime(Path("voxtral"), "voxtral", spec, AUDIO, model.eval(),
                          MelFrontEnd(AUDIO, torch.device("cpu")), tekken, torch.device("cpu"))


def state_mb(stream: VoxtralStream) -> float:
    """Both windows full: what an hour-long stream holds (keys and values of every layer)."""
    spec, size = stream.runtime.spec, stream.runtime.model.lm_head.weight.element_size()
    enc, dec = spec.encoder, spec.decoder
    enc_bytes = 2 * enc.num_layers * (enc.sliding_window - 1) * enc.num_kv_heads * enc.head_dim * size
    dec_bytes = 2 * dec.num_layers * (dec.sliding_window - 1) * dec.num_kv_heads * dec.head_dim * size
    return (enc_bytes + dec_bytes) / 1e6


def main() -> None:
    dtype = getattr(torch, os.environ.get("DTYPE", "float32"))
    scale = float(os.environ.get("LAYERS_SCALE", "1"))
    seconds, chunk_ms = float(os.environ.get("SECONDS", "4")), int(os.environ.get("CHUNK_MS", "80"))
    runtime = random_runtime(dtype, scale)
    params = sum(p.numel() for p in runtime.model.parameters())
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)
    chunk = chunk_ms * 16
    stream = VoxtralStream(runtime)
    stream.feed(audio[:chunk])  # the first piece runs the prompt (32 frames of silence + the delay) at once
    enc_s = 0.0
    prepare = stream.prepare  # the front end and the encoder (the prompt's positions are run already)

    def timed_prepare(limit=None):
        nonlocal enc_s
        t = time.perf_counter(); prepare(limit); enc_s += time.perf_counter() - t

    stream.prepare = timed_prepare
    start, positions = time.perf_counter(), stream.num_positions
    for i in range(chunk, audio.size, chunk):
        stream.feed(audio[i : i + chunk])
    wall = time.perf_counter() - start
    dec_s = wall - enc_s  # the decoder's positions and the sampling
    frames = stream.num_positions - positions
    fed_s = (audio.size - chunk) / 16000
    spec = runtime.spec
    print(json.dumps(dict(
        shape="Voxtral-Mini-4B-Realtime", dtype=str(dtype), encoder_layers=spec.encoder.num_layers,
        decoder_layers=spec.decoder.num_layers, params_m=round(params / 1e6), threads=torch.get_num_threads(),
        chunk_ms=chunk_ms, audio_s=round(fed_s, 2), frames=frames, audio_s_per_wall_s=round(fed_s / wall, 3),
        ms_per_frame=round(1000 * wall / frames, 1), encoder_ms=round(1000 * enc_s / frames, 1),
        decoder_ms=round(1000 * dec_s / frames, 1), state_mb_full_windows=round(state_mb(stream), 1))))

if __name__ == "__main__":
    main()
