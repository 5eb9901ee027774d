"""Which tokens' bytes begin with, or fit inside, a given byte string: the question behind a text
that must end on a token boundary (rill.openai.forced_prefix) and behind the sampler's mask for
an output that must begin with a given text (SamplingParams.output_prefix).

Built from Tokenizer.byte_pieces, so only for plain ByteLevel tokenizers (GPT-2, Llama 3, Qwen,
rill-tiny); the sorted table is made on first use and shared through `piece_index(tokenizer)`.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Sequence

_INDEXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class PieceIndex:
    """Every id's bytes, sorted, so that prefix questions are a binary search, not a vocabulary scan."""

    def __init__(self, pieces: Sequence[bytes], added_ids: frozenset[int] = frozenset()):
        self.pieces = pieces  # id -> bytes, special tokens included
        self.added_ids = added_ids  # tokens the tokenizer splits out of the text before its model runs
        self._keys: list[bytes] | None = None  # sorted non-empty pieces
        self._ids: list[int] = []  # the id of each key

    def _table(self) -> list[bytes]:
        if self._keys is None:
            order = sorted((p, i) for i, p in enumerate(self.pieces) if p)
            self._keys, self._ids = [p for p, _ in order], [i for _, i in order]
        return self._keys

    def extends(self, text: bytes) -> bool:
        """True when some token's bytes start with `text` and go on past it."""
        keys = self._table()
        at = bisect.bisect_right(keys, text)  # past `text` itself: the first longer key that may start so
        return at < len(keys) and keys[at].startswith(text)

    def consistent_ids(self, text: bytes) -> list[int]:
        """Ids whose bytes agree with `text` as far as both go: a piece of its start, or all of it and more.

        These are the tokens a model may write next when its output must begin with `text`."""
        keys = self._table()
        ids = []
        for end in range(1, len(text)):  # pieces that are a proper start of text
            at = bisect.bisect_left(keys, text[:end])
            while at < len(keys) and keys[at] == text[:end]:
                ids.append(self._ids[at])
                at += 1
        at = bisect.bisect_left(keys, text)  # text itself, and every piece that starts with it
        while at < len(keys) and keys[at].startswith(text):
            ids.append(self._ids[at])
            at += 1
        return ids

    def spelled(self, token_ids: Sequence[int], num_bytes: int) -> bytes:
        """The bytes of `token_ids` laid end to end, reading no further than needed for `num_bytes`."""
        out = b""
        for token_id in token_ids:
            if len(out) >= num_bytes:
                break
            out += self.pieces[token_id] if 0 <= token_id < len(self.pieces) else b""
        return out


def piece_index(tokenizer) -> PieceIndex | None:
    """The tokenizer's shared index, or None when its decoder is not plain ByteLevel."""
    if tokenizer not in _INDEXES:
        pieces = tokenizer.byte_pieces(skip_special_tokens=False)
        _INDEXES[tokenizer] = None if pieces is None else PieceIndex(pieces, frozenset(tokenizer.added_tokens_decoder))
    return _INDEXES[tokenizer]
