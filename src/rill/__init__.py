"""rill: a streaming-input LLM inference server on trio.

Names are imported lazily so that light users (the training recipe on a GPU box, the
kernels) do not pull in the server's dependencies.
"""

from __future__ import annotations

import importlib

__version__ = "0.3.0"

_EXPORTS = {
    "LLM": "rill.offline",
    "SamplingParams": "rill.sampling_params",
    "open_engine": "rill.engine.async_engine",
    "EngineConfig": "rill.config",
    "Transcriber": "rill.speech.transcriber",
    "Synthesizer": "rill.tts.synthesizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rill' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
