"""Load a Voxtral Realtime directory as transformers reads it (mistralai/Voxtral-Mini-4B-Realtime-2602):
config.json, model.safetensors (or a sharded index), tekken.json (with its audio section) and
preprocessor_config.json.

Tensor names map one to one onto transformers' checkpoint, in either layout: transformers' modules
(`model.audio_tower.`, `model.multi_modal_projector.`, `model.language_model.`, `lm_head.`) or what
save_pretrained writes (`audio_tower.`, `multi_modal_projector.`, `language_model.model.`,
`language_model.lm_head.`); the head is absent when tied to the embeddings. Mistral's own
consolidated.safetensors with params.json is not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rill.errors import ModelLoadError
from rill.models.loader import _Checkpoint
from rill.speech.voxtral_realtime.config import MODEL_TYPE, AudioSpec, VoxtralSpec, read_json
from rill.speech.voxtral_realtime.decoder import TextDecoder
from rill.speech.voxtral_realtime.encoder import AudioTower, Projector
from rill.speech.voxtral_realtime.features import MelFrontEnd
from rill.speech.voxtral_realtime.tekken import Tekken


class VoxtralModel(nn.Module):
    def __init__(self, spec: VoxtralSpec):
        super().__init__()
        self.audio_tower = AudioTower(spec)
        self.multi_modal_projector = Projector(spec)
        self.language_model = TextDecoder(spec)
        self.lm_head = nn.Linear(spec.decoder.hidden_size, spec.vocab_size, bias=False)


@dataclass(frozen=True)
class VoxtralRuntime:
    """A loaded model, shared by every stream (each stream owns only its caches)."""

    path: Path
    name: str
    spec: VoxtralSpec
    audio: AudioSpec
    model: VoxtralModel
    front: MelFrontEnd
    tokenizer: Tekken
    device: torch.device

    @property
    def sampling_rate(self) -> int:
        return self.audio.sampling_rate

    @property
    def max_model_len(self) -> int:
        """/v1/models' context length: the decoder positions one step attends (a stream has no end)."""
        return self.spec.decoder.sliding_window


def is_voxtral_realtime_dir(path: str | Path) -> bool:
    """Whether config.json names Voxtral Realtime (the model-kind dispatch reads only this)."""
    try:
        return read_json(Path(path) / "config.json").get("model_type") == MODEL_TYPE
    except ModelLoadError:
        return False


def load_voxtral_realtime(path: str | Path, device: str | torch.device = "cpu",
                          dtype: torch.dtype = torch.float32) -> VoxtralRuntime:
    model_dir = Path(path).expanduser()
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {str(path)!r} does not exist (rill loads local directories only)")
    spec = VoxtralSpec.from_json(read_json(model_dir / "config.json"), model_dir / "config.json")
    if not (model_dir / "tekken.json").is_file():
        raise ModelLoadError(f"{model_dir}: tekken.json not found (expected a Voxtral Realtime directory)")
    tokenizer = Tekken.from_file(model_dir / "tekken.json")
    if tokenizer.vocab_size != spec.vocab_size:
        raise ModelLoadError(f"{model_dir}: tekken.json has {tokenizer.vocab_size} ids, config.json {spec.vocab_size}")
    audio = AudioSpec.from_dir(model_dir, tokenizer.audio)
    if audio.num_mel_bins != spec.num_mel_bins:
        raise ModelLoadError(f"{model_dir}: {audio.num_mel_bins} mel bins in tekken.json, "
                             f"{spec.num_mel_bins} in config.json")
    device = torch.device(device)
    with torch.device("meta"):
        model = VoxtralModel(spec)
    model = model.to_empty(device=device).to(dtype)
    _load_weights(model, _Checkpoint(model_dir), spec.tie_word_embeddings)
    _rebuild_buffers(model, spec)
    return VoxtralRuntime(model_dir, model_dir.name, spec, audio, model.eval(), MelFrontEnd(audio, device),
                          tokenizer, device)


def _candidates(name: str) -> list[str]:
    """Checkpoint names for one of our parameters: the module layout first, then the one save_pretrained
    writes (transformers maps it like Qwen2-Audio's: the decoder under `language_model.model.`)."""
    if name == "lm_head.weight":
        return ["lm_head.weight", "language_model.lm_head.weight"]
    if name.startswith("language_model."):
        return [f"model.{name}", name.replace("language_model.", "language_model.model.", 1)]
    return [f"model.{name}", name]


def _load_weights(model: VoxtralModel, ckpt: _Checkpoint, tied: bool) -> None:
    for name, param in model.named_parameters():
        found = [c for c in _candidates(name) if c in ckpt]
        if not found and name == "lm_head.weight" and tied:
            found = [c for c in _candidates("language_model.embed_tokens.weight") if c in ckpt]
        if not found:
            raise ModelLoadError(f"tensor {_candidates(name)[0]!r} not found in the checkpoint")
        tensor = ckpt.get(found[0])
        if tuple(tensor.shape) != tuple(param.shape):
            raise ModelLoadError(f"shape mismatch for {found[0]!r}: checkpoint has {tuple(tensor.shape)}, "
                                 f"config.json implies {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))


def _rebuild_buffers(model: VoxtralModel, spec: VoxtralSpec) -> None:
    """The rotary frequencies are computed, not loaded: to_empty() left them uninitialised."""
    for rotary, stack in ((model.audio_tower.rotary, spec.encoder), (model.language_model.rotary, spec.decoder)):
        exponent = torch.arange(0, stack.head_dim, 2, dtype=torch.float, device=rotary.inv_freq.device)
        rotary.inv_freq.copy_(1.0 / (stack.rope_theta ** (exponent / stack.head_dim)))
