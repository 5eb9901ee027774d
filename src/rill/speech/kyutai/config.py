"""What rill reads of a Kyutai STT directory: config.json (the decoder and its `codec_config`, a Mimi
codec) and preprocessor_config.json (the silence the feature extractor puts around a clip).

Kyutai's STT (KyutaiSpeechToTextForConditionalGeneration) is a Mimi encoder, causal end to end, that turns
each 80 ms of 24 kHz audio (one 1920-sample frame) into `num_codebooks` codes, and a decoder-only text model
whose every position sums one text token's embedding with one frame's code embeddings: the text runs at a
fixed delay behind the audio (Delayed Streams Modeling), so each frame gives exactly one text token.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rill.errors import ModelLoadError

ARCHITECTURE = "KyutaiSpeechToTextForConditionalGeneration"
MODEL_TYPE = "kyutai_speech_to_text"


@dataclass(frozen=True)
class MimiSpec:
    """The encoder half of the Mimi codec (the decoder half is never run for speech-to-text)."""

    sampling_rate: int
    hidden_size: int
    num_filters: int
    num_residual_layers: int
    upsampling_ratios: tuple[int, ...]  # the encoder downsamples by these in reverse order
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    compress: int
    pad_mode: str  # "constant" or "replicate": what a causal conv sees before the first sample
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    norm_eps: float
    rope_theta: float
    sliding_window: int  # in 25 Hz encoder steps, the current one included
    attention_bias: bool
    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    num_semantic_quantizers: int
    vq_hidden_dim: int

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsampling_ratios)  # samples per encoder-transformer step (960 at 24 kHz)

    @property
    def frame_size(self) -> int:
        return 2 * self.hop_length  # the downsampling conv has stride 2: 1920 samples = 80 ms per frame

    @classmethod
    def from_json(cls, c: dict, file: Path) -> MimiSpec:
        if not c.get("use_causal_conv", True):
            raise ModelLoadError(f"{file}: codec_config.use_causal_conv is false; only causal Mimi streams")
        if c.get("use_conv_shortcut", False):
            raise ModelLoadError(f"{file}: codec_config.use_conv_shortcut is not supported")
        if c.get("pad_mode", "constant") not in ("constant", "replicate"):
            raise ModelLoadError(f"{file}: codec_config.pad_mode {c.get('pad_mode')!r} is not supported")
        heads = c.get("num_attention_heads", 8)
        hidden = c.get("hidden_size", 512)
        return cls(
            c.get("sampling_rate", 24000), hidden, c.get("num_filters", 64), c.get("num_residual_layers", 1),
            tuple(c.get("upsampling_ratios") or (8, 6, 5, 4)), c.get("kernel_size", 7), c.get("last_kernel_size", 3),
            c.get("residual_kernel_size", 3), c.get("dilation_growth_rate", 2), c.get("compress", 2),
            c.get("pad_mode", "constant"), c.get("num_hidden_layers", 8), heads, c.get("num_key_value_heads", heads),
            c.get("head_dim") or hidden // heads, c.get("intermediate_size", 2048), c.get("hidden_act", "gelu"),
            c.get("norm_eps", 1e-5), _rope_theta(c), c.get("sliding_window", 250), c.get("attention_bias", False),
            c.get("codebook_size", 2048), c.get("codebook_dim", 256) or hidden, c.get("num_quantizers", 32),
            c.get("num_semantic_quantizers", 1), c.get("vector_quantization_hidden_dimension", 256))


@dataclass(frozen=True)
class KyutaiSpec:
    """The text decoder, and the token ids that frame its two streams."""

    vocab_size: int  # text tokens; the embedding table also holds every codebook's codes and one pad
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int  # fc1's width: half gates the other half
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int  # decoder positions attended, the current one included
    num_codebooks: int
    codebook_vocab_size: int
    audio_bos_token_id: int
    audio_pad_token_id: int
    bos_token_id: int
    pad_token_id: int | None
    codec: MimiSpec

    @property
    def embed_rows(self) -> int:
        return self.vocab_size + self.num_codebooks * self.codebook_vocab_size + 1

    @classmethod
    def from_json(cls, c: dict, file: Path) -> KyutaiSpec:
        if c.get("model_type") != MODEL_TYPE:
            raise ModelLoadError(f"{file}: model_type {c.get('model_type')!r} is not {MODEL_TYPE!r}")
        if not isinstance(c.get("codec_config"), dict):
            raise ModelLoadError(f"{file}: codec_config (the Mimi codec) is missing")
        codec = MimiSpec.from_json(c["codec_config"], file)
        heads, hidden = c.get("num_attention_heads", 32), c.get("hidden_size", 2048)
        spec = cls(
            c.get("vocab_size", 4001), hidden, c.get("num_hidden_layers", 48), heads,
            c.get("num_key_value_heads") or heads, c.get("head_dim") or hidden // heads, c.get("ffn_dim", 11264),
            c.get("hidden_act", "silu"), c.get("rms_norm_eps", 1e-8), _rope_theta(c), c.get("sliding_window", 375),
            c.get("num_codebooks", 32), c.get("codebook_vocab_size", 2049), c.get("audio_bos_token_id", 2048),
            c.get("audio_pad_token_id", 69569), c.get("bos_token_id", 48000), c.get("pad_token_id", 3), codec)
        if spec.num_codebooks > codec.num_quantizers:
            raise ModelLoadError(f"{file}: num_codebooks {spec.num_codebooks} exceeds the codec's "
                                 f"num_quantizers {codec.num_quantizers}")
        if spec.ffn_dim % 2:
            raise ModelLoadError(f"{file}: ffn_dim must be even (found {spec.ffn_dim})")
        return spec


@dataclass(frozen=True)
class PaddingSpec:
    """preprocessor_config.json: silence before the clip, and the delay's worth (plus one second) after it."""

    sampling_rate: int = 24000
    silence_prefix_s: float = 0.0
    delay_s: float = 0.0

    @property
    def prefix_samples(self) -> int:
        return int(self.silence_prefix_s * self.sampling_rate)

    @property
    def suffix_samples(self) -> int:
        # transformers' feature extractor: int((audio_delay_seconds + 1.0) * sampling_rate)
        return int((self.delay_s + 1.0) * self.sampling_rate)

    @classmethod
    def from_dir(cls, model_dir: Path) -> PaddingSpec:
        file = model_dir / "preprocessor_config.json"
        if not file.is_file():
            return cls()
        c = read_json(file)
        return cls(c.get("sampling_rate", 24000), c.get("audio_silence_prefix_seconds") or 0.0,
                   c.get("audio_delay_seconds") or 0.0)


def _rope_theta(c: dict) -> float:
    rope = c.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ModelLoadError(f"rope_type {rope.get('rope_type')!r} is not supported (only 'default')")
    return float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))


def read_json(file: Path) -> dict:
    if not file.is_file():
        raise ModelLoadError(f"{file.parent}: {file.name} not found (expected a Kyutai STT directory)")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file}: not valid JSON ({e})") from None
