"""The recipe's own tekken.json: Mistral's special tokens, the 256 bytes, whole-word pieces, subword pieces.

rill's runtime only decodes (an id's bytes), so the recipe owns the encoder: greedy longest match over
the pieces, bytes as the fallback. Word pieces carry their leading space (" weather") and match whole words
only, so one word is usually one token and one 80 ms frame. Subword pieces (`subword_pieces`, from
`train-tiny-causal --merges`: byte-pair merges over the words the word pieces leave spelled out, their
leading space included) match anywhere, so a spelled-out word (' "cinder".', " 558") takes fewer frames;
without them digits and held-out words are a byte a frame. Merges are appended after the word pieces, so
every older piece keeps its id, and tekken.json records where they start (`rill_word_pieces`, a key
mistral-common ignores).
"""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from pathlib import Path

from rill.tiny import splits
from rill.tiny_speech import transcripts

SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
            "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]",
            "[CALL_ID]", "[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", "[THINK]", "[/THINK]", "[STREAMING_PAD]",
            "[STREAMING_WORD]"]
NUM_SPECIAL = 40  # Mistral's layout: the rest of the special ids are fillers
BOS, PAD = SPECIALS.index("<s>"), SPECIALS.index("[STREAMING_PAD]")
DEFAULT_WORDS = 1024  # word pieces kept: the most common in a sample of training transcripts
SAMPLE_UTTERANCES = 20_000


def word_pieces(num_words: int = DEFAULT_WORDS, seed: int = 0) -> list[bytes]:
    """" word" pieces of training transcripts (never held-out values), most common first; no digits."""
    rng, counts = random.Random(f"rill-tiny-causal/vocab/{seed}"), Counter()
    for _ in range(SAMPLE_UTTERANCES):
        text = transcripts.make_utterance(rng, transcripts.sample_family(rng), splits.TRAIN).text
        counts.update(w for w in text.split() if len(w) > 1 and not any(c.isdigit() for c in w))
    return [f" {w}".encode() for w, _ in counts.most_common(num_words)]


def subword_pieces(words: Vocab, num_merges: int, seed: int = 0, utterances: int = SAMPLE_UTTERANCES) -> list[bytes]:
    """Byte-pair merges, most frequent pair first, over the words of training transcripts (never held-out
    values) that `words`' word pieces leave spelled out, each with its leading space; ties broken by the
    bytes, so the list is fixed."""
    rng, counts = random.Random(f"rill-tiny-causal/merges/{seed}"), Counter()
    for _ in range(utterances):
        text = transcripts.make_utterance(rng, transcripts.sample_family(rng), splits.TRAIN).text
        counts.update(f" {w}".encode() for w in text.split() if f" {w}".encode() not in words.ids)
    corpus = Counter({tuple(bytes([b]) for b in w): c for w, c in counts.items()})
    merges: list[bytes] = []
    while len(merges) < num_merges:
        pairs = Counter()
        for symbols, count in corpus.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda item: (item[1], item[0]))
        merges.append(a + b)
        merged = Counter()
        for symbols, count in corpus.items():
            merged[_merge(symbols, a, b)] += count
        corpus = merged
    return merges


def _merge(symbols: tuple[bytes, ...], a: bytes, b: bytes) -> tuple[bytes, ...]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


class Vocab:
    """The 256 bytes, the word pieces (whole words only) and the subword pieces (anywhere), in that order."""

    def __init__(self, pieces: list[bytes], num_word_pieces: int | None = None):
        pieces = [p for p in pieces if len(p) > 1]
        self.pieces = [bytes([b]) for b in range(256)] + pieces
        self.ids = {p: NUM_SPECIAL + i for i, p in enumerate(self.pieces)}
        self.longest = max(map(len, self.pieces))
        self.num_word_pieces = len(pieces) if num_word_pieces is None else num_word_pieces
        self._first_subword = NUM_SPECIAL + 256 + self.num_word_pieces

    @property
    def size(self) -> int:
        return NUM_SPECIAL + len(self.pieces)

    @property
    def num_subwords(self) -> int:
        return len(self.pieces) - 256 - self.num_word_pieces

    def encode(self, text: str) -> list[int]:
        data, out, i = text.encode(), [], 0
        while i < len(data):
            for n in range(min(self.longest, len(data) - i), 0, -1):
                got = self.ids.get(data[i : i + n])
                if got is not None and (n == 1 or got >= self._first_subword or _ends_word(data, i + n)):
                    out.append(got)
                    i += n
                    break
        return out

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.pieces[i - NUM_SPECIAL] for i in ids if i >= NUM_SPECIAL).decode(errors="replace")

    def with_merges(self, merges: list[bytes]) -> Vocab:
        """This vocabulary and the merges it lacks, appended: every old piece keeps its id."""
        return Vocab(self.pieces[256:] + [m for m in merges if m not in self.ids], self.num_word_pieces)

    def save(self, path: Path, audio: dict) -> None:
        """tekken.json as rill's Tekken and mistral-common read it, with the streaming audio section."""
        specials = [{"rank": i, "token_str": name, "is_control": True} for i, name in enumerate(SPECIALS)]
        vocab = [{"rank": i, "token_bytes": base64.b64encode(p).decode(), "token_str": _str(p)}
                 for i, p in enumerate(self.pieces)]
        config = dict(pattern=r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+", num_vocab_tokens=len(vocab),
                      default_vocab_size=self.size, default_num_special_tokens=NUM_SPECIAL, version="v13")
        data = dict(config=config, vocab=vocab, special_tokens=specials, audio=audio)
        if self.num_subwords:
            data["rill_word_pieces"] = self.num_word_pieces
        (path / "tekken.json").write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> Vocab:
        raw = json.loads((path / "tekken.json").read_text())
        return cls([base64.b64decode(t["token_bytes"]) for t in raw["vocab"]][256:], raw.get("rill_word_pieces"))


def _ends_word(data: bytes, end: int) -> bool:
    """A word piece matches a whole word only (" weather" not in " weatherman")."""
    return end == len(data) or not chr(data[end]).isalpha()


def _str(piece: bytes) -> str | None:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None
