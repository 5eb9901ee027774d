"""A lower bound on a text's token count, read in milliseconds, so that a multi-megabyte prompt
that cannot fit the context is refused before it is tokenized (which takes seconds per MB).

Bytes cannot refuse: a byte-level BPE token is at least one byte, so a prompt of N bytes may
be as few as N / (longest token) tokens and as many as N. Characters can: a token of the
model's own vocabulary covers at most `max_chars` characters of the text (the longest vocabulary
string; a byte-level string has one character per byte, and a text character is at least one
byte). Added tokens are matched as whole strings before the model's vocabulary and can be far
longer (rill-tiny's tool prompt is one token of 219 characters), so the text they could cover
is counted out first, by occurrence (overlaps counted twice: the bound only gets lower).

A normalizer that composes characters (NFC, NFKC) can shrink a text before it is split: at
most 4 to 1 (a base letter and three combining marks, as Greek U+1F8F), so the bound is divided
by 4. A normalizer that may delete text (Strip, StripAccents, BertNormalizer, sentencepiece's
Precompiled, a Replace by something shorter) leaves no bound: such tokenizers are not checked.
"""

from __future__ import annotations

import re

_SHRINKS_4_TO_1 = ("NFC", "NFKC")
_SAFE = ("NFD", "NFKD", "Lowercase", "Prepend", "Sequence", "Replace", "String")  # a Regex pattern is not
_REPLACE = re.compile(r'Replace\(pattern=String\("((?:[^"\\]|\\.)*)"\), content="((?:[^"\\]|\\.)*)"\)')


class TokenCountBound:
    """`at_least(text)`: a number of tokens the text is sure to have (0 when nothing can be said)."""

    def __init__(self, vocab: dict[str, int], added: list[str], normalizer: str | None):
        self.max_chars = max(map(len, vocab), default=1) or 1
        self.long_added = sorted({s for s in added if len(s) > self.max_chars}, key=len, reverse=True)
        self.shrink = _shrink_factor(normalizer)

    @classmethod
    def of(cls, backend) -> TokenCountBound:
        """From a `tokenizers.Tokenizer`."""
        added = [token.content for token in backend.get_added_tokens_decoder().values()]
        normalizer = None if backend.normalizer is None else repr(backend.normalizer)
        return cls(backend.get_vocab(with_added_tokens=False), added, normalizer)

    def at_least(self, text: str) -> int:
        if self.shrink is None:
            return 0
        num_chars = len(text)
        for token in self.long_added:  # str.count: a fast scan, a few ms per MB each
            if token in text:
                num_chars -= text.count(token) * len(token)
        return max(num_chars, 0) // (self.max_chars * self.shrink)


def _shrink_factor(normalizer: str | None) -> int | None:
    """How many characters of the text may become one before splitting; None: no bound."""
    if normalizer is None:
        return 1
    names = set(re.findall(r"\b([A-Za-z]+)\(", normalizer))
    if any(content_shorter(p, c) for p, c in _REPLACE.findall(normalizer)):
        return None
    if names - set(_SAFE) - set(_SHRINKS_4_TO_1):
        return None  # Strip, StripAccents, BertNormalizer, Precompiled, ...: may delete text
    return 4 if names & set(_SHRINKS_4_TO_1) else 1


def content_shorter(pattern: str, content: str) -> bool:
    return len(content) < len(pattern)
