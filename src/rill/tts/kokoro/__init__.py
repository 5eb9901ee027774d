"""A neural voice with Kokoro-82M's architecture (StyleTTS 2 lineage), loaded from a local directory.

    config.py      config.json, the weights (.pth or safetensors, weight_norm folded), voices/*.pt
    vocab.py       Kokoro v1.0's phoneme alphabet
    phonemes.py    espeak-ng IPA -> Kokoro's alphabet; long phoneme strings cut as KPipeline cuts them
    albert.py      the ALBERT text encoder for durations
    prosody.py     the phoneme encoder, duration and prosody (F0, energy) predictors
    layers.py      style-normed residual blocks, with masks for batching
    source.py      the harmonic excitation and the STFT pair (the model's only randomness)
    decoder.py     the iSTFTNet decoder and generator
    model.py       KokoroModel: phoneme ids + style -> audio, batched
    backend.py     KokoroBackend (rill.tts.backend's VoiceBackend) and load_kokoro_backend
    random_dir.py  make_random_kokoro_dir: random weights in the authors' layout, for tests and benches
"""

from rill.tts.kokoro.backend import KokoroBackend, load_kokoro_backend
from rill.tts.kokoro.random_dir import make_random_kokoro_dir

__all__ = ["KokoroBackend", "load_kokoro_backend", "make_random_kokoro_dir"]
