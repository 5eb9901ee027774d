"""The rill-tiny recipe: synthetic corpus, tokenizer and a Mistral model trained from scratch.

    PYTHONPATH=src python3 -m rill.tiny.train --out DIR --seed 0 [--device cpu|cuda] [--steps N]

Needs only torch, transformers, tokenizers, safetensors, numpy and tqdm (no server modules), so
it runs as-is on a bare GPU box. Writes a Hugging Face directory that transformers and rill load
unchanged, plus training_run.json with the measured times.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the corpus workers are forked

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from tqdm import tqdm
from transformers import GenerationConfig, MistralConfig, MistralForCausalLM

from rill.tiny import corpus, dataset, splits, window_attention
from rill.tiny.tokenizer_train import ENDOFTEXT, IM_END, IM_START, MODEL_MAX_LENGTH, save_tokenizer, train_tokenizer

TOKENIZER_SAMPLE = 4000  # conversations the BPE merges are learned from
SLIDING_WINDOW = 640  # below the 1024-token training rows, so most rows cross the window, yet a
# question with both tools listed and a few earlier turns keeps the tool names inside it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rill train-tiny", description="Train rill-tiny from scratch.")
    p.add_argument("--out", type=Path, required=True, help="output Hugging Face directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=8, help="rows per step")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per row")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50, help="warm-up steps")
    p.add_argument("--save-every", type=int, default=0, help="also write the model every N steps (0: only at the end)")
    p.add_argument("--workers", type=int, default=None, help="corpus worker processes")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="bf16: mixed precision (float32 weights, bfloat16 autocast); auto: bf16 on CUDA and on "
                        "CPUs with AVX-512, fp32 elsewhere (bf16 autocast on an AVX2-only CPU is ~10x slower)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's own; 1 holds up far better on a shared, busy CPU)")
    return p.parse_args(argv)


def resolve_precision(precision: str, device: str, cpu_capability: str | None = None) -> str:
    """bf16 autocast pays off on CUDA and on CPUs with AVX-512 (the float32 weights stay exact);
    on an AVX2-only CPU torch emulates bfloat16 and a step took 31-38 s against 3.2-4.3 s in fp32."""
    if precision != "auto":
        return precision
    if device == "cuda":
        return "bf16"
    capability = cpu_capability or torch.backends.cpu.get_cpu_capability()
    return "bf16" if "AVX512" in capability or "AMX" in capability else "fp32"


def model_config(vocab_size: int, ids: dict[str, int]) -> MistralConfig:
    return MistralConfig(
        vocab_size=-(-vocab_size // 64) * 64,
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=5,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MODEL_MAX_LENGTH,
        sliding_window=SLIDING_WINDOW,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[ENDOFTEXT],
        dtype="float32",
    )


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def masked_loss(model: MistralForCausalLM, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the assistant tokens only; the LM head runs on those positions alone."""
    inputs, targets, keep = rows[:, :-1], rows[:, 1:], mask[:, 1:]
    hidden = model.model(input_ids=inputs, use_cache=False).last_hidden_state  # [B, T, H]
    logits = model.lm_head(hidden[keep]).float()  # [N, V]
    return F.cross_entropy(logits, targets[keep])


def train(model: MistralForCausalLM, rows: dataset.Rows, args: argparse.Namespace, checkpoint=None) -> list[float]:
    device = torch.device(args.device)
    tokens = torch.from_numpy(rows.tokens.astype(np.int64)).to(device)
    mask = torch.from_numpy(rows.loss_mask).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    order = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(args.seed))
    batches = itertools.cycle(order.split(args.batch_size))
    losses = []
    bar = tqdm(range(args.steps), desc="train rill-tiny", mininterval=2.0)
    for step in bar:
        index = next(batches).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = masked_loss(model, tokens[index], mask[index])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == args.steps - 1:
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if checkpoint and args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            checkpoint(step + 1)
    return losses


def save_model(model: MistralForCausalLM, out: Path, ids: dict[str, int]) -> None:
    model.generation_config = GenerationConfig(
        bos_token_id=ids[ENDOFTEXT], eos_token_id=[ids[IM_END], ids[ENDOFTEXT]], pad_token_id=ids[ENDOFTEXT], do_sample=False
    )
    # The training-only attention kernel is not part of the shipped config: loaders pick their own.
    attn, model.config._attn_implementation = model.config._attn_implementation, "sdpa"
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        model.config._attn_implementation = attn


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.precision = resolve_precision(args.precision, args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    started = time.perf_counter()
    sample = itertools.islice(corpus.iter_conversations(args.seed, splits.TRAIN), TOKENIZER_SAMPLE)
    tokenizer = train_tokenizer(c.text() for c in sample)
    ids = {t: tokenizer.token_to_id(t) for t in (ENDOFTEXT, IM_START, IM_END)}
    rows = dataset.build_rows(tokenizer, args.seed, args.steps * args.batch_size, args.seq_len, args.workers)
    data_s = time.perf_counter() - started
    print(f"corpus: {len(rows)} rows of {args.seq_len} tokens, {int(rows.loss_mask.sum())} trained tokens, "
          f"{rows.num_dropped} long conversations dropped, vocab {tokenizer.get_vocab_size()}, {data_s:.1f} s")
    model = MistralForCausalLM(model_config(tokenizer.get_vocab_size(), ids)).to(args.device)
    model.config._attn_implementation = window_attention.register()
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.2f}M parameters on {args.device}")
    train_started = time.perf_counter()
    def checkpoint(step: int) -> None:
        out = args.out / f"checkpoint-{step}"
        save_model(model, out, ids)
        save_tokenizer(tokenizer, out)

    losses = train(model, rows, args, checkpoint)
    if args.device == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - train_started
    args.out.mkdir(parents=True, exist_ok=True)
    save_model(model.cpu(), args.out, ids)
    save_tokenizer(tokenizer, args.out)
    record = run_record(args, rows, num_params, losses, data_s, train_s)
    (args.out / "training_run.json").write_text(json.dumps(record, indent=2) + "\n")
    try:
        plot_losses(record, args.out / "training_loss.png")
    except ImportError:
        pass  # the plot needs matplotlib (the bench extra); the losses are in training_run.json
    print(f"trained {args.steps} steps in {train_s:.1f} s ({train_s / args.steps * 1000:.1f} ms/step); wrote {args.out}")
    return 0


def plot_losses(record: dict, path: Path) -> Path:
    """The loss curve of training_run.json (ImportError without matplotlib)."""
    from rill.bench.common import save_plot

    losses = record["losses_every_25_steps"]

    def draw(axes):
        ax = axes[0]
        steps = sorted({*range(0, record["steps"], 25), record["steps"] - 1})  # as train() records them
        ax.plot(steps[:len(losses)], losses)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (log scale)")

    return save_plot(path, draw, title=f"rill train-tiny, seed {record['seed']}: {record['steps']} steps, "
                                        f"{record['train_s'] / 60:.0f} min on {record['device']}")


def run_record(args, rows, num_params, losses, data_s, train_s) -> dict:
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return {
        "seed": args.seed, "precision": args.precision, "steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "lr": args.lr, "rows": len(rows), "tokens_per_step": args.batch_size * args.seq_len,
        "trained_tokens": int(rows.loss_mask.sum()), "num_params": num_params,
        "device": device_name, "corpus_and_tokenizer_s": round(data_s, 1), "train_s": round(train_s, 1),
        "ms_per_step": round(train_s / args.steps * 1000, 1), "loss_first": losses[0], "loss_last": losses[-1],
        "losses_every_25_steps": [round(x, 4) for x in losses],
        "torch": torch.__version__, "transformers": transformers.__version__,
    }


if __name__ == "__main__":
    raise SystemExit(main())
