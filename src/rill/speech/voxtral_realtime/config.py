"""What rill reads of a Voxtral Realtime directory: config.json (the audio encoder, the text decoder and
how they meet), preprocessor_config.json (the log-mel front end) and tekken.json's audio section (the
padding and the delay).

Voxtral Realtime (VoxtralRealtimeForConditionalGeneration, mistralai/Voxtral-Mini-4B-Realtime-2602) is a
Whisper-like encoder made causal (causal convolutions, sliding-window attention) over 16 kHz log-mel
frames every 10 ms, and a Mistral-like decoder. Each 80 ms of audio (8 mel frames, 4 encoder positions)
is projected into one embedding that is summed with one text token's embedding at one decoder position:
text runs a fixed delay behind the audio (Delayed Streams Modeling), one token per 80 ms, most of them
the streaming pad. The delay also conditions the decoder's MLPs (a sinusoidal embedding of the number of
delay tokens scales each MLP's input).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rill.errors import ModelLoadError

ARCHITECTURE = "VoxtralRealtimeForConditionalGeneration"
MODEL_TYPE = "voxtral_realtime"

# transformers' VoxtralRealtimeConfig defaults, for fields a config.json leaves out.
_TEXT_DEFAULTS = dict(vocab_size=131072, hidden_size=3072, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                      rope_theta=1e6, sliding_window=8192, hidden_act="silu", tie_word_embeddings=True)
_AUDIO_DEFAULTS = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=32,
                       head_dim=64, num_mel_bins=128, rms_norm_eps=1e-5, rope_theta=1e4, sliding_window=750,
                       hidden_act="silu")


@dataclass(frozen=True)
class LayerStack:
    """One transformer stack (the encoder's or the decoder's)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int  # positions one query sees, itself included
    hidden_act: str

    @classmethod
    def from_json(cls, raw: dict[str, Any], defaults: dict[str, Any], kv_heads_key: str | None) -> LayerStack:
        get = lambda key: raw.get(key) if raw.get(key) is not None else defaults[key]  # noqa: E731
        rope = raw.get("rope_parameters") or {}
        heads = get("num_attention_heads")
        return cls(get("hidden_size"), get("intermediate_size"), get("num_hidden_layers"), heads,
                   get(kv_heads_key) if kv_heads_key else heads,
                   raw.get("head_dim") or defaults["head_dim"], float(get("rms_norm_eps")),
                   float(rope.get("rope_theta") or raw.get("rope_theta") or defaults["rope_theta"]),
                   int(get("sliding_window")), get("hidden_act"))


@dataclass(frozen=True)
class VoxtralSpec:
    """config.json: the encoder, the decoder, and the projector between them."""

    encoder: LayerStack
    decoder: LayerStack
    num_mel_bins: int
    vocab_size: int
    downsample_factor: int  # encoder positions per decoder position (4)
    audio_length_per_tok: int  # mel frames per decoder position (8)
    default_num_delay_tokens: int
    projector_act: str
    tie_word_embeddings: bool

    @classmethod
    def from_json(cls, raw: dict[str, Any], file: Path) -> VoxtralSpec:
        if raw.get("model_type") != MODEL_TYPE:
            raise ModelLoadError(f"{file}: model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
        text, audio = raw.get("text_config") or {}, raw.get("audio_config") or {}
        encoder = LayerStack.from_json(audio, _AUDIO_DEFAULTS, None)  # the encoder is plain multi-head
        decoder = LayerStack.from_json(text, _TEXT_DEFAULTS, "num_key_value_heads")
        spec = cls(encoder, decoder, audio.get("num_mel_bins") or _AUDIO_DEFAULTS["num_mel_bins"],
                   text.get("vocab_size") or _TEXT_DEFAULTS["vocab_size"], raw.get("downsample_factor", 4),
                   raw.get("audio_length_per_tok", 8), raw.get("default_num_delay_tokens", 6),
                   raw.get("projector_hidden_act", "gelu"),
                   bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", True))))
        if spec.audio_length_per_tok != 2 * spec.downsample_factor:  # the second conv has stride 2
            raise ModelLoadError(f"{file}: audio_length_per_tok {spec.audio_length_per_tok} is not twice "
                                 f"downsample_factor {spec.downsample_factor}")
        return spec


@dataclass(frozen=True)
class AudioSpec:
    """preprocessor_config.json and tekken.json's audio section: the front end, the padding, the delay."""

    sampling_rate: int  # 16 kHz
    hop_length: int  # samples per mel frame (160)
    n_fft: int  # the STFT window (400)
    num_mel_bins: int
    global_log_mel_max: float  # a fixed ceiling (a clip's own maximum would not be causal)
    frame_rate: float  # decoder positions per second (12.5)
    num_left_pad_tokens: int  # frames of silence before the audio
    transcription_delay_ms: float  # the default delay; a stream may choose another multiple of a frame

    @property
    def frame_samples(self) -> int:
        return int(self.sampling_rate // self.frame_rate)  # 1280 samples = 80 ms

    @property
    def frame_ms(self) -> float:
        return 1000.0 / self.frame_rate

    def num_delay_tokens(self, delay_ms: float | None = None) -> int:
        """The delay in frames: mistral-common's get_num_delay_tokens for a multiple of a frame."""
        delay_ms = self.transcription_delay_ms if delay_ms is None else delay_ms
        if delay_ms <= 0 or abs(delay_ms / self.frame_ms - round(delay_ms / self.frame_ms)) > 1e-6:
            raise ValueError(f"transcription delay {delay_ms} ms is not a positive multiple of {self.frame_ms} ms")
        return round(delay_ms / self.frame_ms)

    @classmethod
    def from_dir(cls, model_dir: Path, audio: dict[str, Any]) -> AudioSpec:
        """`audio` is tekken.json's audio section; preprocessor_config.json is optional (defaults as shipped)."""
        file = model_dir / "preprocessor_config.json"
        pre = read_json(file) if file.is_file() else {}
        enc = audio.get("audio_encoding_config") or {}
        if audio.get("transcription_format") != "streaming":
            raise ModelLoadError(f"{model_dir / 'tekken.json'}: the audio section is not a streaming model's")
        spec = cls(int(audio.get("sampling_rate", 16000)), int(enc.get("hop_length", 160)),
                   int(enc.get("window_size", 400)), int(enc.get("num_mel_bins", 128)),
                   _ceiling(pre, file), float(audio.get("frame_rate", 12.5)),
                   int(audio.get("streaming_n_left_pad_tokens") or 0), float(audio["transcription_delay_ms"]))
        for key, ours in (("hop_length", spec.hop_length), ("n_fft", spec.n_fft), ("win_length", spec.n_fft),
                          ("feature_size", spec.num_mel_bins), ("sampling_rate", spec.sampling_rate)):
            if key in pre and pre[key] != ours:  # transformers' processor refuses the same disagreements
                raise ModelLoadError(f"{file}: {key} {pre[key]} disagrees with tekken.json's audio section ({ours})")
        return spec


def _ceiling(pre: dict[str, Any], file: Path) -> float:
    ceiling = pre.get("global_log_mel_max", 1.5)
    if ceiling is None:  # the extractor would floor at each clip's own maximum: not a stream's to know
        raise ModelLoadError(f"{file}: global_log_mel_max is null; a causal front end needs a fixed one")
    return float(ceiling)


def read_json(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{file}: cannot read it ({exc})") from None
