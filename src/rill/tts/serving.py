"""`rill serve --tts-model`: the voice the server speaks with, on its speech-out worker."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from rill.errors import ModelLoadError
from rill.tts.worker import SpeechOut, open_speech_out

log = logging.getLogger("rill.tts")


def load_voice(name: str):
    """"espeak" (or "rill-espeak"): espeak-ng's synthesizer; anything else: a local Kokoro directory."""
    from rill.tts.synthesizer import load_backend

    try:
        return load_backend(name)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load the voice {name!r}: {exc}") from exc


@asynccontextmanager
async def open_serving_voice(name: str | None) -> AsyncIterator[SpeechOut | None]:
    """None or "none": no voice (/v1/audio/speech answers 404; realtime answers stay text)."""
    if name is None or str(name).lower() == "none":
        yield None
        return
    backend = await trio.to_thread.run_sync(load_voice, name)
    log.info("voice: %s (%d voices, %d Hz)", backend.name, len(backend.voices()), backend.sample_rate)
    async with open_speech_out(backend) as out:
        yield out
