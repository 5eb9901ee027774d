"""llguidance's view of a rill tokenizer: every id's bytes, special tokens marked.

Built from the tokenizer rill already loaded, never from the network. For a plain ByteLevel
tokenizer (rill-tiny, GPT-2, Llama 3, Qwen) the table is Tokenizer.byte_pieces: added tokens that
are not special (rill-tiny's `<tool_call>`, `", "arguments": {"`) stay text the grammar can match,
where llguidance's own tokenizer.json reader would make every added token special and so forbid
the very tokens the model was trained to write; added markup tags are special (see _TAG). Other
tokenizers go through llguidance's reader, which makes every added token special.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import llguidance

from rill.tokenizer.piece_index import piece_index

# llguidance's mark for a special token: its bytes start with 0xFF, which no UTF-8 text holds.
_SPECIAL_MARK = b"\xff"
# An added token that is a markup tag (Hermes' `<tool_call>`, `</tool_call>`): special to the grammar, so
# that no constrained text (a JSON string) can hold it and cut the call short for the tool-call parser;
# a grammar writes it by name (`</tool_call>` in Lark), see special_tags.
_TAG = re.compile(rb"</?[A-Za-z_][A-Za-z0-9_|-]*>")


class _Vocabulary:
    """The duck type llguidance.TokenizerWrapper reads: tokens, eos/bos ids, special ids, encode."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Collection[int]):
        shown, skipped = tokenizer.byte_pieces(False), tokenizer.byte_pieces(True)
        added = piece_index(tokenizer).added_ids
        # Special: what decode drops when skipping special tokens, and added markup tags.
        self.special_token_ids = [i for i, piece in enumerate(shown)
                                  if piece and (not skipped[i] or (i in added and _TAG.fullmatch(piece)))]
        special = set(self.special_token_ids)
        tokens = [_SPECIAL_MARK + p if i in special else p for i, p in enumerate(shown)]
        self.tokens = tokens[:vocab_size] + [b""] * (vocab_size - len(tokens))  # the embedding's padding ids
        self.eos_token_id = min(eos_token_ids)
        self.bos_token_id = None
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)


def ll_tokenizer(tokenizer, vocab_size: int, eos_token_ids: Collection[int]) -> llguidance.LLTokenizer:
    """An LLTokenizer over the model's vocab_size ids (the logits' width, padding included)."""
    eos = sorted(eos_token_ids)
    if tokenizer.byte_pieces(False) is not None:
        wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, vocab_size, eos))
        return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)
    # Tokenizer keeps its `tokenizers` backend private; llguidance reads the backend's own JSON.
    return llguidance.LLTokenizer(tokenizer._backend.to_str(), n_vocab=vocab_size, eos_token=eos)


def special_tags(tokenizer) -> frozenset[str]:
    """The texts of the added tokens a grammar must write by name (Lark `</tool_call>`), not as a string."""
    pieces, index = tokenizer.byte_pieces(False), piece_index(tokenizer)
    if pieces is None:  # llguidance's reader: every added token is special
        return frozenset(tokenizer.get_vocab(with_added_tokens=True).keys() - tokenizer.get_vocab(False).keys())
    return frozenset(pieces[i].decode() for i in index.added_ids if _TAG.fullmatch(pieces[i]))
