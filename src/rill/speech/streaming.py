"""When streamed speech becomes text that never changes: LocalAgreement-n over a growing window.

Streaming recognition decodes the live audio window again every few hundred ms. The end of each
pass is unreliable (the speaker is mid-word), so a word is committed only once `agree_n`
successive passes agree on it: the longest common prefix, in words, of their text after what is
already committed (LocalAgreement-2 for `agree_n=2`; Machacek, Dabre and Bojar, "Turning Whisper
into Real-Time Transcription System", 2023, and ufal/whisper_streaming's `HypothesisBuffer`).
Committed words are final: a later pass that hears them differently changes nothing.

The window keeps the audio of committed words until a committed sentence ends, so the next pass
still hears the start of the sentence it finishes; a pass therefore repeats committed words, which
`insert` drops by time (words that start before the last committed word ended) and then by text
(up to five words that repeat the committed tail). Once the window is longer than `trim_after_s`,
`trim_point` offers the end of the last committed sentence as the place to cut the audio, and
committed text leaves the window for the decoder's prompt (`prompt`): each pass costs at most
`max_window_s` of audio, however long the stream. This module is pure: no audio, no model;
words come in with their times (seconds from the start of the stream), commits go out.
"""

from __future__ import annotations

import msgspec

OVERLAP_SLACK_S = 0.1  # a word starting this close before the last committed end may still be new
OVERLAP_SEARCH_S = 1.0  # repeated committed words are looked for only this close to the last commit
MAX_OVERLAP_WORDS = 5
SENTENCE_ENDS = (".", "?", "!", "\u3002", "\uff1f", "\uff01", "\u2026")
_CLOSERS = "\"')]}\u201d\u2019\u300d\u300f"
_ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "etc.", "e.g.", "i.e.", "no."})


class Word(msgspec.Struct, frozen=True):
    """One recognised word; `text` as the recogniser spells it (Whisper's carries its leading space)."""

    text: str
    start_s: float
    end_s: float


def same_word(a: Word, b: Word) -> bool:
    """Agreement is on spelling, punctuation and case included: a comma or a capital that a later pass
    adds is part of the text we would otherwise commit too early."""
    return a.text.strip() == b.text.strip()


def common_prefix_len(hypotheses: list[list[Word]]) -> int:
    """How many leading words all `hypotheses` share."""
    n = min(len(h) for h in hypotheses)
    for i in range(n):
        if not all(same_word(h[i], hypotheses[0][i]) for h in hypotheses[1:]):
            return i
    return n


def ends_sentence(word: Word) -> bool:
    """A word that closes a sentence: terminal punctuation (closing quotes aside), not a short abbreviation."""
    text = word.text.strip().rstrip(_CLOSERS)
    return text.endswith(SENTENCE_ENDS) and text.lower() not in _ABBREVIATIONS


def drop_repeated(committed_tail: list[Word], words: list[Word]) -> list[Word]:
    """`words` less a head that repeats the end of `committed_tail` (1 to MAX_OVERLAP_WORDS words)."""
    for n in range(min(len(committed_tail), len(words), MAX_OVERLAP_WORDS), 0, -1):
        if all(same_word(c, w) for c, w in zip(committed_tail[-n:], words[:n])):
            return words[n:]
    return words


class LocalAgreement:
    """One stream's commit policy. Per pass: `insert(words)` -> newly committed words; then
    `trim_point(audio_end_s)` and, where it names a time, cut the audio there and `trim(at_s)`."""

    def __init__(self, *, agree_n: int = 2, trim_after_s: float = 15.0, max_window_s: float = 25.0,
                 max_prompt_chars: int = 200):
        assert agree_n >= 2, "one pass agrees with itself: commit needs at least two"
        assert 0 < trim_after_s <= max_window_s
        self.agree_n = agree_n
        self.trim_after_s = trim_after_s
        self.max_window_s = max_window_s
        self.max_prompt_chars = max_prompt_chars
        self.window_start_s = 0.0
        self.last_committed_end_s = 0.0
        self.num_passes = 0
        self.num_committed_words = 0
        self._in_window: list[Word] = []  # committed words whose audio the window still holds
        self._tails: list[list[Word]] = []  # the last agree_n - 1 passes, less what is committed
        self._prompt = ""

    @property
    def prompt(self) -> str:
        """Committed text whose audio has left the window: the decoder's previous-text prompt."""
        return self._prompt

    @property
    def num_words_in_window(self) -> int:
        """Committed words whose audio the window still holds (the overlap check reads their tail)."""
        return len(self._in_window)

    @property
    def unconfirmed(self) -> list[Word]:
        """The latest pass's words after the committed ones: shown as a preview, not yet final."""
        return list(self._tails[-1]) if self._tails else []

    def insert(self, words: list[Word]) -> list[Word]:
        """Take one pass over the window; return the words it commits (possibly none)."""
        self.num_passes += 1
        tail = self._new_words(words)
        self._tails = (self._tails + [tail])[-self.agree_n:]
        if len(self._tails) < self.agree_n:
            return []
        n = common_prefix_len(self._tails)
        committed = tail[:n]
        self._tails = [t[n:] for t in self._tails[1:]]
        self._commit(committed)
        return committed

    def finish(self) -> list[Word]:
        """End of speech: the latest pass's uncommitted words are as good as they will get; commit them."""
        rest = self.unconfirmed
        self._tails = []
        self._commit(rest)
        return rest

    def trim_point(self, audio_end_s: float) -> float | None:
        """Where to cut the audio window now (seconds from the stream start), or None to keep it.

        After `trim_after_s`: at the end of the last committed sentence. Past `max_window_s` with no
        sentence end: at the last committed word, or failing that (silence, noise, passes that never
        agree) `trim_after_s` before the end, so that one pass never grows past the model's window."""
        if audio_end_s - self.window_start_s <= self.trim_after_s:
            return None
        ends = [w.end_s for w in self._in_window if ends_sentence(w)]
        if ends:
            return ends[-1]
        if audio_end_s - self.window_start_s <= self.max_window_s:
            return None
        if self._in_window:
            return self._in_window[-1].end_s
        return audio_end_s - self.trim_after_s

    def trim(self, at_s: float) -> None:
        """The caller cut its audio at `at_s`: committed words before it move to the prompt."""
        assert at_s >= self.window_start_s, "the window only moves forward"
        self.window_start_s = at_s
        gone = [w for w in self._in_window if w.end_s <= at_s]
        self._in_window = self._in_window[len(gone):]
        self._tails = [[w for w in t if w.end_s > at_s] for t in self._tails]
        self._prompt = (self._prompt + "".join(w.text for w in gone))[-self.max_prompt_chars:]

    def _new_words(self, words: list[Word]) -> list[Word]:
        """The pass's words after the committed ones (by time, then by repeated text near the seam)."""
        fresh = [w for w in words if w.start_s > self.last_committed_end_s - OVERLAP_SLACK_S]
        if fresh and abs(fresh[0].start_s - self.last_committed_end_s) < OVERLAP_SEARCH_S:
            fresh = drop_repeated(self._in_window, fresh)
        return fresh

    def _commit(self, words: list[Word]) -> None:
        if not words:
            return
        self._in_window.extend(words)
        self.num_committed_words += len(words)
        self.last_committed_end_s = words[-1].end_s
