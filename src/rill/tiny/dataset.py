"""Token rows for training: conversations encoded, loss-masked and packed into fixed-length rows.

The loss covers assistant turns only: the answer and its closing <|im_end|>, not the
"<|im_start|>assistant\\n" header and not the newline after <|im_end|>. Conversations are packed
whole, separated by <|endoftext|>; a row's tail is padding with no loss. Shards are generated
in worker processes from seeds derived from the recipe's seed, so the rows depend on the seed
alone, not on the number of workers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from rill.tiny import corpus, splits
from rill.tiny.template import ASSISTANT_HEADER, render_parts
from rill.tiny.tokenizer_train import ENDOFTEXT
from rill.tiny.workers import process_pool

CONVERSATIONS_PER_SHARD = 4096
SYSTEM_HEADER = "<|im_start|>system\n"


@dataclass
class Rows:
    tokens: np.ndarray  # [num_rows, seq_len + 1] uint16
    loss_mask: np.ndarray  # [num_rows, seq_len + 1] bool, True where the token is a training target
    num_dropped: int = 0  # conversations longer than a row

    def __len__(self) -> int:
        return len(self.tokens)


class ConversationEncoder:
    """Encodes conversations part by part, caching the few system turns (tool lists) that repeat."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.header_len = len(tokenizer.encode(ASSISTANT_HEADER).ids)
        self.eot = tokenizer.token_to_id(ENDOFTEXT)
        self.cache: dict[str, list[int]] = {}

    def encode(self, conversations: list[corpus.Conversation]) -> list[tuple[np.ndarray, np.ndarray]]:
        parts = [render_parts(c.messages, c.tools) for c in conversations]
        fresh = sorted({text for p in parts for text, _ in p} - self.cache.keys())
        encodings = self.tokenizer.encode_batch(fresh, add_special_tokens=False)
        encoded = {text: e.ids for text, e in zip(fresh, encodings)}
        self.cache.update((t, ids) for t, ids in encoded.items() if t.startswith(SYSTEM_HEADER))
        encoded.update(self.cache)
        return [self._join(p, encoded) for p in parts]

    def _join(self, parts: list[tuple[str, bool]], encoded: dict[str, list[int]]) -> tuple[np.ndarray, np.ndarray]:
        ids, mask = [], []
        for text, is_assistant in parts:
            piece = encoded[text]
            ids += piece
            if is_assistant:  # train on the content and <|im_end|>, not the header or the final "\n"
                mask += [False] * self.header_len + [True] * (len(piece) - self.header_len - 1) + [False]
            else:
                mask += [False] * len(piece)
        ids.append(self.eot)
        mask.append(False)
        return np.array(ids, dtype=np.uint16), np.array(mask, dtype=bool)


def pack(docs: list[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int, open_rows: int = 16) -> Rows:
    """First-fit packing over a few open rows; when none has room the fullest one is closed."""
    width = seq_len + 1
    closed: list[list] = []
    rows: list[list] = []  # each: [used, [ids...], [masks...]]
    dropped = 0
    for ids, mask in docs:
        if len(ids) > width:
            dropped += 1
            continue
        row = next((r for r in rows if r[0] + len(ids) <= width), None)
        if row is None:
            if len(rows) == open_rows:
                fullest = max(rows, key=lambda r: r[0])
                rows.remove(fullest)
                closed.append(fullest)
            row = [0, [], []]
            rows.append(row)
        row[0] += len(ids)
        row[1].append(ids)
        row[2].append(mask)
    closed += rows
    tokens = np.stack([_pad(r[1], width, pad_id) for r in closed])
    masks = np.stack([_pad(r[2], width, False) for r in closed])
    return Rows(tokens, masks, dropped)


def _pad(pieces: list[np.ndarray], width: int, value) -> np.ndarray:
    flat = np.concatenate(pieces)
    return np.concatenate([flat, np.full(width - len(flat), value, dtype=flat.dtype)])


def build_shard(tokenizer_json: str, seed: int, shard: int, seq_len: int) -> Rows:
    tokenizer = Tokenizer.from_str(tokenizer_json)
    conversations = corpus.iter_conversations(seed * 1_000_003 + shard, splits.TRAIN)
    batch = [next(conversations) for _ in range(CONVERSATIONS_PER_SHARD)]
    docs = ConversationEncoder(tokenizer).encode(batch)
    return pack(docs, seq_len, tokenizer.token_to_id(ENDOFTEXT))


def build_rows(tokenizer: Tokenizer, seed: int, num_rows: int, seq_len: int, workers: int | None = None) -> Rows:
    """At least num_rows rows (exactly num_rows returned), shard by shard in seed order."""
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    tokenizer_json = tokenizer.to_str()
    shards: list[Rows] = []
    with process_pool(workers) as pool:
        while sum(map(len, shards)) < num_rows:
            missing = num_rows - sum(map(len, shards))
            per_shard = len(shards[0]) if shards else CONVERSATIONS_PER_SHARD // 3
            wave = min(workers, -(-missing // per_shard))
            first = len(shards)
            shards += pool.map(build_shard, [tokenizer_json] * wave, [seed] * wave, range(first, first + wave), [seq_len] * wave)
    tokens = np.concatenate([s.tokens for s in shards])[:num_rows]
    mask = np.concatenate([s.loss_mask for s in shards])[:num_rows]
    return Rows(tokens, mask, sum(s.num_dropped for s in shards))
