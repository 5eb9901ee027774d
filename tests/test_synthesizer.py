"""rill.Synthesizer with the default voice (espeak-ng): the whole clip, and audio a clause at a time as the
text arrives, each chunk before the text source is exhausted."""

from __future__ import annotations

import numpy as np
import pytest

from helpers_voice_out import needs_voice
from rill.tts.backend import UnknownVoice

pytestmark = needs_voice

TEXT = "The first clause is here, and the second one follows it. Then comes the end."


@pytest.fixture(scope="module")
def voice():
    from rill import Synthesizer

    return Synthesizer("espeak", voice="alloy")


def test_speak_returns_the_whole_clip_as_float32_at_24_khz(voice):
    clip = voice.speak(TEXT)
    assert voice.sample_rate == 24000 and clip.dtype == np.float32 and clip.ndim == 1
    assert 2.0 < len(clip) / 24000 < 15.0 and 0.01 < np.abs(clip).max() <= 1.0
    assert len(voice.speak("")) == 0 and len(voice.speak(" ... ")) == 0


def test_stream_yields_each_clause_before_the_text_ends(voice):
    read = []

    def pieces():
        for word in TEXT.split(" "):
            read.append(word)
            yield word + " "

    chunks = []
    for chunk in voice.stream(pieces()):
        chunks.append((len(read), chunk))
    assert len(chunks) == 3
    num_words = len(TEXT.split(" "))
    assert chunks[0][0] < num_words  # the first clause spoke while words were still to come
    assert all(c.dtype == np.float32 and len(c) > 2400 for _, c in chunks)
    whole = voice.speak(TEXT)
    assert abs(sum(len(c) for _, c in chunks) - len(whole)) < 0.05 * len(whole)  # same clauses, same audio


def test_speed_voice_and_bad_values(voice):
    slow, fast = voice.speak(TEXT, speed=0.5), voice.speak(TEXT, speed=2.0)
    assert len(fast) < len(slow)
    assert not np.array_equal(voice.speak("Hello.", voice="echo"), voice.speak("Hello."))
    with pytest.raises(ValueError):
        voice.speak(TEXT, speed=4.5)
    with pytest.raises(ValueError):
        voice.speak(TEXT, speed=0.2)
    with pytest.raises(UnknownVoice):
        voice.speak(TEXT, voice="nobody")
    with pytest.raises(TypeError):
        list(voice.stream([b"bytes"]))
