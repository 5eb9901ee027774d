"""The default voice: espeak-ng's own formant synthesizer, in-process (rill.tts.libespeak), at 24 kHz.

No download and no model: every build of rill speaks. OpenAI's voice names each map to a distinct
espeak-ng voice (accent + variant + pitch) so that a client written for OpenAI picks a voice that
exists and two names never sound the same; espeak-ng's own names ("en-us", "en-gb+f3") work too.

`speed` (OpenAI's 0.25-4.0) scales espeak-ng's 175 words a minute: up to 4x is espeak-ng's own rate
(its sonic speed-up past 450 wpm); below its 80 wpm floor (speed < 0.46) the words are spoken at 80 and
the gaps between them lengthened until the clip is as long as the speed asks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import soxr

from rill.tts import libespeak
from rill.tts.backend import UnknownVoice, Utterance, VoiceInfo

OUTPUT_RATE_HZ = 24_000  # OpenAI's pcm rate; Kokoro's too
BASE_WPM = 175  # espeak-ng's default rate: speed 1.0

# OpenAI name -> (espeak-ng voice, pitch 0-99). Accents and variants rill-tiny-speech learnt from.
OPENAI_VOICES: dict[str, tuple[str, int]] = {
    "alloy": ("en-us+f2", 50),
    "ash": ("en-us+m3", 40),
    "ballad": ("en-gb+m1", 45),
    "coral": ("en-us+f4", 60),
    "echo": ("en-us+m1", 48),
    "fable": ("en-gb-x-rp+m4", 52),
    "nova": ("en-us+f1", 66),
    "onyx": ("en-us+m7", 30),
    "sage": ("en-gb+f3", 55),
    "shimmer": ("en-us+f5", 72),
    "verse": ("en-gb-scotland+m2", 50),
    "marin": ("en-us+f3", 58),
    "cedar": ("en-us+m5", 42),
}
ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc")
DEFAULT_PITCH = 50


class EspeakBackend:
    """A VoiceBackend (rill.tts.backend) over libespeak-ng; one utterance at a time (max_batch 1)."""

    name = "rill-espeak"
    sample_rate = OUTPUT_RATE_HZ
    max_batch = 1  # a C library with one global voice: nothing to batch

    def __init__(self):
        # espeak-ng names found once: the lookup takes the library's lock, which the worker holds while it
        # speaks, and requests resolve their voice on the trio thread
        self._found: set[str] = set(OPENAI_VOICES)

    def voices(self) -> list[VoiceInfo]:
        named = [VoiceInfo(id=name, name=f"{name} (espeak-ng {voice}, pitch {pitch})", language=_language(voice))
                 for name, (voice, pitch) in OPENAI_VOICES.items()]
        return named + [VoiceInfo(id=accent, name=f"espeak-ng {accent}", language=accent) for accent in ACCENTS]

    def resolve_voice(self, voice: str) -> str:
        """OpenAI's names as given; any other name espeak-ng has ("en-gb", "en-us+m3") as given."""
        if not isinstance(voice, str) or not voice:
            raise UnknownVoice(f"voice must be a non-empty string, got {voice!r}")
        if voice in self._found:
            return voice
        if len(voice) <= 64 and voice.isascii() and all(c.isalnum() or c in "-+_" for c in voice):
            with libespeak.lock:
                try:
                    libespeak.set_voice(voice)
                    self._found.add(voice)
                    return voice
                except ValueError:
                    pass
        names = ", ".join(OPENAI_VOICES)
        raise UnknownVoice(f"unknown voice {voice!r}: use one of {names}, or an espeak-ng voice such as en-gb")

    def synthesize(self, batch: Sequence[Utterance]) -> list[np.ndarray]:
        return [self._one(u) for u in batch]

    def _one(self, utterance: Utterance) -> np.ndarray:
        voice, pitch = OPENAI_VOICES.get(utterance.voice, (utterance.voice, DEFAULT_PITCH))
        wpm = BASE_WPM * utterance.speed
        with libespeak.lock:
            libespeak.set_voice(voice)
            libespeak.set_parameter(libespeak.PITCH, pitch)
            libespeak.set_parameter(libespeak.WORDGAP, 0)
            libespeak.set_parameter(libespeak.RATE, max(libespeak.RATE_MIN, round(wpm)))
            samples = libespeak.synth(utterance.text)
            if wpm < libespeak.RATE_MIN and samples.size:
                samples = self._stretch(utterance.text, samples, libespeak.RATE_MIN / wpm)
            rate = libespeak.sample_rate()
        audio = samples.astype(np.float32) / 32768.0
        return soxr.resample(audio, rate, self.sample_rate).astype(np.float32) if audio.size else audio

    @staticmethod
    def _stretch(text: str, samples: np.ndarray, factor: float) -> np.ndarray:
        """Slower than espeak-ng's floor: longer gaps between words, sized from the clip at 80 wpm."""
        wanted = samples.size * factor
        gap = 10  # espeak-ng's word gap is in units of 10 ms at its default rate; measured, not assumed
        for _ in range(2):  # the clip's length is linear in the gap: one probe, then the gap that fits
            libespeak.set_parameter(libespeak.WORDGAP, gap)
            probe = libespeak.synth(text)
            per_unit = (probe.size - samples.size) / gap
            if per_unit <= 0:
                return probe  # a single word: no gap to lengthen
            gap = max(1, round((wanted - samples.size) / per_unit))
        libespeak.set_parameter(libespeak.WORDGAP, gap)
        return libespeak.synth(text)


def _language(voice: str) -> str:
    return voice.split("+", 1)[0]
