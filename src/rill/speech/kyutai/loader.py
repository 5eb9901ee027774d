"""Load a Kyutai STT directory as its authors ship it (kyutai/stt-*-trfs): config.json, model.safetensors
(or a sharded index), tokenizer.json with tokenizer_config.json, preprocessor_config.json.

Names map one to one onto transformers' checkpoint: the decoder under `model.` (its attention projections
wrapped in `.linear`), `lm_head.`, and the Mimi codec under `codec_model.`, of which only the encoder
half and the quantizer's input projections and codebooks are read. Mimi always runs in float32 (as
transformers keeps it); the decoder takes `dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rill.errors import ModelLoadError
from rill.models.loader import _Checkpoint
from rill.speech.kyutai.config import KyutaiSpec, PaddingSpec, read_json
from rill.speech.kyutai.decoder import KyutaiDecoder
from rill.speech.kyutai.mimi import MimiEncoder
from rill.tokenizer import Tokenizer

_QUANTIZERS = {"semantic": "semantic_residual_vector_quantizer", "acoustic": "acoustic_residual_vector_quantizer"}
_EPSILON = 1e-5  # transformers' MimiEuclideanCodebook: embed = embed_sum / cluster_usage.clamp(min=1e-5)


@dataclass(frozen=True)
class KyutaiRuntime:
    """A loaded model: shared by every stream (which own only their caches)."""

    path: Path
    name: str
    spec: KyutaiSpec
    padding: PaddingSpec
    mimi: MimiEncoder
    decoder: KyutaiDecoder
    tokenizer: Tokenizer | None
    device: torch.device

    @property
    def sampling_rate(self) -> int:
        return self.spec.codec.sampling_rate

    @property
    def frame_size(self) -> int:
        return self.spec.codec.frame_size

    @property
    def max_model_len(self) -> int:
        """/v1/models' context length: the decoder positions one step attends (a stream has no end)."""
        return self.spec.sliding_window


def is_kyutai_dir(path: str | Path) -> bool:
    """Whether config.json names Kyutai STT (the model-kind dispatch reads only this)."""
    file = Path(path) / "config.json"
    try:
        return read_json(file).get("model_type") == "kyutai_speech_to_text"
    except ModelLoadError:
        return False


def load_kyutai(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                *, require_tokenizer: bool = True) -> KyutaiRuntime:
    model_dir = Path(path).expanduser()
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {str(path)!r} does not exist (rill loads local directories only)")
    spec = KyutaiSpec.from_json(read_json(model_dir / "config.json"), model_dir / "config.json")
    device = torch.device(device)
    with torch.device("meta"):
        mimi, decoder = MimiEncoder(spec.codec), KyutaiDecoder(spec)
    mimi = mimi.to_empty(device=device).float()
    decoder = decoder.to_empty(device=device).to(dtype)
    ckpt = _Checkpoint(model_dir)
    _load_decoder(decoder, ckpt)
    _load_mimi(mimi, ckpt)
    _rebuild_buffers(mimi, decoder, spec)
    tokenizer = _tokenizer(model_dir, require_tokenizer)
    return KyutaiRuntime(model_dir, model_dir.name, spec, PaddingSpec.from_dir(model_dir), mimi.eval(),
                         decoder.eval(), tokenizer, device)


def _tokenizer(model_dir: Path, required: bool) -> Tokenizer | None:
    if (model_dir / "tokenizer.json").is_file():
        return Tokenizer.from_dir(model_dir)
    if required:
        raise ModelLoadError(f"{model_dir}: tokenizer.json not found (expected a Kyutai STT directory)")
    return None


def _decoder_name(name: str) -> str:
    if name.startswith("lm_head."):
        return name
    name = name.replace("embed_tokens.weight", "embed_tokens.embed_tokens.weight")
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        name = name.replace(f"self_attn.{proj}.weight", f"self_attn.{proj}.linear.weight")
    return f"model.{name}"


def _load_decoder(decoder: KyutaiDecoder, ckpt: _Checkpoint) -> None:
    for name, param in decoder.named_parameters():
        _copy(param, ckpt, _decoder_name(name))


def _mimi_name(name: str, ckpt: _Checkpoint) -> str:
    flat = f"codec_model.{name}"
    if flat in ckpt:
        return flat
    # transformers' newer module layout nests the encoder half under codec_model.encoder.
    nested = name.replace("encoder.", "encoder_seanet.", 1) if name.startswith("encoder.") else name
    return f"codec_model.encoder.{nested}"


def _load_mimi(mimi: MimiEncoder, ckpt: _Checkpoint) -> None:
    for name, param in mimi.named_parameters():
        if name.startswith(tuple(_QUANTIZERS)):
            kind, rest = name.split(".", 1)
            _copy(param, ckpt, f"codec_model.quantizer.{_QUANTIZERS[kind]}.{rest}")
        else:
            _copy(param, ckpt, _mimi_name(name, ckpt))
    for kind, books in (("semantic", mimi.semantic), ("acoustic", mimi.acoustic)):
        prefix = f"codec_model.quantizer.{_QUANTIZERS[kind]}.layers"
        for i in range(books.embed.shape[0]):
            total = ckpt.get(f"{prefix}.{i}.codebook.embed_sum").float()
            usage = ckpt.get(f"{prefix}.{i}.codebook.cluster_usage").float()
            books.embed[i] = (total / usage.clamp(min=_EPSILON)[:, None]).to(books.embed.device)


def _copy(param: torch.nn.Parameter, ckpt: _Checkpoint, name: str) -> None:
    tensor = ckpt.get(name)
    if tuple(tensor.shape) != tuple(param.shape):
        raise ModelLoadError(f"shape mismatch for {name!r}: checkpoint has {tuple(tensor.shape)}, "
                             f"config.json implies {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))


def _rebuild_buffers(mimi: MimiEncoder, decoder: KyutaiDecoder, spec: KyutaiSpec) -> None:
    """Buffers computed rather than loaded: to_empty() left them uninitialised."""
    for module, head_dim, theta in ((mimi.rotary, spec.codec.head_dim, spec.codec.rope_theta),
                                    (decoder.rotary, spec.head_dim, spec.rope_theta)):
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float, device=module.inv_freq.device) / head_dim
        module.inv_freq.copy_(1.0 / (theta**exponent))
    offsets = spec.vocab_size + torch.arange(spec.num_codebooks) * spec.codebook_vocab_size
    decoder.offsets.copy_(torch.nn.functional.pad(offsets, (1, 0)))
