"""Text -> clauses, as the text arrives: the voice starts at the first clause boundary.

`ClauseSplitter.feed` takes text in any pieces (an LLM's deltas, a person typing, a caption feed) and
returns the clauses that are complete; `finish` returns the rest. A boundary is cut only once it is
certain: a full stop is a sentence end when the character after it is a space (so "3.5" and "a.b" are
not), and not after a title ("Dr.", "Mr."), an initial ("J.") or "e.g."; a comma, semicolon, colon,
dash or newline ends a clause only when the clause has enough words to sound natural on its own.
A clause never runs past `max_chars`: a run-on text is cut at its last space, so speech starts soon.

Each decision reads only the text up to the character it waits for, so the clauses do not depend on
how the text was cut into pieces: fed one character at a time or whole, the answer is the same
(`split_text` is the whole-text form, and the tests hold the two equal).
"""

from __future__ import annotations

SENTENCE_END = ".!?…"
CLAUSE_END = ",;:"
DASHES = "—–"  # em and en dash; a spaced hyphen " - " counts as a dash too
CLOSERS = "\"')]}»”’"  # a quote or bracket that closes with the sentence: `he said "no." Then`
# Titles before a name: the full stop after them never ends a sentence.
TITLES = frozenset({"dr", "mr", "mrs", "ms", "mx", "prof", "st", "sr", "jr", "rev", "gen", "col", "lt",
                    "capt", "sgt", "hon", "mt", "fig", "vol", "vs", "e.g", "i.e", "cf", "approx"})
# Abbreviations that may end a sentence: they end one when the next word starts with a capital.
MAYBE_END = frozenset({"etc", "inc", "ltd", "co", "corp", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
                       "sep", "sept", "oct", "nov", "dec"})

DEFAULT_MIN_WORDS = 4  # a clause of fewer words joins the next one ("Well, I think so" stays whole)
DEFAULT_MAX_CHARS = 160  # about two seconds of speech; Kokoro's pipeline caps far higher (510 phonemes)


class ClauseSplitter:
    """Cuts text that arrives in pieces into clauses ready to speak, as soon as each is certain."""

    def __init__(self, *, min_words: int = DEFAULT_MIN_WORDS, max_chars: int = DEFAULT_MAX_CHARS):
        if min_words < 1 or max_chars < 8:
            raise ValueError("min_words must be >= 1 and max_chars >= 8")
        self.min_words = min_words
        self.max_chars = max_chars
        self._buf = ""  # text not yet given out; starts at a clause start (no leading space)
        self._pos = 0  # next index of _buf to examine; everything before it holds no boundary

    def feed(self, piece: str) -> list[str]:
        """The clauses that `piece` completes (often none)."""
        self._buf += piece
        if not self._buf.strip():
            self._buf, self._pos = "", 0
        return self._scan(final=False)

    def finish(self) -> list[str]:
        """The clauses left at the end of the text; the splitter is empty (and reusable) after."""
        out = self._scan(final=True)
        tail = _clean(self._buf)
        self._buf, self._pos = "", 0
        return out + ([tail] if tail else [])

    def pending(self) -> str:
        """Text fed but not yet given out as a clause."""
        return self._buf

    def _scan(self, *, final: bool) -> list[str]:
        out: list[str] = []
        while True:
            cut = self._next_cut(final)
            if cut is None:
                return out
            clause = _clean(self._buf[:cut])
            self._buf, self._pos = self._buf[cut:].lstrip(), 0
            if clause:
                out.append(clause)

    def _next_cut(self, final: bool) -> int | None:
        """The end of the first clause in _buf, or None to wait for more text (or at its end)."""
        n = len(self._buf)
        i = self._pos
        while i < n:
            if i >= self.max_chars:
                return self._cap_cut()
            verdict = self._boundary_at(i, final)
            if verdict is _WAIT:
                self._pos = i
                return None
            if isinstance(verdict, tuple):
                cut, resume = verdict
                if cut is not None:
                    return cut
                i = resume
                continue
            i += 1
        self._pos = i
        return None

    def _boundary_at(self, i: int, final: bool):
        """_WAIT, or (cut or None, index to resume at), or None when buf[i] starts no boundary."""
        ch = self._buf[i]
        if ch in SENTENCE_END:
            return self._sentence_end(i, final)
        if ch in CLAUSE_END:
            return self._clause_mark(i, final)
        if ch in DASHES or (ch == "-" and i > 0 and self._buf[i - 1] == " "):
            return self._dash(i, final)
        if ch == "\n":
            return self._newline(i, final)
        return None

    def _sentence_end(self, i: int, final: bool):
        buf, n = self._buf, len(self._buf)
        j = _skip(buf, i, SENTENCE_END)
        j = _skip(buf, j, CLOSERS)
        if j == n:
            return (n, n) if final else _WAIT
        if not buf[j].isspace():
            return (None, j)  # "3.5", "a.b", "?!x": inside a token
        if buf[i:j] == ".":  # after a closing quote ("no.") it is a sentence end whatever the word
            word = _word_before(buf, i)
            if _is_title(word):
                return (None, j)
            if word.lower() in MAYBE_END:
                k = _skip_space(buf, j)
                if k == n:
                    return (j, j) if final else _WAIT
                if not buf[k].isupper():
                    return (None, j)
        return (j, j)

    def _clause_mark(self, i: int, final: bool):
        buf, n = self._buf, len(self._buf)
        j = _skip(buf, i + 1, CLOSERS)
        if j == n:
            return (n, n) if final else _WAIT
        if not buf[j].isspace():
            return (None, j)  # "1,000", "10:30"
        return (j if self._long_enough(i) else None, j)

    def _dash(self, i: int, final: bool):
        buf, n = self._buf, len(self._buf)
        if buf[i] != "—":  # an en dash or a hyphen is a dash only with a space after it ("1–2" is a range)
            if i + 1 == n:
                return (n, n) if final else _WAIT
            if not buf[i + 1].isspace():
                return (None, i + 1)
        return (i + 1 if self._long_enough(i) else None, i + 1)

    def _newline(self, i: int, final: bool):
        buf, n = self._buf, len(self._buf)
        j = _skip_space(buf, i)
        if j == n and not final:
            return _WAIT  # one more newline would make it a paragraph break
        if buf.count("\n", i, j) >= 2:
            return (j, j)  # a blank line ends the clause whatever its length (a heading, a list item)
        return (j if self._long_enough(i) else None, j)

    def _long_enough(self, i: int) -> bool:
        return len(self._buf[:i].split()) >= self.min_words

    def _cap_cut(self) -> int:
        # No boundary in the first max_chars characters: cut at the last space in them, so a word is
        # never split (a single word longer than the cap is cut at the cap).
        cut = self._buf.rfind(" ", 1, self.max_chars + 1)
        return cut if cut > 0 else self.max_chars


_WAIT = object()


def split_text(text: str, *, min_words: int = DEFAULT_MIN_WORDS,
               max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """A whole text's clauses: the same as feeding it in any pieces and finishing."""
    splitter = ClauseSplitter(min_words=min_words, max_chars=max_chars)
    return splitter.feed(text) + splitter.finish()


def _clean(text: str) -> str:
    # Newlines and runs of spaces read as one space; a clause of punctuation alone says nothing.
    clause = " ".join(text.split())
    return clause if any(c.isalnum() for c in clause) else ""


def _skip(buf: str, i: int, chars: str) -> int:
    while i < len(buf) and buf[i] in chars:
        i += 1
    return i


def _skip_space(buf: str, i: int) -> int:
    while i < len(buf) and buf[i].isspace():
        i += 1
    return i


def _word_before(buf: str, i: int) -> str:
    start = i
    while start > 0 and not buf[start - 1].isspace() and buf[start - 1] not in "\"'([{«“‘":
        start -= 1
    return buf[start:i]


def _is_title(word: str) -> bool:
    # A single capital is an initial ("J. R. R. Tolkien"); a dotted word ("U.S.", "e.g.") is read as an
    # abbreviation: in "the U.S. It is" two sentences read as one, which costs a pause, not a word.
    return word.lower() in TITLES or (len(word) == 1 and word.isupper()) or "." in word
