"""A Kokoro directory as its authors ship it: config.json, the weights, voices/*.pt.

Weights come as the authors' .pth (a dict of component -> state dict, keys often prefixed
"module." by the DataParallel they trained under) or as safetensors with flat "component.key"
names. weight_norm's (weight_g, weight_v) pairs are folded into one weight here, once, with
torch's own weight_norm function, so a forward pass costs what a plain convolution costs and equals
the reference's, which recomputes the same weight before every call.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import torch

COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
IGNORED_PREFIXES = ("bert.pooler.", "bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


class KokoroConfig(msgspec.Struct, frozen=True):
    vocab: dict[str, int]
    n_token: int
    hidden_dim: int
    style_dim: int
    n_layer: int
    max_dur: int
    text_encoder_kernel_size: int
    plbert: dict
    istftnet: dict
    dropout: float = 0.2
    n_mels: int = 80


class KokoroDirError(ValueError):
    """The directory is not a Kokoro model rill can load (what is missing or wrong is in the message)."""


def read_config(path: Path) -> KokoroConfig:
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return msgspec.convert(raw, KokoroConfig)
    except (OSError, ValueError, msgspec.ValidationError) as exc:
        raise KokoroDirError(f"{path}/config.json: {exc}") from exc


def weights_file(path: Path) -> Path:
    """The .pth if there is one (what the authors ship), else the one safetensors file."""
    for pattern in ("*.pth", "*.safetensors"):
        found = sorted(path.glob(pattern))
        if found:
            return found[0]
    raise KokoroDirError(f"{path}: no *.pth or *.safetensors weights")


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """Flat "component.key" -> tensor, with DataParallel's "module." prefix dropped."""
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        flat = load_file(str(file))
    else:
        nested = torch.load(file, map_location="cpu", weights_only=True)
        flat = {f"{part}.{key}": value for part, sd in nested.items() for key, value in sd.items()}
    return {strip_module(key): value for key, value in flat.items()}


def strip_module(key: str) -> str:
    part, _, rest = key.partition(".")
    return f"{part}.{rest.removeprefix('module.')}"


def fold_weight_norm(flat: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    folded = {}
    for key, value in flat.items():
        if key.endswith(".weight_v"):
            stem = key.removesuffix("_v")
            folded[stem] = torch._weight_norm(value, flat[stem + "_g"], 0)
        elif not key.endswith(".weight_g"):
            folded[key] = value
    return folded


def load_state(model: torch.nn.Module, file: Path) -> None:
    """Every parameter of `model` from the file, strictly: a missing or unknown key is an error."""
    state = fold_weight_norm(read_weights(file))
    state = {k: v for k, v in state.items() if not k.startswith(IGNORED_PREFIXES)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise KokoroDirError(f"{file}: missing {missing[:5]}, unexpected {unexpected[:5]}")


def read_voices(path: Path) -> dict[str, torch.Tensor]:
    """voices/NAME.pt -> [max_len, 1, 256] style packs (row k styles a phoneme string of length k + 1)."""
    files = sorted((path / "voices").glob("*.pt"))
    if not files:
        raise KokoroDirError(f"{path}/voices: no *.pt voices")
    return {f.stem: torch.load(f, map_location="cpu", weights_only=True).float() for f in files}
