"""Issue 50: one KokoroBackend.synthesize call's speed on CPU, random weights of Kokoro-82M's real shape.

A clause of CHARS phonemes (about a spoken sentence), synthesized alone and as a batch of BATCH (the
speech-out worker's max_batch): audio seconds per wall second, row by row (rill's CPU default) and with
the decoder batched (its CUDA default). Random weights speak at about 4.5 frames (110 ms) per phoneme.

    THREADS=2 CHARS=60 BATCH=16 .venv/bin/python benchmarks/kokoro-speed.py
"""
import json, os, tempfile, time
from pathlib import Path

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "2")))
from rill.tts.kokoro import load_kokoro_backend, make_random_kokoro_dir  # noqa: E402

CHARS, BATCH = int(os.environ.get("CHARS", "60")), int(os.environ.get("BATCH", "16"))
CLAUSE = ("ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˈOvəɹ ðə lˈAzi dˈɑɡ, " * 4)[:CHARS].strip()


def rate(backend, n: int) -> dict:
    start = time.perf_counter()
    audio = backend.synthesize_phonemes([CLAUSE] * n, ["af_alloy"] * n, [1.0] * n)
    wall = time.perf_counter() - start
    audio_s = sum(len(a) for a in audio) / backend.sample_rate
    return {"utterances": n, "audio_s": round(audio_s, 2), "wall_s": round(wall, 2),
            "audio_s_per_s": round(audio_s / wall, 2)}


with tempfile.TemporaryDirectory() as tmp:
    backend = load_kokoro_backend(make_random_kokoro_dir(Path(tmp) / "kokoro", shape="kokoro-82m"), device="cpu")
    rate(backend, 1)  # warm-up
    out = {"threads": torch.get_num_threads(), "phonemes": len(CLAUSE), "alone": rate(backend, 1),
           f"batch_{BATCH}_row_by_row": rate(backend, BATCH)}
    backend.decode_together = True
    out[f"batch_{BATCH}_decoder_batched"] = rate(backend, BATCH)
print(json.dumps(out, indent=1))
