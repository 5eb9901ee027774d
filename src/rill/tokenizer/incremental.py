"""Text that arrives in pieces -> token ids equal to the ids of the whole text.

Encoding each piece on its own gives other ids than encoding the whole: a word split across
pieces ("hel" + "lo") tokenizes differently, and pre-tokenizers look ahead. So the encoder keeps
a short *window* of the text and re-encodes only that on each feed. It commits the ids before the
rightmost *cut* -- the start of a whitespace run that follows a non-space character and comes
before a letter or digit -- that no token of the window's encoding spans. The text after the cut
stays pending until more arrives or the text ends (flush).

Such a cut is final for the tokenizers rill serves. Their pre-tokenizers split there (GPT-2,
Llama 3 and Qwen regexes, sentencepiece's `▁` words) or a token spans it (Llama 3's `.\\n`); the
letter or digit closes the piece the cut lies in (rill-tiny's pieces run from one letter or digit
to the next), so the BPE inside it is settled; BPE never merges across pieces. A vocabulary whose
tokens span words (BPE without whitespace pre-tokenization) has no final cut: its text commits at
flush only (`splits_at_words`). Added tokens are matched in the raw text before any of that, so one
that spans words (rill-tiny's `, "strict": true`) can span a cut only if the text before the cut
ends with the part of that token before one of its blanks: such cuts wait (`_hazards`), the others
stay final.

The window starts at the cut before the committed one, so whatever a tokenizer does at the start
of a text (Llama 2 prepends `▁`) lands on ids already committed, and it stays a few words long.
Text without a cut (CJK without spaces) is not re-encoded until one arrives or the text ends.
tests/test_tokenizer_incremental.py checks this against whole-text encodings over random chunkings.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator
from functools import lru_cache
from itertools import accumulate, islice

from rill.tokenizer.tokenizer import Offsets, Tokenizer

_CUT = re.compile(r"(?<=\S)\s+(?=[^\W_])")  # a whitespace run after a non-space, before a letter or digit
_PROBE = "a"
# How vocabularies write whitespace inside a token (ByteLevel's Ġ Ċ ĉ, sentencepiece's ▁).
_MARKERS = str.maketrans({"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"})


class IncrementalEncoder:
    """feed() the pieces of a text and flush() at its end; each returns the ids it commits.

    The ids committed for a text are tokenizer.encode(text, add_special_tokens), however the text
    was cut. After flush() a new text begins; a BOS the tokenizer adds comes before the first only.
    """

    def __init__(self, tokenizer: Tokenizer, *, add_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._lead, self._trail = _special_ids(tokenizer, add_special_tokens)
        self._can_cut = splits_at_words(tokenizer)
        self._hazards = _hazards(tokenizer) if self._can_cut else ()
        self._window = ""  # committed context, then the pending text
        self._num_context_chars = 0  # window[:n] is committed already
        self.num_committed_tokens = 0

    @property
    def num_pending_chars(self) -> int:
        """Characters received and not yet committed."""
        return len(self._window) - self._num_context_chars

    def feed(self, text: str) -> list[int]:
        """Add text; return the ids that no later text can change."""
        self._window += text
        cuts = self._cuts()
        if not cuts or cuts[-1] <= self._num_context_chars:
            return []  # nothing new could commit: skip the encoding
        ids, offsets = self._tokenizer.encode_with_offsets(self._window)
        final = list(islice(_unspanned(cuts, offsets), 2))  # the rightmost two
        if not final or final[0][0] <= self._num_context_chars:
            return []
        (cut, index), keep = final[0], final[1][0] if len(final) > 1 else 0
        committed = ids[_index_at(offsets, self._num_context_chars):index]
        # The next window starts at the final cut before this one: [keep, cut) is its context.
        self._window, self._num_context_chars = self._window[keep:], cut - keep
        return self._count(committed)

    def flush(self, text: str = "") -> list[int]:
        """End of the text: add text and commit every remaining id."""
        self._window += text
        ids, offsets = self._tokenizer.encode_with_offsets(self._window)
        committed = self._count(ids[_index_at(offsets, self._num_context_chars):] + self._trail, end=True)
        self._window, self._num_context_chars = "", 0
        return committed

    def _cuts(self) -> list[int]:
        """Cut candidates from the committed context on, left to right."""
        if not self._can_cut:
            return []
        cuts = (m.start() for m in _CUT.finditer(self._window, self._num_context_chars))
        return [c for c in cuts if not any(self._window.endswith(h, 0, c) for h in self._hazards)]

    def _count(self, ids: list[int], end: bool = False) -> list[int]:
        if self._lead and (ids or end):  # the lead goes with the text's first ids
            ids, self._lead = self._lead + ids, []
        self.num_committed_tokens += len(ids)
        return ids


def _unspanned(cuts: list[int], offsets: Offsets) -> Iterator[tuple[int, int]]:
    """(cut, index of the first token after it) for the cuts no token spans, rightmost first."""
    starts = [start for start, _ in offsets]
    reach = list(accumulate((end for _, end in offsets), max))  # the furthest end so far
    for cut in reversed(cuts):
        index = bisect_left(starts, cut)
        if index == 0 or reach[index - 1] <= cut:
            yield cut, index


def _index_at(offsets: Offsets, pos: int) -> int:
    """The index of the first token at or after char pos (pos is a committed cut: a token boundary)."""
    return bisect_left([start for start, _ in offsets], pos)


def _special_ids(tokenizer: Tokenizer, add_special_tokens: bool) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a text (a BOS, an EOS), if asked for."""
    if not add_special_tokens:
        return [], []
    plain = tokenizer.encode(_PROBE, add_special_tokens=False)
    full = tokenizer.encode(_PROBE, add_special_tokens=True)
    at = next(i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain)
    return full[:at], full[at + len(plain):]


@lru_cache(maxsize=8)
def splits_at_words(tokenizer: Tokenizer) -> bool:
    """Whether no token of the model's vocabulary holds a cut point (spans two words). Where merges
    cross words (a BPE trained without whitespace pre-tokenization) no early cut is safe. Added
    tokens are left to `_hazards`."""
    added = set(_added_texts(tokenizer))
    return not any(_CUT.search(text.strip()) for text in _token_texts(tokenizer) if text not in added)


@lru_cache(maxsize=8)
def _hazards(tokenizer: Tokenizer) -> tuple[str, ...]:
    """For each added token that holds a cut point, its text up to each such cut: a cut right after
    one of these could end up inside that token once more text arrives."""
    out = set()
    for text in _added_texts(tokenizer):
        out.update(text[:m.start()] for m in _CUT.finditer(text) if m.start() > 0)
    return tuple(sorted(out))


def _added_texts(tokenizer: Tokenizer) -> list[str]:
    return [token.content for token in tokenizer.added_tokens_decoder.values()]


def _token_texts(tokenizer: Tokenizer) -> Iterator[str]:
    """Each token as the text it stands for (a ByteLevel token's bytes can be a fraction of a character)."""
    pieces = tokenizer.byte_pieces()
    if pieces is not None:
        return (piece.decode("utf-8", "replace") for piece in pieces)
    return (token.translate(_MARKERS) for token in tokenizer.get_vocab(with_added_tokens=False))
