"""Incremental detokenization of one output sequence, with stop strings.

Each token is decoded in a short window of ids, as vLLM does: the window's first `read_offset` ids are
context whose text was already released, the rest are new, and the new text is the window's text past the
context's. Decoding a window rather than one id keeps what a token means in context: the leading space a
`▁word` token loses at the start of a string, and the bytes of a character that ByteLevel or byte-fallback
(`<0xE4>`) tokens split across ids. While the window's text ends in U+FFFD the character is incomplete and
nothing is released. The cost per token is that of decoding a few ids, whatever the length of the output.

A tokenizer whose decoder is plain ByteLevel offers each id's bytes (`byte_pieces`); then a new token's
text is those bytes through an incremental UTF-8 decoder, which holds an incomplete character back just
the same, at the cost of a table lookup.

Released text then passes the stop strings: text that could still become a stop string is held back until
the next token settles it, and a stop string ends the sequence (cut from the text unless
include_stop_str_in_output).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from typing import Protocol

from rill.errors import ValidationError

# Prompt ids decoded along with the first output token, so that it decodes as it does in context
# (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET).
NUM_CONTEXT_TOKENS = 5
MAX_CONTEXT_TOKENS = 32  # how far back a context reaches past ids that decode to nothing
REPLACEMENT_CHAR = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole UTF-8 character


class Decoder(Protocol):
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str: ...


class Detokenizer:
    """Turns one sequence's output ids into text deltas. One per output sequence; not thread-safe.

    `add` each sampled id (leave out the EOS id unless its text is wanted); once `stop_reason` is set the
    sequence is finished and further ids are ignored. When the sequence ends for any other reason, `flush`
    releases the text held back.
    """

    def __init__(self, tokenizer: Decoder, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool = True,
                 stop: Iterable[str] | str = (), include_stop_str_in_output: bool = False):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stop = (stop,) if isinstance(stop, str) else tuple(stop)
        if not all(self._stop):
            raise ValidationError("stop strings must not be empty", param="stop")
        self._include_stop = include_stop_str_in_output
        pieces = getattr(tokenizer, "byte_pieces", None)
        self._pieces_table = pieces(skip_special_tokens) if pieces is not None else None
        texts = getattr(tokenizer, "byte_texts", None) if self._pieces_table is not None else None
        # Each id's text where its bytes are whole characters (None where they are not), or no table.
        self._texts_table = texts(skip_special_tokens) if texts is not None else None
        if self._pieces_table is not None:
            # An incremental UTF-8 decoder: the bytes of a character still incomplete wait in
            # utf8_held (codecs' IncrementalDecoder without its Python frame per token).
            context = self._context_bytes(prompt_token_ids)  # its text is the prompt's, not ours
            self.utf8_held = context[codecs.utf_8_decode(context, "replace", False)[1] :]
        else:
            self._ids = self._context(prompt_token_ids)
            self._read_offset = len(self._ids)
            self._prefix_text = self._decode(self._ids)  # the context's text
            self.utf8_held = b""
        # The engine's per-token fast path (EngineCore._on_tokens): with no stop strings, a token whose
        # text in whole_texts is not None, while utf8_held is empty, is that text appended to pieces,
        # exactly what add() does for it, without the call.
        self.whole_texts = self._texts_table if not self._stop else None
        self._pending = ""  # decoded text held back as a possible stop-string prefix
        self.pieces: list[str] = []  # the text released so far (joined when `text` is read)
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text released so far (joined when read: read it at the end, not once per token)."""
        if len(self.pieces) > 1:
            self.pieces = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""

    def add(self, token_id: int) -> str:
        """Take one output id; return the text it makes final (often "", while a character or stop is open)."""
        if self.stop_reason is not None:
            return ""
        table = self._pieces_table
        if table is not None:  # the per-token hot path of every engine step: kept to a few lookups
            texts, text = self._texts_table, None
            if texts is not None and not self.utf8_held and 0 <= token_id < len(texts):
                text = texts[token_id]  # whole characters, nothing held: no decoder needed
            if text is None:  # part of a character, or one is open: the UTF-8 decoder joins them
                data = table[token_id] if 0 <= token_id < len(table) else b""
                if self.utf8_held:
                    data = self.utf8_held + data
                text, used = codecs.utf_8_decode(data, "replace", False)
                self.utf8_held = data[used:] if used < len(data) else b""
            if self._stop:
                return self._release(text, final=False)
            if text:
                self.pieces.append(text)
            return text
        self._ids.append(token_id)
        return self._release(self._next_text(), final=False)

    def flush(self) -> str:
        """At the end of the sequence: release everything held back, incomplete characters included."""
        if self.stop_reason is not None:
            return ""
        if self._pieces_table is not None:
            text, self.utf8_held = codecs.utf_8_decode(self.utf8_held, "replace", True)[0], b""
            return self._release(text, final=True)
        window_text = self._decode(self._ids)
        new_text = window_text[len(self._prefix_text) :]
        self._read_offset, self._prefix_text = len(self._ids), window_text
        return self._release(new_text, final=True)

    # -- decoding -----------------------------------------------------------------------------------------

    def _piece(self, token_id: int) -> bytes:
        return self._pieces_table[token_id] if 0 <= token_id < len(self._pieces_table) else b""

    def _context_bytes(self, prompt_token_ids: Sequence[int]) -> bytes:
        """The prompt's last bytes: a character the prompt leaves open is completed by the output."""
        return b"".join(self._piece(i) for i in prompt_token_ids[-NUM_CONTEXT_TOKENS:])

    def _context(self, prompt_token_ids: Sequence[int]) -> list[int]:
        # The window must decode to some text, and not start inside a character. A window that starts
        # inside one decodes its bytes as U+FFFD, and ByteFallback then renders its whole run of byte
        # tokens so, new ones included. A window of ids that decode to nothing (unknown ids, skipped
        # specials) makes the first output piece the start of a text, and a ▁-tokenizer drops its space.
        # So reach back (a little) to a start where both hold; else trim to a character boundary.
        last = len(prompt_token_ids)
        for start in range(max(0, last - NUM_CONTEXT_TOKENS), max(0, last - MAX_CONTEXT_TOKENS) - 1, -1):
            text = self._decode(list(prompt_token_ids[start:]))
            if text and not text.startswith(REPLACEMENT_CHAR):
                return list(prompt_token_ids[start:])
        ids = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        while ids and self._decode(ids).startswith(REPLACEMENT_CHAR):
            del ids[0]
        return ids

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def _next_text(self) -> str:
        window_text = self._decode(self._ids)
        if len(window_text) <= len(self._prefix_text) or window_text.endswith(REPLACEMENT_CHAR):
            return ""  # no text yet: an incomplete character, or a skipped special token
        new_text = window_text[len(self._prefix_text) :]
        # The ids just read become the context; older ids are never decoded again.
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        return new_text

    # -- stop strings -------------------------------------------------------------------------------------

    def _release(self, new_text: str, *, final: bool) -> str:
        if not self._stop:  # nothing to hold back
            if new_text:
                self.pieces.append(new_text)
            return new_text
        self._pending += new_text
        found = self._find_stop()
        if found is not None:
            at, self.stop_reason = found
            out = self._pending[: at + len(self.stop_reason) if self._include_stop else at]
            self._pending = ""
        else:
            keep = 0 if final else self._stop_prefix_len()
            out, self._pending = self._pending[: len(self._pending) - keep], self._pending[len(self._pending) - keep :]
        if out:
            self.pieces.append(out)
        return out

    def _find_stop(self) -> tuple[int, str] | None:
        """The stop string completed first in the held-back text, and where it starts.

        "Completed first" (the earliest end) makes the outcome independent of how the text was split into
        tokens: it is the stop a character-by-character check would meet. Released text never ends in a stop
        string's prefix, so any match lies wholly in the pending text.
        """
        hits = [(at + len(s), at, s) for s in self._stop if (at := self._pending.find(s)) >= 0]
        if not hits:
            return None
        _, at, stop = min(hits)
        return at, stop

    def _stop_prefix_len(self) -> int:
        """Length of the longest end of the pending text that a stop string starts with."""
        longest = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:n]):
                    longest = n
                    break
        return longest
