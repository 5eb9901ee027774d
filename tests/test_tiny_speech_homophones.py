"""The eval's second column: transcripts that differ only in a spelling espeak-ng says the same way."""

import numpy as np
import pytest

from rill.tiny import splits
from rill.tiny_speech import dataset, evaluate, homophones, synth

pytestmark = pytest.mark.skipif(not synth.espeak_available(), reason="needs espeak-ng (Debian package)")


def test_same_sound_tells_homophones_from_other_words():
    pairs = [("Reverse the word: knight", "Reverse the word night."), ("Reverse the word: knight", "Reverse the word nine"),
             ("What is 347 + 58?", "what is 347 plus 58"), ("Uppercase: pear", "uppercase pair")]
    assert homophones.same_sound(pairs) == [True, False, True, True]


@pytest.mark.slow  # espeak-ng says the whole training word list (about a minute)
def test_held_out_homophones_are_held_out_words_with_a_training_spelling_that_sounds_the_same():
    floor = homophones.held_out_homophones()
    assert {"knight", "pear", "cellar"} <= set(floor)
    assert "night" in floor["knight"] and "seller" in floor["cellar"]
    assert set(floor) <= splits.eval_words()
    assert "banana" not in floor  # no other spelling sounds like it


class _Echo:
    """A fault-injection stand-in for a model: answers each clip with a prepared transcript."""

    window_samples = 80_000

    def __init__(self, answers):
        self.answers = answers

    def transcribe(self, audios):
        return self.answers[: len(audios)]


def test_eval_counts_a_homophone_as_same_sound_but_not_exact():
    clips = dataset.Clips(pcm=np.zeros(3 * 1600, "int16"), offsets=np.array([0, 1600, 3200, 4800]),
                          texts=["Reverse the word: knight", "Reverse the word: knight", "Reverse the word: knight"],
                          families=["reverse"] * 3, voices=["en-us"] * 3)
    report = evaluate.evaluate(_Echo(["Reverse the word knight.", "Reverse the word night", "Reverse the word nine"]), clips, seed=0)
    entry = report["families"]["reverse"]
    assert (entry["correct"], entry["same_sound"], entry["n"]) == (1, 2, 3)
    assert "| reverse | 33.3% | 1 / 3 | 66.7% |" in evaluate.format_table(report)
