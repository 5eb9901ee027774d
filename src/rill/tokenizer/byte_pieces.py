"""Each token's bytes, for tokenizers whose decoder is plain ByteLevel (GPT-2, Llama 3, Qwen, rill-tiny).

Such a decoder maps every character of every token through GPT-2's byte <-> unicode table (a token
with a character outside it contributes its own UTF-8 bytes instead, as `tokenizers` does) and
decodes the joined bytes as UTF-8, lossily. The text of a sequence is therefore the UTF-8 decoding
of its tokens' bytes laid end to end, which lets the detokenizer turn one new token into text with
a table lookup and an incremental UTF-8 decoder instead of decoding a window of ids twice.
"""

from __future__ import annotations

from functools import cache

from tokenizers import Tokenizer as Backend
from tokenizers import decoders


@cache
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's table: printable bytes stand for themselves, the rest move to code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table


def token_bytes(token: str) -> bytes:
    table = _unicode_to_byte()
    if all(c in table for c in token):
        return bytes(table[c] for c in token)
    return token.encode("utf-8")


def byte_pieces(backend: Backend, vocab_size: int, skip_special_tokens: bool) -> tuple[bytes, ...] | None:
    """Every id's bytes (b"" for unknown ids, and for special tokens when they are skipped), or None
    when the decoder is not plain ByteLevel and text must come from decoding windows of ids."""
    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    pieces = []
    for i in range(vocab_size):
        token = backend.id_to_token(i)
        skipped = token is None or (skip_special_tokens and i in special)
        pieces.append(b"" if skipped else token_bytes(token))
    return tuple(pieces)
