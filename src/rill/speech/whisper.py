"""Whisper (WhisperForConditionalGeneration) in rill's own torch: the model, its caches and its loader.

The encoder turns one window of log-mel frames into `max_source_positions` states; each decoder layer's
cross-attention K/V over them is computed once per window and kept per row (`KVCache.cross_*`), so a
decoder step costs the same however long the audio. Self-attention K/V lives in fixed per-row buffers of
`max_target_positions`, written at each row's own position: rows of different lengths decode in one call,
a causal mask per row hiding what lies past its position. Parameter names are transformers' (less the
`model.` prefix), so the checkpoint loads by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rill.errors import ModelLoadError
from rill.models.loader import _Checkpoint
from rill.tokenizer import Tokenizer

ARCHITECTURE = "WhisperForConditionalGeneration"
RILL_TINY_SPEECH = "rill-tiny-speech"
RILL_TINY_CAUSAL = "rill-tiny-causal"  # shipped too: a Voxtral Realtime directory (rill.tiny_causal's recipe)
SHIPPED_SPEECH_MODELS = (RILL_TINY_SPEECH, RILL_TINY_CAUSAL)
SMALL_QUERY = 16  # attention with at most this many queries (decoder steps, prompts) skips the flash kernel
_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


@dataclass(frozen=True)
class WhisperConfig:
    """The parts of config.json the model needs."""

    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_heads: int
    encoder_ffn_dim: int
    decoder_layers: int
    decoder_heads: int
    decoder_ffn_dim: int
    max_source_positions: int  # encoder states per window; the window is 2x this many mel frames
    max_target_positions: int  # decoder tokens per window, prompt included
    activation: str

    @property
    def num_frames(self) -> int:
        return 2 * self.max_source_positions  # conv2 has stride 2

    @classmethod
    def from_json(cls, cfg: dict, file: Path) -> WhisperConfig:
        arch = (cfg.get("architectures") or [ARCHITECTURE])[0]
        if arch != ARCHITECTURE:
            raise ModelLoadError(f"{file}: architecture {arch!r} is not a Whisper model (expected {ARCHITECTURE})")
        names = ("vocab_size", "num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads",
                 "encoder_ffn_dim", "decoder_layers", "decoder_attention_heads", "decoder_ffn_dim",
                 "max_source_positions", "max_target_positions")
        values = [_int_field(cfg, name, file) for name in names]
        activation = cfg.get("activation_function", "gelu")
        if activation not in _ACTIVATIONS:
            raise ModelLoadError(f"{file}: activation_function {activation!r} is not supported")
        return cls(*values, activation=activation)


def _int_field(cfg: dict, name: str, file: Path) -> int:
    value = cfg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelLoadError(f"{file}: field '{name}' must be a positive integer (found {value!r})")
    return value


class Attention(nn.Module):
    """Whisper's attention: k_proj has no bias; q is scaled before the product, as transformers does."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.qkv: tuple[torch.Tensor, torch.Tensor] | None = None  # fused by fuse_qkv() after loading

    def fuse_qkv(self) -> None:
        """q, k and v in one GEMM (a zero bias for k): one call over a 3x wider weight instead of three."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        bias = torch.cat([self.q_proj.bias, torch.zeros_like(self.v_proj.bias), self.v_proj.bias])
        self.qkv = (weight.detach(), bias.detach())

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # [B, T, D] -> [B, H, T, Dh]

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(self.k_proj(x)), self.heads(self.v_proj(x))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention's scaled q, k and v, each [B, H, T, Dh]."""
        if self.qkv is None:
            return self.heads(self.q_proj(x) * self.scale), *self.project_kv(x)
        q, k, v = F.linear(x, *self.qkv).chunk(3, dim=-1)
        return self.heads(q * self.scale), self.heads(k), self.heads(v)

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
        """Cross-attention of x's queries over precomputed k/v."""
        return self.output(self.heads(self.q_proj(x) * self.scale), k, v, mask)

    def output(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
        """q [B, H, T, Dh] (scaled) over k/v [B, H, L, Dh]; mask [B, 1, T, L], True where a query may look."""
        if q.shape[-2] > SMALL_QUERY:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)  # [B, H, T, Dh]
        else:  # a decoder step: two small matmuls beat the flash kernel's setup
            scores = q @ k.transpose(-1, -2)  # [B, H, T, L]
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out = scores.softmax(dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).flatten(2))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: WhisperConfig):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.self_attn = Attention(cfg.d_model, cfg.encoder_heads)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.act = _ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn.output(*self.self_attn.project_qkv(self.self_attn_layer_norm(x)))
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class Encoder(nn.Module):
    def __init__(self, cfg: WhisperConfig):
        super().__init__()
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, cfg.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(cfg.d_model, cfg.d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, cfg.d_model)  # sinusoids or learned
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # features [B, mel, 2S] -> states [B, S, D]
        x = F.gelu(self.conv2(F.gelu(self.conv1(features)))).transpose(1, 2)
        x = x + self.embed_positions.weight
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


@dataclass
class KVCache:
    """Per decoder layer and row: self-attention K/V [rows, H, max_target_positions, Dh] written at each
    row's positions, and the cross-attention K/V [rows, H, max_source_positions, Dh] of the row's window."""

    self_k: list[torch.Tensor]
    self_v: list[torch.Tensor]
    cross_k: list[torch.Tensor]
    cross_v: list[torch.Tensor]

    @classmethod
    def empty(cls, cfg: WhisperConfig, rows: int, dtype: torch.dtype, device) -> KVCache:
        head_dim = cfg.d_model // cfg.decoder_heads

        def buffers(length: int) -> list[torch.Tensor]:
            shape = (rows, cfg.decoder_heads, length, head_dim)
            return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.decoder_layers)]

        return cls(buffers(cfg.max_target_positions), buffers(cfg.max_target_positions),
                   buffers(cfg.max_source_positions), buffers(cfg.max_source_positions))

    def rows(self, index: slice) -> KVCache:
        """A view of some rows (writes go through to this cache)."""
        return KVCache(*([t[index] for t in ts] for ts in (self.self_k, self.self_v, self.cross_k, self.cross_v)))

    def move_row(self, src: int, dst: int) -> None:
        """Copy row src into row dst (keeps the live rows contiguous when a row leaves)."""
        for ts in (self.self_k, self.self_v, self.cross_k, self.cross_v):
            for t in ts:
                t[dst].copy_(t[src])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: WhisperConfig):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.self_attn = Attention(cfg.d_model, cfg.decoder_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.encoder_attn = Attention(cfg.d_model, cfg.decoder_heads)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.decoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_dim, cfg.d_model)
        self.act = _ACTIVATIONS[cfg.activation]

    def forward(self, x, k_cache, v_cache, cross_k, cross_v, rows, positions, mask):
        # x [B, T, D]; k_cache/v_cache [B, H, L, Dh]; rows/positions [B, T] index where the new K/V go
        q, k, v = self.self_attn.project_qkv(self.self_attn_layer_norm(x))
        k_cache[rows, :, positions] = k.transpose(1, 2)  # advanced indices first: [B, T, H, Dh]
        v_cache[rows, :, positions] = v.transpose(1, 2)
        length = mask.shape[-1]
        x = x + self.self_attn.output(q, k_cache[:, :, :length], v_cache[:, :, :length], mask)
        x = x + self.encoder_attn.attend(self.encoder_attn_layer_norm(x), cross_k, cross_v)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class Decoder(nn.Module):
    def __init__(self, cfg: WhisperConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_positions = nn.Embedding(cfg.max_target_positions, cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, ids: torch.Tensor, start: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """ids [B, T] at positions start[b] + t of each row -> logits [B, T, V] (float32).

        Queries see keys up to their own position (a causal mask per row), so rows of any lengths and
        right-padded prompts share the call; a padded query's output is garbage nobody reads, and the K/V
        it writes past a row's length are overwritten before any query can see them.
        """
        num_rows, num_new = ids.shape
        positions = start[:, None] + torch.arange(num_new, device=ids.device)  # [B, T]
        positions = positions.clamp(max=self.embed_positions.num_embeddings - 1)
        length = int(positions.max()) + 1
        mask = torch.arange(length, device=ids.device) <= positions[:, :, None]  # [B, T, L]
        mask = mask[:, None]  # [B, 1, T, L]
        rows = torch.arange(num_rows, device=ids.device)[:, None].expand(-1, num_new)
        x = self.embed_tokens(ids) + self.embed_positions(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, cache.self_k[i], cache.self_v[i], cache.cross_k[i], cache.cross_v[i], rows, positions, mask)
        return F.linear(self.layer_norm(x), self.embed_tokens.weight).float()  # the output projection is tied


class WhisperModel(nn.Module):
    def __init__(self, cfg: WhisperConfig):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def encode_into(self, features: torch.Tensor, cache: KVCache) -> None:
        """Encode windows [B, mel, frames] and write each decoder layer's cross K/V into the cache's rows."""
        states = self.encoder(features.to(self.decoder.embed_tokens.weight.dtype))
        for i, layer in enumerate(self.decoder.layers):
            k, v = layer.encoder_attn.project_kv(states)
            cache.cross_k[i].copy_(k)
            cache.cross_v[i].copy_(v)


@dataclass(frozen=True)
class WhisperGenerationConfig:
    """generation_config.json's special tokens and suppress lists (what Whisper's `generate` reads)."""

    decoder_start_token_id: int  # <|startoftranscript|>
    eos_token_id: int  # <|endoftext|>
    no_timestamps_token_id: int | None
    prev_sot_token_id: int | None  # <|startofprev|>
    is_multilingual: bool
    lang_to_id: dict[str, int]  # "<|en|>" -> id (empty for English-only models)
    task_to_id: dict[str, int]
    suppress_tokens: tuple[int, ...]
    begin_suppress_tokens: tuple[int, ...]

    @classmethod
    def from_json(cls, gen: dict, tokenizer: Tokenizer, file: Path) -> WhisperGenerationConfig:
        vocab = tokenizer.get_vocab()

        def token(name: str, text: str) -> int | None:
            value = gen.get(name)
            return int(value) if isinstance(value, int) else vocab.get(text)

        start, eos = token("decoder_start_token_id", "<|startoftranscript|>"), token("eos_token_id", "<|endoftext|>")
        if start is None or eos is None:
            raise ModelLoadError(f"{file}: decoder_start_token_id and eos_token_id are required")
        lang_to_id = {str(k): int(v) for k, v in (gen.get("lang_to_id") or {}).items()}
        multilingual = bool(gen.get("is_multilingual", bool(lang_to_id)))
        return cls(start, eos, token("no_timestamps_token_id", "<|notimestamps|>"),
                   token("prev_sot_token_id", "<|startofprev|>"), multilingual and bool(lang_to_id), lang_to_id,
                   {str(k): int(v) for k, v in (gen.get("task_to_id") or {}).items()},
                   tuple(gen.get("suppress_tokens") or ()), tuple(gen.get("begin_suppress_tokens") or ()))


@dataclass(frozen=True)
class WhisperRuntime:
    """Everything loaded from one Whisper directory."""

    path: Path
    name: str
    model: WhisperModel
    config: WhisperConfig
    generation: WhisperGenerationConfig
    tokenizer: Tokenizer
    dtype: torch.dtype
    device: torch.device
    special_ids: frozenset[int]  # ids the tokenizer marks special (<|en|>, <|notimestamps|>, ...)

    @property
    def max_model_len(self) -> int:
        """/v1/models' context length: decoder tokens per window."""
        return self.config.max_target_positions

    def new_cache(self, rows: int) -> KVCache:
        return KVCache.empty(self.config, rows, self.dtype, self.device)


def speech_model_path(model: str | Path) -> Path:
    """`rill-tiny-speech` and `rill-tiny-causal` name the embedded models; anything else is a local directory
    (not checked)."""
    if str(model) in SHIPPED_SPEECH_MODELS:
        import rill.assets

        return Path(rill.assets.__file__).parent / str(model)
    return Path(model).expanduser()


def resolve_speech_dir(model: str | Path) -> Path:
    """speech_model_path, which must be a directory."""
    path = speech_model_path(model)
    if not path.is_dir():
        raise ModelLoadError(f"model directory {str(model)!r} does not exist (rill loads local directories only)")
    return path


def _read_json(file: Path) -> dict:
    if not file.is_file():
        raise ModelLoadError(f"{file.parent}: {file.name} not found (expected a Whisper model directory)")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file}: not valid JSON ({e})") from None


def _load_weights(model: WhisperModel, path: Path) -> None:
    ckpt = _Checkpoint(path)
    for name, param in model.named_parameters():
        tensor = ckpt.get(f"model.{name}")
        if tuple(tensor.shape) != tuple(param.shape):
            raise ModelLoadError(f"shape mismatch for 'model.{name}': checkpoint has {tuple(tensor.shape)}, "
                                 f"config.json implies {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))


def load_whisper(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
                 ) -> WhisperRuntime:
    """Load a WhisperForConditionalGeneration directory (float32 unless dtype says otherwise)."""
    model_dir = resolve_speech_dir(path)
    cfg = WhisperConfig.from_json(_read_json(model_dir / "config.json"), model_dir / "config.json")
    tokenizer = Tokenizer.from_dir(model_dir)
    gen_file = model_dir / "generation_config.json"
    generation = WhisperGenerationConfig.from_json(_read_json(gen_file), tokenizer, gen_file)
    dtype = dtype or torch.float32
    device = torch.device(device)
    with torch.device("meta"):
        model = WhisperModel(cfg)
    model = model.to_empty(device=device).to(dtype)
    _load_weights(model, model_dir)
    for layer in (*model.encoder.layers, *model.decoder.layers):
        layer.self_attn.fuse_qkv()
    name = RILL_TINY_SPEECH if str(path) == RILL_TINY_SPEECH else model_dir.name
    special = frozenset(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    return WhisperRuntime(model_dir, name, model.eval(), cfg, generation, tokenizer, dtype, device, special)
