"""rill-tiny's turn-ends phase: teach the shipped model where a user's message ends (semantic_vad).

    PYTHONPATH=src python3 -m rill.tiny.turn_ends --out DIR [--steps 250] [--lr 1e-3] [--seed 7]

rill-tiny's recipe (rill.tiny.dataset) puts the loss on assistant turns only, so the model never
learned to predict the `<|im_end|>` that closes a user message: its probability after "What is 12
plus 30?" was 7e-9 and after "Add 5 and" 0.8 (rill.speech.semantic_vad reads exactly that figure).
This phase continues training from the shipped weights on fresh conversations of the same corpus
(train split, another seed) with the loss also on each user message's text and its closing
`<|im_end|>` (not its header, not the newline after it, and not on tool results, which the template
writes as user turns): a model of the user's words knows that "Add 5 and" goes on and "Add 5 and 7."
does not. The assistant turns keep their loss. A short cosine schedule; one torch thread, as the
rest of the recipe runs on a shared CPU.

Not shipped yet (2026-11-28, issue 49): 250 steps at lr 1e-3 (23 min on a busy 2-core CPU) separate
the turn ends well (held-out questions, P(end of turn) >= 0.5: whole 88%, cut mid-phrase 0%; the
shipped model 36% and 9%), but cost tool calls (`rill eval-tiny --per-family 30`: weather_call 97% ->
83%, time_call 100% -> 80%, tool_answer 100% -> 73%, reverse 100% -> 93%). Next: a lower learning
rate, or the user loss on the closing <|im_end|> and the word ends only, checked against eval-tiny.
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from rill.tiny import corpus, dataset, splits, window_attention
from rill.tiny.train import masked_loss

USER_HEADER = "<|im_start|>user\n"
TOOL_RESULT = USER_HEADER + "<tool_response>"
CONVERSATIONS_PER_STEP = 48  # about 5 packed 512-token rows per step of 8


class TurnEndEncoder(dataset.ConversationEncoder):
    """rill.tiny.dataset's encoder, with the loss on user messages too."""

    def _join(self, parts, encoded):
        ids, mask = [], []
        user_header = len(self.tokenizer.encode(USER_HEADER, add_special_tokens=False).ids)
        for text, is_assistant in parts:
            piece = encoded[text]
            ids += piece
            if is_assistant:
                mask += [False] * self.header_len + [True] * (len(piece) - self.header_len - 1) + [False]
            elif text.startswith(USER_HEADER) and not text.startswith(TOOL_RESULT):
                mask += [False] * user_header + [True] * (len(piece) - user_header - 1) + [False]
            else:
                mask += [False] * len(piece)
        ids.append(self.eot)
        mask.append(False)
        return np.array(ids, dtype=np.uint16), np.array(mask, dtype=bool)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rill.tiny.turn_ends", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, default=Path(__file__).parent.parent / "assets" / "rill-tiny")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=7, help="the corpus seed (the base recipe used 0)")
    return p.parse_args(argv)


def build_rows(tokenizer, args) -> dataset.Rows:
    conversations = corpus.iter_conversations(args.seed * 1_000_003, splits.TRAIN)
    batch = [next(conversations) for _ in range(args.steps * CONVERSATIONS_PER_STEP)]
    return dataset.pack(TurnEndEncoder(tokenizer).encode(batch), args.seq_len, tokenizer.token_to_id("<|endoftext|>"))


def lr_at(step: int, args) -> float:
    warm = min(1.0, (step + 1) / 20)
    return args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))


def train(model, rows: dataset.Rows, args) -> list[float]:
    tokens = torch.from_numpy(rows.tokens.astype(np.int64))
    mask = torch.from_numpy(rows.loss_mask)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    batches = itertools.cycle(torch.randperm(len(tokens)).split(args.batch_size))
    losses = []
    for step in range(args.steps):
        index = next(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        loss = masked_loss(model, tokens[index], mask[index])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == args.steps - 1:
            losses.append(round(loss.item(), 4))
            print(f"step {step}: loss {losses[-1]}", flush=True)
    return losses


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer
    from transformers import MistralForCausalLM

    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    started = time.perf_counter()
    tokenizer = Tokenizer.from_file(str(args.base / "tokenizer.json"))
    rows = build_rows(tokenizer, args)
    model = MistralForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    generation_config = model.generation_config
    model.config._attn_implementation = window_attention.register()
    losses = train(model, rows, args)
    model.config._attn_implementation = "sdpa"  # the shipped config names no training-only kernel
    model.generation_config = generation_config
    model.save_pretrained(args.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(args.base / name, args.out / name)
    print(f"{args.steps} steps over {len(rows)} rows in {time.perf_counter() - started:.0f} s; losses {losses}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
