"""Issue 56: one KyutaiStream's speed on CPU, random weights of the real Kyutai STT shapes (no download).

Audio is fed in CHUNK_MS pieces, as a realtime client sends it; reported: audio seconds per wall second
(the real-time factor's inverse: how many such streams one set of THREADS threads keeps up with, each
stream stepped on its own, no batching across streams), ms per 80 ms frame (Mimi and decoder apart),
and the per-stream state in MB once both sliding windows are full.

    SHAPE=1b THREADS=1 SECONDS=20 .venv/bin/python benchmarks/kyutai-stream-speed.py
"""
import json, os, time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from rill.speech.kyutai.config import KyutaiSpec, PaddingSpec  # noqa: E402
from rill.speech.kyutai.decoder import KyutaiDecoder  # noqa: E402
from rill.speech.kyutai.loader import KyutaiRuntime, _rebuild_buffers  # noqa: E402
from rill.speech.kyutai.mimi import MimiEncoder  # noqa: E402
from rill.speech.kyutai.stream import KyutaiStream  # noqa: E402

MIMI = dict(model_type="mimi")  # transformers' MimiConfig defaults are the released codec's shape
SHAPES = {  # kyutai/stt-1b-en_fr and kyutai/stt-2.6b-en: the decoder fields their configs set
    "1b": dict(vocab_size=8001, hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, ffn_dim=11264,
               sliding_window=375, num_codebooks=32, codebook_vocab_size=2049, audio_pad_token_id=8001 + 32 * 2049),
    "2.6b": dict(vocab_size=4001, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, ffn_dim=11264,
                 sliding_window=375, num_codebooks=32, codebook_vocab_size=2049, audio_pad_token_id=4001 + 32 * 2049),
}


def random_runtime(shape: str, dtype: torch.dtype) -> KyutaiRuntime:
    config = dict(model_type="kyutai_speech_to_text", bos_token_id=0, codec_config=MIMI, **SHAPES[shape])
    spec = KyutaiSpec.from_json(config, Path(shape))
    torch.manual_seed(0)
    with torch.device("meta"):
        mimi, decoder = MimiEncoder(spec.codec), KyutaiDecoder(spec)
    mimi, decoder = mimi.to_empty(device="cpu").float(), decoder.to_empty(device="cpu").to(dtype)
    with torch.no_grad():
        for module in (mimi, decoder):
            for p in module.parameters():
                p.normal_(std=0.02)
        for books in (mimi.semantic, mimi.acoustic):
            books.embed.normal_()
    _rebuild_buffers(mimi, decoder, spec)
    return KyutaiRuntime(Path(shape), shape, spec, PaddingSpec(), mimi.eval(), decoder.eval(), None,
                         torch.device("cpu"))


def batched_decoder_ms(runtime: KyutaiRuntime, rows: int, steps: int = 6) -> float:
    """ms per decoder step for `rows` streams stepped together (one state of that many rows): what
    batching across streams (issue 56 item 2) would pay; the window is filled first."""
    decoder, spec = runtime.decoder, runtime.spec
    state = decoder.new_state()
    text = torch.zeros(rows, dtype=torch.long)
    codes = torch.zeros(rows, spec.num_codebooks, dtype=torch.long)
    for layer in state.layers:  # a full window of keys and values, as an hour-long stream has
        shape = (rows, spec.num_kv_heads, spec.sliding_window - 1, spec.head_dim)
        layer.k, layer.v = torch.randn(shape, dtype=decoder.lm_head.weight.dtype), torch.randn(shape)
    KyutaiDecoder.step(decoder, text, codes, state)
    t = time.perf_counter()
    for _ in range(steps):
        KyutaiDecoder.step(decoder, text, codes, state)
    return 1000 * (time.perf_counter() - t) / steps


def main() -> None:
    shape, seconds = os.environ.get("SHAPE", "1b"), float(os.environ.get("SECONDS", "20"))
    chunk = int(os.environ.get("CHUNK_MS", "80")) * 24
    dtype = getattr(torch, os.environ.get("DTYPE", "float32"))
    runtime = random_runtime(shape, dtype)
    params = sum(p.numel() for m in (runtime.mimi, runtime.decoder) for p in m.parameters())
    audio = (0.1 * np.random.default_rng(0).standard_normal(int(seconds * 24000))).astype(np.float32)
    stream = KyutaiStream(runtime)
    stream.feed(audio[:24000])  # warm-up second, untimed
    mimi_s = step_s = 0.0
    encode, step = runtime.mimi.encode, runtime.decoder.step

    def timed(fn, bucket):
        def run(*a, **k):
            nonlocal mimi_s, step_s
            t = time.perf_counter()
            out = fn(*a, **k)
            if bucket == "mimi":
                mimi_s += time.perf_counter() - t
            else:
                step_s += time.perf_counter() - t
            return out
        return run

    runtime.mimi.encode, runtime.decoder.step = timed(encode, "mimi"), timed(step, "step")
    # (the batched measure below calls the untimed methods through the class)
    t0, frames0 = time.perf_counter(), stream.num_frames
    for i in range(24000, audio.size, chunk):
        stream.feed(audio[i:i + chunk])
    wall = time.perf_counter() - t0
    frames = stream.num_frames - frames0
    kv = [*stream._decoder.layers, *stream._mimi.layers]
    state_bytes = sum(c.k.numel() * c.k.element_size() * 2 for c in kv if c.k is not None)
    state_bytes += sum(s.numel() * s.element_size() for s in stream._mimi.conv_states if s is not None)
    print(json.dumps({
        "shape": shape, "params_m": round(params / 1e6), "dtype": str(dtype), "threads": torch.get_num_threads(),
        "chunk_ms": chunk // 24, "audio_s": round(frames * 0.08, 2), "wall_s": round(wall, 2),
        "audio_s_per_wall_s": round(frames * 0.08 / wall, 3), "ms_per_frame": round(1000 * wall / frames, 1),
        "mimi_ms_per_frame": round(1000 * mimi_s / frames, 1), "decoder_ms_per_step": round(1000 * step_s / frames, 1),
        "stream_state_mb": round(state_bytes / 2**20, 1),
        "decoder_ms_per_step_batched": {b: round(batched_decoder_ms(runtime, b), 1)
                                        for b in map(int, os.environ.get("BATCH", "1,8,32").split(","))}}))


if __name__ == "__main__":
    main()
