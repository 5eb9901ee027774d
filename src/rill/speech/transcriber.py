"""The offline speech API: `Transcriber(model).transcribe(audio)`, driving SpeechCore in the caller's
thread until the transcription is done (as rill.LLM drives EngineCore).

    from rill import Transcriber
    result = Transcriber("rill-tiny-speech").transcribe("question.wav")
    result.text, result.token_ids, result.segments, result.language
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

import numpy as np

from rill.errors import ModelLoadError, RillError
from rill.speech.async_speech import RILL_TINY_SPEECH, resolve_speech_model
from rill.speech.audio import load_audio
from rill.speech.core import SpeechCore
from rill.speech.decoding import TranscribeParams, Transcription

Audio = str | os.PathLike | bytes | np.ndarray


class Transcriber:
    """Speech to text with a Whisper-family model: "rill-tiny-speech" (shipped) or a local directory."""

    def __init__(self, model: str | os.PathLike = RILL_TINY_SPEECH, **core_kwargs):
        directory = resolve_speech_model(model)
        if not directory.is_dir():
            raise ModelLoadError(f"no speech model at {directory}")
        self.core = SpeechCore(str(directory), **core_kwargs)
        self.model_name = str(model)
        self._ids = itertools.count()

    def transcribe(self, audio: Audio, sample_rate: int | None = None, language: str | None = None,
                   prompt: str | None = None, temperature: float = 0.0) -> Transcription:
        """One recording: a path, an encoded file's bytes, or float / int16 samples (`sample_rate`
        when not 16 kHz). Returns the Transcription (.text, .token_ids, .segments, .language)."""
        return self.transcribe_all([audio], sample_rate, language, prompt, temperature)[0]

    def transcribe_all(self, audios: Sequence[Audio], sample_rate: int | None = None, language: str | None = None,
                       prompt: str | None = None, temperature: float = 0.0) -> list[Transcription]:
        """Several recordings decoded together (the core batches their decoder steps), in order."""
        params = TranscribeParams(language=language, prompt=prompt, temperature=temperature)
        samples = [load_audio(audio, sample_rate) for audio in audios]
        request_ids = [f"offline-speech-{next(self._ids)}" for _ in samples]
        try:
            for request_id, audio in zip(request_ids, samples):
                self.core.add_request(request_id, audio, params)
            return self._drain(request_ids)
        finally:
            for request_id in request_ids:
                self.core.abort(request_id)  # a no-op for finished requests; frees rows on error

    def _drain(self, request_ids: list[str]) -> list[Transcription]:
        results: dict[str, Transcription] = {}
        while len(results) < len(request_ids):
            if not self.core.has_work():
                raise RillError("the speech core has no work left but transcriptions are unfinished")
            for delta in self.core.step():
                if delta.error is not None:
                    raise RillError(delta.error)
                if delta.finished is not None:
                    results[delta.request_id] = delta.finished
        return [results[request_id] for request_id in request_ids]
