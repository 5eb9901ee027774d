"""The start of a tool call that tool_choice "required" or named forces, cut on a token boundary.

A forced start written into the prompt as text ends where the text ends, not where the tokenizer
would cut: rill-tiny writes `", "arguments": {"` as one token, so a prompt ending in
`", "arguments": ` leaves the model inside a token it has never seen split, and it stops or
writes nonsense. As in token healing, the prompt takes the forced text only up to the last token
boundary before the first byte where a longer token could begin, and the model's output must
begin with the rest, in whichever tokens the model prefers: the forced call's grammar
(rill.openai.constraints) starts with it. (SamplingParams.output_prefix enforces the same for a
caller without a grammar.)
"""

from __future__ import annotations

import json
from typing import NamedTuple

from rill.openai.tool_parser import TOOL_CALL_START
from rill.tokenizer.piece_index import PieceIndex, piece_index


class ForcedPrefix(NamedTuple):
    prompt_text: str  # written after the generation prompt
    output_text: str  # the output must begin with this ("" when the whole start fits in the prompt)

    @property
    def text(self) -> str:
        """The whole forced start, as the tool-call parser reads it."""
        return self.prompt_text + self.output_text


def call_start(name: str | None) -> str:
    """The text that forces a call: any tool (tool_choice "required") or the named one."""
    if name is None:
        return TOOL_CALL_START + '\n{"name": "'
    return TOOL_CALL_START + "\n" + json.dumps({"name": name}, ensure_ascii=False)[:-1] + ', "arguments": '


def split_forced_prefix(tokenizer, text: str) -> ForcedPrefix:
    """Split `text` into the part the prompt ends with and the part the output must begin with.

    `text` is tokenized on its own: it starts on a boundary (Hermes' `<tool_call>` is an added
    token). Tokenizers that are not plain ByteLevel keep the whole text in the prompt."""
    index = piece_index(tokenizer)
    if index is None:
        return ForcedPrefix(text, "")
    data = text.encode("utf-8")
    ids = tokenizer.encode(text, add_special_tokens=False)
    cuts = _cuts(index, ids)
    if cuts[-1] != len(data):  # the tokens do not spell the text: trust nothing
        return ForcedPrefix(text, "")
    open_at = _first_open_byte(index, data, _end_of_last_added(index, ids, cuts))
    if open_at is None:
        return ForcedPrefix(text, "")
    cut = max(c for c in cuts if c <= open_at and _is_char_boundary(data, c))
    kept = data[:cut].decode("utf-8")
    return ForcedPrefix(kept, text[len(kept):])


def _cuts(index: PieceIndex, ids: list[int]) -> list[int]:
    """The byte offsets where the tokenizer cuts: 0, then the end of each token."""
    cuts = [0]
    for token_id in ids:
        cuts.append(cuts[-1] + len(index.pieces[token_id]))
    return cuts


def _end_of_last_added(index: PieceIndex, ids: list[int], cuts: list[int]) -> int:
    """Where the last added token ends: the tokenizer splits added tokens out first, so nothing that
    follows merges into one (a longer added token overlapping it aside)."""
    return max((cuts[k + 1] for k, token_id in enumerate(ids) if token_id in index.added_ids), default=0)


def _first_open_byte(index: PieceIndex, data: bytes, start: int) -> int | None:
    """The first byte from `start` on from which the rest of `data` begins a longer token (None: none)."""
    return next((at for at in range(start, len(data)) if index.extends(data[at:])), None)


def _is_char_boundary(data: bytes, at: int) -> bool:
    return at == len(data) or (data[at] & 0xC0) != 0x80  # not a UTF-8 continuation byte
