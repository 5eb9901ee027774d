"""Random-weight Voxtral Realtime directories made with transformers' config classes and save_pretrained.

`make_voxtral_dir(path, shape, seed)` writes what mistralai/Voxtral-Mini-4B-Realtime-2602 holds for
transformers: config.json, model.safetensors, preprocessor_config.json and tekken.json (a small byte-level
vocabulary: the special tokens mistral-common names, the 256 bytes, a few merges, and an audio section of
a streaming model with the shape's delay and left padding).

Random weights are made to give a test teeth: at transformers' std 0.02 the logits are flat and greedy
decoding repeats one token; here the decoder's and projector's matrices have std `DECODER_STD`, so greedy
paths wander over the vocabulary and differ from seed to seed. `hf_transcribe(path, audio)` is the oracle:
mistral-common's padding and prompt for an offline streaming request, transformers' feature extractor,
then greedy `generate` with each step's logits.
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from helpers_kyutai import synthetic_audio as kyutai_signal

SAMPLE_RATE = 16_000
FRAME = 1280  # samples per 80 ms frame
DECODER_STD = 0.3
SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
            "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]",
            "[CALL_ID]", "[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", "[THINK]", "[/THINK]", "[STREAMING_PAD]",
            "[STREAMING_WORD]"]
NUM_SPECIAL = 40  # the rest are fillers, as in Mistral's files
MERGES = [b" t", b"he", b" the", b"in", b"er", b" a", b"on", b"\xc3\xa9", b" w", b"or", b"en", b"at", b"es",
          b" s", b"ing", b"ed", b" c", b"an", b"\xe2\x80\x99", b"ou", b"it", b"is", b" o", b"ar"]
VOCAB_SIZE = NUM_SPECIAL + 256 + len(MERGES)  # 320

# Shapes: (text_config fields, audio_config fields, audio section fields). Windows are short so that clips
# of a few seconds run well past the encoder's (20 ms positions) and the decoder's (80 ms) windows.
SHAPES = {
    "small": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, sliding_window=12),
              dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=8,
                   num_mel_bins=32, sliding_window=10),
              dict(transcription_delay_ms=480, streaming_n_left_pad_tokens=2)),
    "wide": (dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=6, head_dim=16, sliding_window=20,
                  rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
             dict(hidden_size=24, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, head_dim=16,
                  num_mel_bins=64, sliding_window=16),
             dict(transcription_delay_ms=160, streaming_n_left_pad_tokens=0)),
    "deep": (dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, sliding_window=40),
             dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, head_dim=16,
                  num_mel_bins=128, sliding_window=30),
             dict(transcription_delay_ms=800, streaming_n_left_pad_tokens=4)),
}


def voxtral_config(shape: str):
    from transformers import VoxtralRealtimeConfig

    text, audio, _ = SHAPES[shape]
    text = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, **text)
    return VoxtralRealtimeConfig(text_config=text, audio_config=dict(audio))


def make_voxtral_dir(path: Path, shape: str = "small", seed: int = 0) -> Path:
    from transformers import VoxtralRealtimeFeatureExtractor, VoxtralRealtimeForConditionalGeneration

    torch.manual_seed(seed)
    model = VoxtralRealtimeForConditionalGeneration(voxtral_config(shape)).eval()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.dim() == 2 and ("language_model" in name or "projector" in name):
                tensor.normal_(std=DECODER_STD)
    model.save_pretrained(path)
    VoxtralRealtimeFeatureExtractor(feature_size=SHAPES[shape][1]["num_mel_bins"]).save_pretrained(path)
    save_tekken(path, SHAPES[shape][1]["num_mel_bins"], SHAPES[shape][2])
    return path


def save_tekken(path: Path, num_mel_bins: int, audio: dict) -> None:
    specials = [{"rank": i, "token_str": name, "is_control": True} for i, name in enumerate(SPECIALS)]
    pieces = [bytes([b]) for b in range(256)] + MERGES
    vocab = [{"rank": i, "token_bytes": base64.b64encode(p).decode(), "token_str": _str(p)}
             for i, p in enumerate(pieces)]
    section = dict(sampling_rate=SAMPLE_RATE, frame_rate=12.5, transcription_format="streaming",
                   streaming_look_ahead_ms=2.5, streaming_look_back_ms=52.5,
                   audio_encoding_config=dict(num_mel_bins=num_mel_bins, hop_length=160, window_size=400), **audio)
    config = dict(pattern=r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+", num_vocab_tokens=len(vocab),
                  default_vocab_size=VOCAB_SIZE, default_num_special_tokens=NUM_SPECIAL, version="v13")
    data = dict(config=config, vocab=vocab, special_tokens=specials, audio=section)
    (path / "tekken.json").write_text(json.dumps(data))


def _str(piece: bytes) -> str | None:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None


def synthetic_audio(seconds: float, seed: int = 0, rate: int = SAMPLE_RATE) -> np.ndarray:
    """helpers_kyutai's test signal (chirp + noise + a pause), at Voxtral's 16 kHz unless told."""
    return kyutai_signal(seconds, seed, rate)


@lru_cache(maxsize=8)
def hf_model(path: Path):
    from transformers import VoxtralRealtimeForConditionalGeneration

    return VoxtralRealtimeForConditionalGeneration.from_pretrained(path).eval()


def hf_inputs(path: Path, audio: np.ndarray, delay_ms: float | None = None) -> dict:
    """mistral-common's offline streaming request (padding and prompt), transformers' log-mel features."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from transformers import VoxtralRealtimeFeatureExtractor

    instruct = MistralTokenizer.from_file(str(path / "tekken.json")).instruct_tokenizer
    encoder = instruct.audio_encoder
    padded = encoder.pad(audio, SAMPLE_RATE, delay_ms)
    ids = instruct.start() + encoder.encode_streaming_tokens(delay_ms)
    features = VoxtralRealtimeFeatureExtractor.from_pretrained(path)(padded, sampling_rate=SAMPLE_RATE,
                                                                     return_tensors="pt")
    return dict(input_ids=torch.tensor([ids]), input_features=features.input_features,
                num_delay_tokens=encoder.audio_config.get_num_delay_tokens(delay_ms))


def hf_transcribe(path: Path, audio: np.ndarray, delay_ms: float | None = None):
    """transformers' greedy generate on the whole clip: (generated tokens, logits per step, prompt)."""
    inputs = hf_inputs(path, audio, delay_ms)
    with torch.inference_mode():
        out = hf_model(path).generate(**inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    prompt = inputs["input_ids"][0].tolist()
    return out.sequences[0, len(prompt):].tolist(), [step[0].float() for step in out.logits], prompt
