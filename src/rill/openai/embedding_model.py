"""How a served model embeds: its pooling and whether it allows Matryoshka truncation, read once
from the model directory as its authors ship it.

- Pooling: sentence-transformers' `1_Pooling/config.json` (the folder modules.json names) says
  `pooling_mode_lasttoken` (Qwen3-Embedding, gte-Qwen2) or `pooling_mode_mean_tokens`; without
  one, a decoder pools its last token, whose state has seen the whole input.
- Matryoshka (`dimensions`): vLLM's config.json fields `is_matryoshka` / `matryoshka_dimensions`,
  or a Qwen3 decoder shipped bare to embed (Qwen3-Embedding: its model card trains every size
  from 32 up with MRL, and its config.json says nothing of it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from weakref import WeakKeyDictionary

log = logging.getLogger("rill.server")


@dataclass(frozen=True)
class EmbeddingModel:
    pooling: str  # "last" or "mean" (rill.engine.pooling)
    hidden_size: int
    matryoshka: bool  # `dimensions` may truncate the vector
    matryoshka_dimensions: tuple[int, ...] | None = None  # the only sizes allowed, when the config lists them


_KNOWN: WeakKeyDictionary = WeakKeyDictionary()  # Serving -> EmbeddingModel


def embedding_model(serving) -> EmbeddingModel:
    """The served model's embedding settings (read from its directory on first use)."""
    known = _KNOWN.get(serving)
    if known is None:
        core = serving.engine.core
        known = _KNOWN[serving] = read_embedding_model(Path(core.model_dir), core.model_config,
                                                       getattr(core.runner.model, "embedding_only", False))
    return known


def read_embedding_model(model_dir: Path, cfg, embedding_only: bool) -> EmbeddingModel:
    raw = _read_json(model_dir / "config.json") or {}
    listed = raw.get("matryoshka_dimensions")
    dims = tuple(sorted(int(d) for d in listed)) if isinstance(listed, list) and listed else None
    matryoshka = bool(raw.get("is_matryoshka")) or dims is not None or (
        embedding_only and cfg.architecture.startswith("Qwen3"))
    return EmbeddingModel(_pooling(model_dir), cfg.hidden_size, matryoshka, dims)


def _pooling(model_dir: Path) -> str:
    config = _read_json(model_dir / _pooling_folder(model_dir) / "config.json")
    if not config:
        return "last"
    if config.get("pooling_mode_lasttoken"):
        return "last"
    if config.get("pooling_mode_mean_tokens"):
        return "mean"
    modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v)
    log.warning("%s: pooling %s is not supported; pooling the last token", model_dir, modes)
    return "last"


def _pooling_folder(model_dir: Path) -> str:
    """The Pooling module's folder as modules.json names it (sentence-transformers), else 1_Pooling."""
    for module in _read_json(model_dir / "modules.json") or []:
        if isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling"):
            return str(module.get("path") or "1_Pooling")
    return "1_Pooling"


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
