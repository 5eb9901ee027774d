"""rill-tiny-speech's prefix clips: questions cut after a word, transcribed as the words said so far."""

import numpy as np
import pytest

from rill.tiny_speech import prefixes, synth, transcripts

needs_espeak = pytest.mark.skipif(not synth.espeak_available(), reason="needs espeak-ng (Debian package)")


@pytest.mark.parametrize("text, points", [
    ("What is 347 + 58?", ["What", "What is", "What is 347"]),
    ('Reverse the word "stream".', ["Reverse", "Reverse the", "Reverse the word"]),
    ("Uppercase: hello world", ["Uppercase", "Uppercase: hello"]),
    ("347+58", []),
    ("Subtract 5 from 12.", ["Subtract", "Subtract 5", "Subtract 5 from"]),
])
def test_a_cut_falls_after_a_word_never_after_a_bare_symbol(text, points):
    assert [prefixes.text_prefix(text, k) for k in prefixes.cut_points(text)] == points


@needs_espeak
def test_prefix_shard_is_deterministic_and_holds_the_start_of_a_training_question():
    first = prefixes.make_prefix_shard(0, prefixes.SPLIT, 3, 70_000, size=4)
    again = prefixes.make_prefix_shard(0, prefixes.SPLIT, 3, 70_000, size=4)
    assert first.texts == again.texts and np.array_equal(first.pcm, again.pcm)
    for i, text in enumerate(first.texts):
        words = text.split()
        assert 1 <= len(words) and words[-1] not in ("+", "-", "=")
        assert not transcripts.is_held_out(transcripts.Utterance(first.families[i], text, ("word", *words)))
        assert 0 < len(first.audio(i)) <= 70_000


@needs_espeak
def test_a_prefix_clip_is_shorter_than_its_whole_question_said_alike():
    voice = synth_voice()
    whole = synth.synthesize(transcripts.spoken_form("What is 347 + 58?"), voice)
    head = synth.synthesize(transcripts.spoken_form("What is 347"), voice)
    assert 0.4 * len(whole) < len(head) < len(whole)  # the cut point lies inside the whole question


def synth_voice():
    from rill.tiny_speech.voices import Voice

    return Voice("en-us", "", 160, 50, 100, 0)
