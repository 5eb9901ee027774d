"""The model: transformers' VoxtralRealtimeForConditionalGeneration at a size one CPU core trains.

Saved as rill's runtime and transformers load it: config.json and model.safetensors (save_pretrained),
preprocessor_config.json (the feature extractor) and the recipe's tekken.json with a streaming audio
section carrying the delay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rill.tiny_causal.targets import FRAME, RIGHT_PAD_FRAMES
from rill.tiny_causal.vocab import NUM_SPECIAL, Vocab

SHAPES = {
    # d_model 192: the decoder 3 layers, the encoder 3 (20 ms positions), 64 mel bins
    "base": dict(d=192, ffn=512, dec_layers=3, enc_layers=3, heads=6, kv_heads=2, head_dim=32, mels=64,
                 dec_window=64, enc_window=256),
    # the tests' shape: seconds to build and step
    "test": dict(d=32, ffn=64, dec_layers=1, enc_layers=1, heads=2, kv_heads=1, head_dim=16, mels=32,
                 dec_window=32, enc_window=64),
}
SAMPLE_RATE = 16_000


def config(vocab_size: int, shape: str = "base"):
    from transformers import VoxtralRealtimeConfig

    s = SHAPES[shape]
    text = dict(vocab_size=vocab_size, hidden_size=s["d"], intermediate_size=s["ffn"], num_hidden_layers=s["dec_layers"],
                num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
                sliding_window=s["dec_window"], max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    audio = dict(hidden_size=s["d"], intermediate_size=s["ffn"], num_hidden_layers=s["enc_layers"],
                 num_attention_heads=s["heads"], head_dim=s["head_dim"], num_mel_bins=s["mels"],
                 sliding_window=s["enc_window"])
    return VoxtralRealtimeConfig(text_config=text, audio_config=audio)


def audio_section(num_mel_bins: int, delay_ms: int, n_left: int) -> dict:
    return dict(sampling_rate=SAMPLE_RATE, frame_rate=12.5, transcription_format="streaming",
                streaming_look_ahead_ms=2.5, streaming_look_back_ms=52.5, transcription_delay_ms=delay_ms,
                streaming_n_left_pad_tokens=n_left,
                audio_encoding_config=dict(num_mel_bins=num_mel_bins, hop_length=160, window_size=400))


def create(vocab: Vocab, shape: str, seed: int = 0):
    from transformers import VoxtralRealtimeFeatureExtractor, VoxtralRealtimeForConditionalGeneration

    torch.manual_seed(seed)
    cfg = config(vocab.size, shape)
    return VoxtralRealtimeForConditionalGeneration(cfg), VoxtralRealtimeFeatureExtractor(feature_size=SHAPES[shape]["mels"])


def load(path: Path):
    from transformers import VoxtralRealtimeFeatureExtractor, VoxtralRealtimeForConditionalGeneration

    return (VoxtralRealtimeForConditionalGeneration.from_pretrained(path), VoxtralRealtimeFeatureExtractor.from_pretrained(path),
            Vocab.load(path))


def grow_vocab(model, old: Vocab, new: Vocab) -> None:
    """`new` extends `old` (the same ids, pieces appended): the embedding and the output head take the new
    rows, each the mean of its piece's bytes' rows, and the config its size."""
    assert new.pieces[: len(old.pieces)] == old.pieces
    model.resize_token_embeddings(new.size, mean_resizing=False)
    rows = [model.get_input_embeddings().weight, model.get_output_embeddings().weight]
    with torch.no_grad():
        for weight in {id(w): w for w in rows}.values():
            for piece in new.pieces[len(old.pieces):]:
                weight[new.ids[piece]] = weight[[NUM_SPECIAL + b for b in piece]].mean(0)


def save(path: Path, model, extractor, vocab: Vocab, delay_ms: int, n_left: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    extractor.save_pretrained(path)
    vocab.save(path, audio_section(extractor.feature_size, delay_ms, n_left))
    return path


def padded_batch(audios: list[np.ndarray], delay: int, n_left: int) -> tuple[np.ndarray, int]:
    """Each clip padded as VoxtralStream pads it, then with more silence to the batch's longest."""
    frames = max(n_left + -(-len(a) // FRAME) + delay + 1 + RIGHT_PAD_FRAMES for a in audios)
    out = np.zeros((len(audios), frames * FRAME), np.float32)
    for i, a in enumerate(audios):
        out[i, n_left * FRAME : n_left * FRAME + len(a)] = a
    return out, frames
