"""rill-tiny-speech's shape: a small WhisperForConditionalGeneration with a window shorter than 30 s.

The window decides the encoder's cost (Whisper pads every input to it), so it is as short as the
spoken questions allow. config.json's max_source_positions, preprocessor_config.json's
chunk_length / n_samples / nb_max_frames and generation_config.json agree on it, so
WhisperFeatureExtractor, WhisperForConditionalGeneration and `generate` work together unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor

from rill.speech.features import FeatureConfig
from rill.tiny_speech import tokenizer as tok

SAMPLE_RATE = 16_000
HOP_LENGTH = 320  # 20 ms frames, 40 ms encoder positions: twice Whisper's hop (see Shape)
N_FFT = 400
NUM_MEL_BINS = 80


@dataclass(frozen=True)
class Shape:
    window_s: int = 5  # the longest held-out question at the slowest rate is about 4.5 s
    # Whisper's 10 ms hop gives 50 encoder positions a second; espeak-ng's fastest rate says about
    # 15 phones a second, so 25 positions (a 20 ms hop) still give each phone two, and halve the
    # encoder's cost (Whisper pads every input to the window). preprocessor_config.json carries the
    # hop, so transformers' WhisperFeatureExtractor and rill's LogMel read it alike.
    hop_length: int = HOP_LENGTH
    d_model: int = 192
    encoder_layers: int = 3
    decoder_layers: int = 3
    heads: int = 4
    ffn_mult: int = 4

    @property
    def n_samples(self) -> int:
        return self.window_s * SAMPLE_RATE

    @property
    def num_frames(self) -> int:
        return self.n_samples // self.hop_length

    @property
    def max_source_positions(self) -> int:
        return self.num_frames // 2  # the encoder's second convolution has stride 2


def whisper_config(shape: Shape, vocab_size: int, ids: dict[str, int]) -> WhisperConfig:
    return WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=NUM_MEL_BINS, d_model=shape.d_model,
        encoder_layers=shape.encoder_layers, decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.heads, decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn_mult * shape.d_model, decoder_ffn_dim=shape.ffn_mult * shape.d_model,
        max_source_positions=shape.max_source_positions, max_target_positions=tok.MODEL_MAX_LENGTH,
        decoder_start_token_id=ids[tok.STARTOFTRANSCRIPT], bos_token_id=ids[tok.ENDOFTEXT],
        eos_token_id=ids[tok.ENDOFTEXT], pad_token_id=ids[tok.ENDOFTEXT],
        suppress_tokens=None, begin_suppress_tokens=None,  # generation_config.json carries them
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, apply_spec_augment=False,
        scale_embedding=False, tie_word_embeddings=True, use_cache=True, dtype="float32",
    )


def suppress_tokens(ids: dict[str, int]) -> list[int]:
    """Special tokens a transcript never contains (<|endoftext|> ends it; <|notimestamps|> is in the prompt)."""
    return sorted(ids[t] for t in tok.SPECIAL_TOKENS if t not in (tok.ENDOFTEXT, tok.NOTIMESTAMPS))


def begin_suppress_tokens(ids: dict[str, int]) -> list[int]:
    return [ids[tok.ENDOFTEXT]]


def generation_config(ids: dict[str, int]) -> GenerationConfig:
    """English-only, as OpenAI's *.en checkpoints: the prompt is <|startoftranscript|><|notimestamps|>."""
    return GenerationConfig(
        decoder_start_token_id=ids[tok.STARTOFTRANSCRIPT], bos_token_id=ids[tok.ENDOFTEXT],
        eos_token_id=ids[tok.ENDOFTEXT], pad_token_id=ids[tok.ENDOFTEXT], max_length=tok.MODEL_MAX_LENGTH,
        is_multilingual=False, no_timestamps_token_id=ids[tok.NOTIMESTAMPS], prev_sot_token_id=ids[tok.STARTOFPREV],
        suppress_tokens=suppress_tokens(ids), begin_suppress_tokens=begin_suppress_tokens(ids),
        return_timestamps=False, do_sample=False,
    )


def feature_extractor(shape: Shape) -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(feature_size=NUM_MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=shape.hop_length,
                                   chunk_length=shape.window_s, n_fft=N_FFT, padding_value=0.0,
                                   return_attention_mask=False)


def feature_config(shape: Shape) -> FeatureConfig:
    """rill's LogMel settings for the same features (the recipe computes them in torch)."""
    return FeatureConfig(feature_size=NUM_MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=shape.hop_length, n_fft=N_FFT,
                         chunk_length=shape.window_s, n_samples=shape.n_samples, nb_max_frames=shape.num_frames)


def prompt_ids(ids: dict[str, int]) -> list[int]:
    return [ids[tok.STARTOFTRANSCRIPT], ids[tok.NOTIMESTAMPS]]
