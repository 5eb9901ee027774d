"""Mistral's tekken tokenizer file (tekken.json), read for decoding only.

rill reads the file itself rather than through mistral-common: a transcription stream only decodes ids
(the prompt is a BOS and streaming pads, no text to encode), decoding tekken is a table of bytes, and
mistral-common's releases that transformers 5 accepts pin numpy below 2.4, which would hold rill's numpy
back. The parity tests use mistral-common (an optional extra) as the oracle for the prompt and padding.

Layout: ids below `default_num_special_tokens` are special (`special_tokens` names some of them, the rest
are fillers); id `n + i` is `vocab[i]`'s bytes (base64 `token_bytes`), byte-level BPE as tiktoken reads it.
"""

from __future__ import annotations

import base64
import codecs
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rill.errors import ModelLoadError
from rill.speech.voxtral_realtime.config import read_json

BOS, EOS, STREAMING_PAD = "<s>", "</s>", "[STREAMING_PAD]"


@dataclass(frozen=True)
class Tekken:
    pieces: tuple[bytes, ...]  # every id's bytes; special ids map to b""
    special_names: dict[str, int]
    num_special_tokens: int
    audio: dict[str, Any]  # the file's audio section, as written

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @property
    def bos_id(self) -> int:
        return self.special_id(BOS)

    @property
    def eos_id(self) -> int:
        return self.special_id(EOS)

    @property
    def streaming_pad_id(self) -> int:
        return self.special_id(STREAMING_PAD)

    def special_id(self, name: str) -> int:
        if name not in self.special_names:
            raise ModelLoadError(f"tekken.json has no special token {name!r}")
        return self.special_names[name]

    def is_special(self, token_id: int) -> bool:
        return token_id < self.num_special_tokens

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens skipped (as batch_decode(skip_special_tokens=True))."""
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    def incremental_decoder(self) -> codecs.IncrementalDecoder:
        """Bytes to text as ids arrive: a character split across ids waits for its last byte."""
        return codecs.getincrementaldecoder("utf-8")(errors="replace")

    @classmethod
    def from_file(cls, file: Path) -> Tekken:
        raw = read_json(file)
        try:
            config, vocab = raw["config"], raw["vocab"]
            num_special = int(config["default_num_special_tokens"])
            vocab_size = int(config.get("default_vocab_size") or num_special + len(vocab))
            specials = {t["token_str"]: int(t["rank"]) for t in raw.get("special_tokens") or []}
            inner = [base64.b64decode(t["token_bytes"]) for t in vocab[: vocab_size - num_special]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{file}: not a tekken tokenizer file ({exc!r})") from None
        if len(inner) != vocab_size - num_special:
            raise ModelLoadError(f"{file}: {len(inner)} vocabulary entries for a vocab_size of {vocab_size}")
        return cls((b"",) * num_special + tuple(inner), specials, num_special, dict(raw.get("audio") or {}))
