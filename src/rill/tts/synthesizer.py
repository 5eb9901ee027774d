"""The offline speech-out API: `Synthesizer(model).speak(text)` and `.stream(text_pieces)`, driving a voice
in the caller's thread (as rill.LLM drives EngineCore and rill.Transcriber drives SpeechCore).

    from rill import Synthesizer
    voice = Synthesizer("espeak", voice="alloy")
    clip = voice.speak("Hello there. How are you?")            # float32 mono at voice.sample_rate (24 kHz)
    for chunk in voice.stream(llm_text_deltas):                  # audio as each clause completes
        player.write(chunk)

`stream` cuts the text with rill.tts.clauses as it arrives, so the first chunk comes as soon as the first
clause is certain, not when the text ends. Nothing here runs trio or a thread: the voice synthesizes when
the caller asks for the next chunk, so a slow text source and the voice take turns in one thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from rill.tts.backend import Utterance, VoiceBackend, VoiceInfo
from rill.tts.clauses import ClauseSplitter, split_text

MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's `speed` range


class Synthesizer:
    """Text to speech with espeak-ng's voice ("espeak", no download) or a local Kokoro directory."""

    def __init__(self, model: str | os.PathLike = "espeak", voice: str | None = None, speed: float = 1.0, *,
                 backend: VoiceBackend | None = None):
        self.backend = backend if backend is not None else load_backend(model)
        self.model_name = self.backend.name
        self.voice = self.backend.resolve_voice(voice if voice is not None else default_voice(self.backend))
        self.speed = check_speed(speed)

    @property
    def sample_rate(self) -> int:
        """Hz of every array speak and stream return."""
        return self.backend.sample_rate

    def voices(self) -> list[VoiceInfo]:
        return self.backend.voices()

    def speak(self, text: str, *, voice: str | None = None, speed: float | None = None) -> np.ndarray:
        """The whole clip for `text`: float32 mono in [-1, 1] at sample_rate (empty for a text with no words).
        Clauses go to the voice in batches of its max_batch (Kokoro pads them into one forward pass)."""
        utterances = self._utterances(split_text(text), voice, speed)
        step = max(1, self.backend.max_batch)
        pieces = [audio for i in range(0, len(utterances), step)
                  for audio in self.backend.synthesize(utterances[i:i + step])]
        return _join(pieces)

    def stream(self, text_pieces: Iterable[str], *, voice: str | None = None,
               speed: float | None = None) -> Iterator[np.ndarray]:
        """Audio chunks (float32 mono at sample_rate), one per clause, each as soon as its clause is complete
        in the text read so far. `text_pieces` may be any iterable of strings: an LLM's deltas, lines typed,
        a caption feed (a plain string works too, read a character at a time)."""
        resolved = self.backend.resolve_voice(voice) if voice is not None else self.voice
        rate = self.speed if speed is None else check_speed(speed)
        splitter = ClauseSplitter()
        for piece in text_pieces:
            if not isinstance(piece, str):
                raise TypeError(f"text pieces must be str, got {type(piece).__name__}")
            yield from self._say(splitter.feed(piece), resolved, rate)
        yield from self._say(splitter.finish(), resolved, rate)

    def _say(self, clauses: list[str], voice: str, speed: float) -> Iterator[np.ndarray]:
        for clause in clauses:
            (audio,) = self.backend.synthesize([Utterance(clause, voice, speed)])
            yield np.asarray(audio, dtype=np.float32)

    def _utterances(self, clauses: Sequence[str], voice: str | None, speed: float | None) -> list[Utterance]:
        resolved = self.backend.resolve_voice(voice) if voice is not None else self.voice
        rate = self.speed if speed is None else check_speed(speed)
        return [Utterance(clause, resolved, rate) for clause in clauses]


def check_speed(speed: float) -> float:
    if not MIN_SPEED <= float(speed) <= MAX_SPEED:
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
    return float(speed)


def default_voice(backend: VoiceBackend) -> str:
    """OpenAI's default name where the voice has it, else the backend's first voice."""
    ids = [v.id for v in backend.voices()]
    return "alloy" if "alloy" in ids else ids[0]


def load_backend(model: str | os.PathLike) -> VoiceBackend:
    """"espeak" (or "rill-espeak"): espeak-ng's synthesizer; a directory: a Kokoro-architecture voice."""
    if str(model) in ("espeak", "rill-espeak"):
        from rill.tts.espeak import EspeakBackend  # libespeak-ng loads on first use

        return EspeakBackend()
    from rill.tts.kokoro import load_kokoro_backend  # torch and the model: only for a neural voice

    return load_kokoro_backend(model)


def _join(pieces: list[np.ndarray]) -> np.ndarray:
    if not pieces:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in pieces])
