"""rill-tiny's turn-ends phase: teach the shipped model where a user's message ends (semantic_vad).

    python -m rill.tiny.turn_ends --init-from src/rill/assets/rill-tiny --out DIR [--steps 200] [--save-every 100]

rill-tiny's recipe (rill.tiny.dataset) puts the loss on assistant turns only, so the model never
learned to predict the `<|im_end|>` that closes a user message: its probability after "What is 12
plus 30?" was 7e-9 and after "Add 5 and" 0.8 (rill.speech.semantic_vad reads exactly that figure).
This phase continues training from the shipped weights (`--init-from`) on a replay of the recipe's
own mixture (fresh conversations of the same corpus, train split, another seed, rows of the recipe's
1,024 tokens) where the assistant turns keep their usual loss, and adds one yes/no per token: is the
turn over here? Only the end-of-turn token's probability is trained (up where a message ends, down
everywhere before), at user tokens and at assistant tokens alike, never the user's words themselves,
and never on tool results (which the template writes as user turns). Only the top decoder layer
learns; the layers under it and the tied embeddings stay as shipped (see freeze_below).

What the attempts of 2026-11-28/29 taught (`rill eval-tiny --per-family 100 --seed 0`):
- the loss on the user's whole text, all layers, lr 1e-3: turn ends learned, tool calls lost
  (weather_call 97% -> 83% at 30 a family);
- the end-of-turn decision alone, all layers, lr 3e-4: weather_call 80%, uppercase 89%: changing the
  lower layers changes what answers read from the context (the tools list, the word to copy);
- the top layer only: the context is intact, but an end learned on the user's side leaks into the
  answers (`It is 10:2`, a final "." dropped) until the assistant side gets the same yes/no;
- rows of 512 tokens drop a third of the conversations that list tools (the long framework schemas)
  from the replay, and weather_call slips on exactly those shapes.
One torch thread, as the rest of the recipe runs on a shared CPU; `--save-every` checkpoints.
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
import torch.nn.functional as F

from rill.tiny import corpus, dataset, splits, window_attention

USER_HEADER = "<|im_start|>user\n"
TOOL_RESULT = USER_HEADER + "<tool_response>"
CONVERSATIONS_PER_STEP = 48  # about 4.5 packed 1,024-token rows: each row is seen about once
# Loss labels per target token (uint8): what the prediction of that token is trained for.
NONE, ASSISTANT, USER_GOES_ON, USER_ENDS = 0, 1, 2, 3


class TurnEndEncoder(dataset.ConversationEncoder):
    """rill.tiny.dataset's encoder with labels instead of a bool mask: assistant tokens as before;
    in a user message every text token after the first is USER_GOES_ON (the words were not over
    before it) and the closing <|im_end|> is USER_ENDS. The first text token is skipped (an empty
    message is never scored), as are the header and the newline after <|im_end|>."""

    def _join(self, parts, encoded):
        ids, labels = [], []
        user_header = len(self.tokenizer.encode(USER_HEADER, add_special_tokens=False).ids)
        for text, is_assistant in parts:
            piece = encoded[text]
            ids += piece
            if is_assistant:
                labels += [NONE] * self.header_len + [ASSISTANT] * (len(piece) - self.header_len - 1) + [NONE]
            elif text.startswith(USER_HEADER) and not text.startswith(TOOL_RESULT):
                words = len(piece) - user_header - 2  # text tokens; then <|im_end|> and "\n"
                labels += [NONE] * (user_header + 1) + [USER_GOES_ON] * (words - 1) + [USER_ENDS, NONE]
            else:
                labels += [NONE] * len(piece)
        ids.append(self.eot)
        labels.append(NONE)
        return np.array(ids, dtype=np.uint16), np.array(labels, dtype=np.uint8)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rill.tiny.turn_ends", description=__doc__.split("\n\n")[0])
    p.add_argument("--init-from", "--base", dest="base", type=Path,
                   default=Path(__file__).parent.parent / "assets" / "rill-tiny",
                   help="the trained rill-tiny directory to continue from (default: the shipped weights)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024,
                   help="the base recipe's rows: shorter ones drop the conversations with long tool lists from the replay")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate")
    p.add_argument("--end-weight", type=float, default=0.15, help="weight of the end-of-turn loss against the replay's")
    p.add_argument("--seed", type=int, default=7, help="the corpus seed (the base recipe used 0)")
    p.add_argument("--save-every", type=int, default=0, help="also write DIR/checkpoint-N every N steps")
    p.add_argument("--train-layers", type=int, default=1,
                   help="decoder layers trained, counted from the top (the rest and the tied embeddings stay frozen)")
    return p.parse_args(argv)


def build_rows(tokenizer, args) -> dataset.Rows:
    conversations = corpus.iter_conversations(args.seed * 1_000_003, splits.TRAIN)
    batch = [next(conversations) for _ in range(args.steps * CONVERSATIONS_PER_STEP)]
    return dataset.pack(TurnEndEncoder(tokenizer).encode(batch), args.seq_len, tokenizer.token_to_id("<|endoftext|>"))


def lr_at(step: int, args) -> float:
    warm = min(1.0, (step + 1) / 20)
    return args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))


def turn_end_loss(model, rows: torch.Tensor, labels: torch.Tensor, end_id: int, end_weight: float) -> torch.Tensor:
    """The replay's cross-entropy on assistant tokens plus the end-of-turn decision, on both sides:
    -log P(end) where a message ends, -log(1 - P(end)) where it goes on, each kind averaged alone
    (a message has one end and many tokens). The assistant side is there because an end learned on
    the user's side alone leaks into answers (they stopped early: `It is 10:2`)."""
    inputs, targets, keep = rows[:, :-1], rows[:, 1:], labels[:, 1:]
    hidden = model.model(input_ids=inputs, use_cache=False).last_hidden_state
    assistant = keep == ASSISTANT
    logits = model.lm_head(hidden[assistant]).float()
    loss = F.cross_entropy(logits, targets[assistant])
    user = keep >= USER_GOES_ON
    user_end = torch.log_softmax(model.lm_head(hidden[user]).float(), dim=-1)[:, end_id]
    assistant_end = torch.log_softmax(logits, dim=-1)[:, end_id]
    for log_end, ends in ((user_end, keep[user] == USER_ENDS), (assistant_end, targets[assistant] == end_id)):
        loss = loss + end_weight * decision_loss(log_end, ends)
    return loss


def decision_loss(log_end: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of P(end) against where the turn really ends, ends and the rest averaged apart."""
    loss = log_end.new_zeros(())
    if ends.any():
        loss = loss - log_end[ends].mean()
    if (~ends).any():  # log(1 - p), computed stably from log p
        loss = loss - torch.log(-torch.expm1(log_end[~ends].clamp(max=-1e-6))).mean()
    return loss


def train(model, rows: dataset.Rows, args, end_id: int, checkpoint=None) -> list[float]:
    tokens = torch.from_numpy(rows.tokens.astype(np.int64))
    labels = torch.from_numpy(rows.loss_mask)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    batches = itertools.cycle(torch.randperm(len(tokens)).split(args.batch_size))
    losses = []
    for step in range(args.steps):
        index = next(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        loss = turn_end_loss(model, tokens[index], labels[index], end_id, args.end_weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == args.steps - 1:
            losses.append(round(loss.item(), 4))
            print(f"step {step}: loss {losses[-1]} ({time.strftime('%H:%M:%S')})", flush=True)
        if checkpoint and args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            checkpoint(step + 1)
    return losses


def freeze_below(model, train_layers: int) -> None:
    """Train only the top `train_layers` decoder layers. The layers under them, and the tied
    embeddings, write the keys and values every later token reads from the user's words (the
    assistant's copy of a word, a tool's name in the system turn): left as they are, what the
    answers read from the context is the shipped model's, and only the top layers learn to put the
    end of turn into the user positions' outputs."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers[len(model.model.layers) - train_layers:]:
        for p in layer.parameters():
            p.requires_grad_(True)


def save(model, generation_config, base: Path, out: Path) -> None:
    attn, model.config._attn_implementation = model.config._attn_implementation, "sdpa"  # no training-only kernel
    model.generation_config = generation_config
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        model.config._attn_implementation = attn
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / name, out / name)


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
    end_id = tokenizer.token_to_id("<|im_end|>")
    freeze_below(model, args.train_layers)
    print(f"{len(rows)} rows: {int((rows.loss_mask == USER_ENDS).sum())} user ends, "
          f"{int((rows.loss_mask == USER_GOES_ON).sum())} user positions that go on, "
          f"{int((rows.loss_mask == ASSISTANT).sum())} assistant tokens", flush=True)
    losses = train(model, rows, args, end_id, lambda step: save(model, generation_config, args.base,
                                                                    args.out / f"checkpoint-{step}"))
    save(model, generation_config, args.base, args.out)
    print(f"{args.steps} steps over {len(rows)} rows in {time.perf_counter() - started:.0f} s; losses {losses}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
