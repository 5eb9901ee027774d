"""The contract between the speech-out worker and a voice.

A backend turns short texts (clauses or sentences, already split by rill.tts.clauses) into float32
mono frames at its `sample_rate`. The worker gathers the next clause of every active request and
hands them over in one `synthesize` call, so a backend that can batch (Kokoro: one forward pass for
several clauses, padded) does, and one that cannot (espeak-ng: a C library with global state)
loops. Calls come from the worker thread only, one at a time: a backend need not be thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec
import numpy as np

from rill.errors import RillError


class UnknownVoice(RillError):
    """A `voice` the backend does not have; the HTTP layer answers 400 invalid_request_error."""


class VoiceInfo(msgspec.Struct, frozen=True):
    id: str  # what a request's `voice` names (OpenAI's names first, then the backend's own)
    name: str  # what a person reads in a list (e.g. "alloy (espeak-ng en-us, variant m3)")
    language: str  # BCP-47-ish, e.g. "en-us"


class Utterance(msgspec.Struct, frozen=True):
    text: str  # one clause or sentence; never empty
    voice: str  # a VoiceInfo.id this backend accepted through resolve_voice
    speed: float = 1.0  # 0.25-4.0, as OpenAI's `speed`


class VoiceBackend(Protocol):
    name: str  # the served model name ("rill-espeak", or the directory / --tts-model name)
    sample_rate: int  # Hz of every frame synthesize returns (24000 for espeak-ng and Kokoro)
    max_batch: int  # how many utterances one synthesize call takes at most (1 = no batching)

    def voices(self) -> list[VoiceInfo]: ...

    def resolve_voice(self, voice: str) -> str:
        """The VoiceInfo.id for a request's voice name; UnknownVoice if this backend has none."""
        ...

    def synthesize(self, batch: Sequence[Utterance]) -> list[np.ndarray]:
        """One float32 mono array in [-1, 1] per utterance, in order."""
        ...
