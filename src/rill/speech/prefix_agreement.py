"""When a live segment's words become final, without word timestamps: LocalAgreement over forced prefixes.

Streaming recognition decodes a segment's growing audio again every few hundred ms. rill's speech
runtime decodes without timestamps, so the passes cannot be aligned by time as in
rill.speech.streaming (Whisper-Streaming's policy). They need not be: every pass is forced to begin
with the words already committed (`TranscribeParams.prefix`, OpenAI whisper's `prefix`), so it only
decodes what comes after them, and two passes' continuations line up word by word from their
first word. A word is committed once two successive passes agree on it (LocalAgreement-2:
Machacek, Dabre and Bojar, 2023), and while the speaker is still talking the newest pass's last
word waits too: it may be a guess from a word cut off by the end of the audio (a model trained on
whole utterances likes to finish a question it has only half heard). Numbers get more care: one is
said in several words and written as one ("five hundred" is 500 until "fifty-eight" makes it 558),
and a model that has heard part of it may write a different number, then a guess at the rest, in
two passes alike (rill-tiny-speech wrote "Add 5 and" twice for the first 0.7 s of "Add five
hundred fifty-eight and one"). So a word with a digit commits only when three successive passes
agree on it, and while the speaker talks, never as the last of the words committed (it waits for
an agreed word after it). At the segment's end (a pause, a manual commit, the model's window) one
final pass commits everything it says.

Committed words are never taken back: the next pass is forced to repeat them. Pure: text in,
words out.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\s*\S+")
_DIGIT = re.compile(r"\d")


def split_words(text: str) -> list[str]:
    """Words with their leading whitespace, as Whisper writes them (" What", " is"); the joined words
    give back the text less trailing whitespace."""
    return _WORD.findall(text)


def common_prefix_len(a: list[str], b: list[str]) -> int:
    """How many leading words `a` and `b` share (spelling, case and punctuation included)."""
    n = 0
    for x, y in zip(a, b):
        if x.strip() != y.strip():
            break
        n += 1
    return n


class PrefixAgreement:
    """One segment's commit policy. Per pass: `prefix` to force, then `insert(continuation)`."""

    def __init__(self, hold_last_word: bool = True):
        self.hold_last_word = hold_last_word
        self.committed: list[str] = []
        self.num_passes = 0
        self._last: list[str] | None = None  # the previous pass's words after the committed ones
        self._before_last: list[str] | None = None  # the pass before it, likewise (numbers need three passes)

    @property
    def prefix(self) -> str:
        """The committed words, to be forced at the start of the next pass."""
        return "".join(self.committed)

    @property
    def unconfirmed(self) -> str:
        """The latest pass's words after the committed ones: a preview, not final."""
        return "".join(self._last or [])

    def insert(self, continuation: str, *, speaking: bool = True) -> list[str]:
        """One pass's text after `prefix` (as forced when the pass began) -> the words it commits.

        `speaking`: the audio may end inside a word, so the newest pass's last word is held back."""
        self.num_passes += 1
        words = split_words(continuation)
        before_last, last = self._before_last, self._last
        self._before_last, self._last = last, words
        if last is None:
            return []
        n = common_prefix_len(last, words)
        if speaking and self.hold_last_word:
            n = min(n, len(words) - 1)
        three = common_prefix_len(before_last or [], words)  # a number needs the pass before the last too
        n = next((i for i in range(max(n, 0)) if i >= three and _DIGIT.search(words[i])), n)
        while speaking and n > 0 and _DIGIT.search(words[n - 1]):
            n -= 1  # a number may go on ("5" of "five hundred"): it waits for an agreed word after it
        return self._commit(words[:max(n, 0)])

    def finish(self, continuation: str) -> list[str]:
        """The segment's final pass (its audio is complete): everything it says is committed."""
        self.num_passes += 1
        return self._commit(split_words(continuation))

    def _commit(self, words: list[str]) -> list[str]:
        if words:
            self.committed += words
            self._last = (self._last or [])[len(words):]
            self._before_last = (self._before_last or [])[len(words):]
        return words
