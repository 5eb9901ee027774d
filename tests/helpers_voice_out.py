"""A real server that speaks: running_server with the default voice (espeak-ng) on the speech-out worker."""

from __future__ import annotations

import importlib.util
from contextlib import asynccontextmanager

import pytest

from helpers_server import running_server


def voice_available() -> bool:
    """espeak-ng's library ships in the espeakng-loader wheel (Linux x86-64)."""
    return all(importlib.util.find_spec(name) is not None for name in ("espeakng_loader", "rill.tts.espeak"))


needs_voice = pytest.mark.skipif(not voice_available(), reason="espeakng-loader (libespeak-ng) is not installed")


@asynccontextmanager
async def running_voice_server(model_dir, server=None, backend=None, **engine_kwargs):
    """`backend`: another voice than espeak-ng's (a fault-injecting one)."""
    from rill.tts.espeak import EspeakBackend
    from rill.tts.worker import open_speech_out

    voice = backend if backend is not None else EspeakBackend()
    async with open_speech_out(voice) as out, running_server(model_dir, server, **engine_kwargs) as running:
        running.app.extensions["rill"].speech_out = out
        yield running
