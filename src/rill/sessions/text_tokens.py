"""Text that arrives in pieces -> token ids, the same ids as encoding the whole text at once.

Tokenizing each piece on its own would differ from the whole: a word split across two pieces
("hel" + "lo") tokenizes differently, and pre-tokenizers look one character ahead. So the
encoder keeps a *window*: the text from a recent commit point on. Each feed re-encodes the
window and commits the tokens before the last word boundary that the encoding itself confirms
(a whitespace run after a non-space character, where no token spans the cut); the text after
it stays pending until more arrives or the input ends. The window starts one committed segment
before the commit point, so whatever the tokenizer does at the start of a text (a prepended
`▁`, a first-word rule) lands on tokens already committed, not on the ones being decided.

This holds for tokenizers whose pre-tokenizer splits at whitespace (GPT-2 / Llama 3 / Qwen
ByteLevel, sentencepiece conversions); tests/test_sessions_text_tokens.py checks it against the
whole-text encoding over random chunkings. Text without whitespace commits at the next
whitespace or at the end of input.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from functools import lru_cache

MAX_CUTS_TRIED = 4  # word boundaries tried from the right before waiting for more text
_PROBE = "a"
# How vocabularies write whitespace inside a token (ByteLevel's Ġ Ċ ĉ, sentencepiece's ▁).
_MARKERS = str.maketrans({"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"})
_CROSS_WORD = re.compile(r"\w\S*\s+\S*\w")  # a word, whitespace, a word: one token spans words


class IncrementalEncoder:
    """feed() pieces of text, flush() at the end; each returns the ids it commits."""

    def __init__(self, tokenizer, text: str = "", *, add_special_tokens: bool = False):
        self._backend = tokenizer._backend  # offsets: rill's Tokenizer exposes ids only
        self._lead, self._trail = _special_ids(self._backend, add_special_tokens)
        self._cuts_words = splits_at_words(tokenizer)
        self._window = ""  # text from the context start to the end of what arrived
        self._num_context_chars = 0  # window[:n] is committed already
        self.num_committed = 0
        self.num_pending_chars = 0
        self._ids = self.feed(text)  # the initial text's committed ids, taken by take_initial()

    def take_initial(self) -> list[int]:
        ids, self._ids = self._ids, []
        return ids

    def feed(self, text: str) -> list[int]:
        """Add text; return the ids that can no longer change."""
        self._window += text
        if not self._cuts_words:
            self.num_pending_chars = len(self._window)
            return []
        ids, starts, ends, first = self._encode_pending()
        cut = self._confirmed_cut(starts, ends)
        if cut is None:
            return []
        return self._commit(ids[first:cut[0]], cut[1])

    def flush(self, text: str = "") -> list[int]:
        """End of this text run: add text and commit every remaining id."""
        self._window += text
        ids, _, _, first = self._encode_pending()
        committed = self._commit(ids[first:], len(self._window))
        committed = self._lead + committed + self._trail  # the lead is still here if no id came yet
        self.num_committed += len(self._lead) + len(self._trail)
        self._window, self._num_context_chars = "", 0
        self._lead = []  # a later run continues the same sequence
        return committed

    # -- internals ------------------------------------------------------------------------------

    def _encode_pending(self):
        """The window's ids, offsets, and the index of the first id after the committed text."""
        enc = self._backend.encode(self._window, add_special_tokens=False)
        starts = [a for a, _ in enc.offsets]
        ends = [b for _, b in enc.offsets]
        # The committed text ends on a token boundary (it was confirmed before it was committed);
        # a tokenizer that merges across words could move it, and then the ids after it go on.
        first = bisect_left(starts, self._num_context_chars)
        self.num_pending_chars = len(self._window) - self._num_context_chars
        return enc.ids, starts, ends, first

    def _confirmed_cut(self, starts: list[int], ends: list[int]) -> tuple[int, int] | None:
        """(token index, char position) of the rightmost word boundary no token spans."""
        for pos in _word_starts(self._window, self._num_context_chars, MAX_CUTS_TRIED):
            index = _boundary_index(starts, ends, pos)
            if index is not None:
                return index, pos
        return None

    def _commit(self, ids: list[int], pos: int) -> list[int]:
        # The segment just committed becomes the next window's context.
        self._window = self._window[self._num_context_chars:]
        self._num_context_chars = pos - self._num_context_chars
        self.num_pending_chars = len(self._window) - self._num_context_chars
        return self._committed(ids)

    def _committed(self, ids: list[int]) -> list[int]:
        if ids and self._lead:
            ids, self._lead = self._lead + ids, []
        self.num_committed += len(ids)
        return ids


def _boundary_index(starts: list[int], ends: list[int], pos: int) -> int | None:
    """The index of the first token at or after char pos, if no token spans pos; else None."""
    index = bisect_left(starts, pos)
    if index and max(ends[:index]) > pos:
        return None
    return index


def _word_starts(text: str, lo: int, limit: int):
    """Up to `limit` positions in (lo, len) from the right where a whitespace run follows a
    non-space character and more non-space text follows: the start of the last words."""
    found = 0
    i = len(text.rstrip())  # a trailing whitespace run may still join the next word
    while i > lo and found < limit:
        i -= 1
        if text[i].isspace() and i > lo and not text[i - 1].isspace():
            found += 1
            yield i


def _special_ids(backend, add_special_tokens: bool) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a text (a BOS, an EOS), if asked for."""
    if not add_special_tokens:
        return [], []
    plain = backend.encode(_PROBE, add_special_tokens=False).ids
    full = backend.encode(_PROBE, add_special_tokens=True).ids
    at = next(i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain)
    return full[:at], full[at + len(plain):]


@lru_cache(maxsize=8)
def splits_at_words(tokenizer) -> bool:
    """Whether no token of the vocabulary spans two words. A tokenizer whose merges cross words
    (a BPE trained without whitespace pre-tokenization) has no safe early cut: its streamed
    text commits at the end of input only."""
    backend = tokenizer._backend
    tokens = backend.get_vocab(with_added_tokens=False)
    return not any(_CROSS_WORD.search(token.translate(_MARKERS).strip()) for token in tokens)
