"""Random-weight Kyutai STT directories made with transformers' config classes and save_pretrained (no hub).

`make_kyutai_dir(path, shape, seed)` writes what kyutai/stt-*-trfs holds: config.json (the decoder and its
Mimi `codec_config`), model.safetensors, tokenizer.json + tokenizer_config.json (a word-piece vocabulary of
the decoder's `vocab_size`, ids 0-3 the specials <unk> <s> </s> <pad> as in Kyutai's) and
preprocessor_config.json (the feature extractor's silence prefix and delay).

Random weights are made to give a test teeth: transformers initialises every codebook to zero (every frame
would get code 0) and the decoder at std 0.02 (flat logits); here the codebooks are random and the decoder's
matrices have std `DECODER_STD`, so codes vary, greedy paths differ from seed to seed and wander over the
vocabulary. `hf_transcribe(path, audio)` is transformers' side, the oracle: greedy `generate` on the whole
clip through its feature extractor, with each step's logits.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SAMPLE_RATE = 24_000
FRAME = 1920  # samples per 80 ms frame at 24 kHz
DECODER_STD = 0.3
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]

# Shapes: (decoder fields, codec fields, preprocessor fields). Windows are short so that clips of a few
# seconds run well past both the decoder's and Mimi's sliding windows.
SHAPES = {
    "small": (dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   ffn_dim=64, sliding_window=12),
              dict(hidden_size=32, num_filters=8, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
                   num_key_value_heads=4, codebook_size=16, codebook_dim=8, num_quantizers=8,
                   vector_quantization_hidden_dimension=8, sliding_window=10),
              dict()),
    "wide": (dict(vocab_size=96, hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=6,
                  ffn_dim=128, sliding_window=20, rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
             dict(hidden_size=48, num_filters=4, num_residual_layers=2, num_hidden_layers=1, intermediate_size=96,
                  num_attention_heads=4, num_key_value_heads=2, codebook_size=32, codebook_dim=12, num_quantizers=4,
                  num_semantic_quantizers=2, vector_quantization_hidden_dimension=12, sliding_window=16,
                  pad_mode="replicate"),
             dict(audio_delay_seconds=0.5, audio_silence_prefix_seconds=0.25)),
    "deep": (dict(vocab_size=80, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
                  ffn_dim=96, sliding_window=40),
             dict(hidden_size=32, num_filters=8, num_hidden_layers=3, intermediate_size=64, num_attention_heads=2,
                  num_key_value_heads=2, codebook_size=64, codebook_dim=16, num_quantizers=16,
                  vector_quantization_hidden_dimension=16, sliding_window=30),
             dict(audio_delay_seconds=0.25)),
}


def kyutai_config(shape: str):
    from transformers import KyutaiSpeechToTextConfig

    decoder, codec, _ = SHAPES[shape]
    codec = dict(model_type="mimi", upsample_groups=codec["hidden_size"], **codec)
    num_codebooks, card = codec["num_quantizers"], codec["codebook_size"] + 1
    return KyutaiSpeechToTextConfig(
        **decoder, num_codebooks=num_codebooks, codebook_vocab_size=card, audio_bos_token_id=card - 1,
        audio_pad_token_id=decoder["vocab_size"] + num_codebooks * card, bos_token_id=decoder["vocab_size"] - 1,
        pad_token_id=3, max_position_embeddings=4096, codec_config=codec)


def make_kyutai_dir(path: Path, shape: str = "small", seed: int = 0) -> Path:
    from transformers import KyutaiSpeechToTextFeatureExtractor, KyutaiSpeechToTextForConditionalGeneration

    torch.manual_seed(seed)
    model = KyutaiSpeechToTextForConditionalGeneration(kyutai_config(shape)).eval()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("codebook.embed_sum"):
                tensor.normal_()
            elif not name.startswith("codec_model") and tensor.dim() == 2:
                tensor.normal_(std=DECODER_STD)
    model.save_pretrained(path)
    KyutaiSpeechToTextFeatureExtractor(**SHAPES[shape][2]).save_pretrained(path)
    save_tokenizer(path, model.config.vocab_size)
    return path


def save_tokenizer(path: Path, vocab_size: int) -> None:
    """Word pieces: every third a word start (`▁`), the rest continuations, after the four specials."""
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for i in range(len(SPECIALS), vocab_size):
        vocab[f"▁w{i}" if i % 3 == 0 else f"p{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(path / "tokenizer.json"))
    config = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def synthetic_audio(seconds: float, seed: int = 0, rate: int = SAMPLE_RATE) -> np.ndarray:
    """A deterministic float32 signal (chirp + noise + a pause), not silence."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    freq = 150 + 400 * rng.random() + 120 * np.sin(2 * np.pi * (0.3 + rng.random()) * t)
    signal = 0.4 * np.sin(2 * np.pi * np.cumsum(freq) / rate) + 0.1 * rng.standard_normal(t.shape)
    signal[(t > seconds * 0.4) & (t < seconds * 0.55)] *= 0.01
    return signal.astype(np.float32)


@lru_cache(maxsize=8)
def hf_model(path: Path):
    from transformers import KyutaiSpeechToTextForConditionalGeneration

    return KyutaiSpeechToTextForConditionalGeneration.from_pretrained(path).eval()


def hf_transcribe(path: Path, audio: np.ndarray) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy generate on the whole 24 kHz clip: (text tokens after BOS, logits per step)."""
    from transformers import KyutaiSpeechToTextFeatureExtractor

    inputs = KyutaiSpeechToTextFeatureExtractor.from_pretrained(path)(audio, sampling_rate=SAMPLE_RATE,
                                                                       return_tensors="pt")
    with torch.inference_mode():
        out = hf_model(path).generate(**inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, 1:].tolist(), [step[0].float() for step in out.logits]
