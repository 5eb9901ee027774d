"""The rill-tiny-vision recipe: pictures and clips drawn with Pillow, a small tokenizer, and a
Qwen2VLForConditionalGeneration trained from scratch with transformers' own implementation.

    rill train-tiny-vision --out DIR --seed 0 [--steps N] [--threads N] [--workers N] [--device cpu|cuda]

Needs Pillow and matplotlib (its DejaVu fonts) at training time only. Writes a Hugging Face directory
that transformers loads unchanged (Qwen2VLForConditionalGeneration, the tokenizer with Qwen2-VL's
special tokens and chat template, preprocessor_config.json and video_preprocessor_config.json for
Qwen2VLProcessor), plus training_run.json and training_loss.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the drawing workers are forked

import torch
import torch.nn.functional as F
import transformers
from tqdm import tqdm
from transformers import Qwen2VLForConditionalGeneration

from rill.tiny.train import resolve_precision
from rill.tiny_vision import dataset, draw, tasks
from rill.tiny_vision import model as shapes
from rill.tiny_vision import tokenizer as tok

TOKENIZER_SAMPLE = 4000  # rendered training turns the BPE merges are learned from
ANSWER_WORD_WEIGHT = 200


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rill train-tiny-vision", description="Train rill-tiny-vision from scratch.")
    p.add_argument("--out", type=Path, required=True, help="output Hugging Face directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=32, help="examples per step (fresh ones every step)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (3e-3 let the vision features "
                   "blow up, std ~50, and the model answer from priors alone)")
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    p.add_argument("--save-every", type=int, default=0, help="also write the model every N steps (0: only at the end)")
    p.add_argument("--init-from", type=Path, default=None, help="start from this model directory's weights (an "
                   "earlier run or checkpoint of the same seed and shape) instead of random ones: a second phase")
    p.add_argument("--first-example", type=int, default=0,
                   help="draw the stream's examples from this index on: a later phase passes the examples its "
                        "earlier phases drew (their steps x batch size, summed) to see fresh ones")
    p.add_argument("--family-weights", type=_family_weights, default=None, metavar="FAMILY=W,...",
                   help="draw these families W times as often as an unnamed one (weight 1), e.g. "
                        "count=3,number=2: a later phase spends its steps where the held-out answers still miss")
    p.add_argument("--probe-weight", type=float, default=1.0,
                   help="weight of the patch probe's loss: training-only heads that name each picture patch's glyph "
                        "(shape or digit) and colour from the vision tower's features, so the tower learns to see "
                        "from every patch and not only from the answer's token (0: the answer's loss alone)")
    p.add_argument("--workers", type=int, default=1, help="drawing worker processes")
    p.add_argument("--threads", type=int, default=None, help="torch threads (1 holds up best on a shared CPU)")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="bf16: float32 weights, bfloat16 autocast; auto: bf16 on CUDA and AVX-512 CPUs")
    for name, value in vars(shapes.Shape()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    args = p.parse_args(argv)
    if args.first_example < 0:
        p.error("--first-example is an index into the stream, >= 0")
    return args


def shape_of(args: argparse.Namespace) -> shapes.Shape:
    return shapes.Shape(**{name: getattr(args, name) for name in vars(shapes.Shape())})


def tokenizer_texts(seed: int, n: int = TOKENIZER_SAMPLE) -> list[str]:
    """Rendered turns (questions, answers, the template's role names), no pictures drawn."""
    rng = random.Random(f"rill-tiny-vision/{seed}/tokenizer")
    texts = []
    for _ in range(n):
        family = rng.choice(tasks.FAMILIES)
        question = rng.choice(tasks.QUESTIONS[family])
        texts.append(f"user\n{question}\nassistant\n")
    # Answer words many times over, so each is one token: split ones ("bl" + "ue", "bl" + "ack") make the
    # first answer token ambiguous and hide most of an answer's loss in its predictable tail.
    texts += [str(n) for n in range(1000)] + list(tasks.ANSWER_WORDS) * ANSWER_WORD_WEIGHT
    return texts


def _family_weights(text: str) -> dict[str, float]:
    try:
        return dataset.parse_family_weights(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a twentieth of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


class PatchProbe(torch.nn.Module):
    """Training-only heads on the vision tower's patch features (the merger's input): each picture
    patch's glyph (draw.GLYPHS) and colour (draw.COLOUR_NAMES), against dataset.patch_targets.

    The answer's loss reaches the tower through one token per example; these reach it through every
    patch, as the auxiliary CTC loss does for rill-tiny-speech's encoder. Not saved with the model."""

    def __init__(self, model: Qwen2VLForConditionalGeneration) -> None:
        super().__init__()
        dim = model.config.vision_config.embed_dim
        self.glyph = torch.nn.Linear(dim, len(draw.GLYPHS))
        self.colour = torch.nn.Linear(dim, draw.CODE_BASE)
        self.seen: list[torch.Tensor] = []
        model.model.visual.merger.register_forward_pre_hook(lambda _module, args: self.seen.append(args[0]))

    def loss(self, targets: torch.Tensor | None) -> torch.Tensor | None:
        """The pictures' patch loss from this step's tower calls (pictures and clips are separate calls)."""
        seen, self.seen = self.seen, []
        if targets is None:
            return None
        features = next((h for h in seen if h.shape[0] == targets.shape[0]), None)
        if features is None:
            raise RuntimeError(f"no vision tower call over {targets.shape[0]} patches this step")
        features = features.float()
        glyph = F.cross_entropy(self.glyph(features), targets[:, 0])
        return glyph + F.cross_entropy(self.colour(features), targets[:, 1])


def train(model, stream: dataset.Stream, ids: dict[str, int], args, checkpoint=None):
    """Cross-entropy over the answers' tokens (and, with --probe-weight, the patch probe's); returns the
    answers' loss and the probe's, every 10 steps."""
    device = torch.device(args.device)
    probe = PatchProbe(model).to(device) if args.probe_weight > 0 else None
    params = list(model.parameters()) + (list(probe.parameters()) if probe is not None else [])
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98))
    losses, probe_losses = [], []
    bar = tqdm(range(args.steps), desc="train rill-tiny-vision", mininterval=5.0)
    for step in bar:
        batch = dataset.collate(stream.next(), ids[tok.ENDOFTEXT], ids[tok.IMAGE_PAD], ids[tok.VIDEO_PAD])
        labels = batch.pop("labels").to(device)
        targets = batch.pop("patch_targets", None)
        batch = {k: v.to(device) for k, v in batch.items()}
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(**batch, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        total, seen = loss, None
        if probe is not None and (seen := probe.loss(targets.to(device) if targets is not None else None)) is not None:
            total = loss + args.probe_weight * seen
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == args.steps - 1:
            losses.append(loss.item())
            shown = {"loss": f"{losses[-1]:.4f}"}
            if seen is not None:
                probe_losses.append(seen.item())
                shown["probe"] = f"{probe_losses[-1]:.3f}"
            bar.set_postfix(**shown)
        if checkpoint and args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            checkpoint(step + 1)
    return losses, probe_losses


def save(model, tokenizer, shape: shapes.Shape, ids: dict[str, int], out: Path) -> None:
    """Everything Qwen2VLForConditionalGeneration and Qwen2VLProcessor read."""
    model.generation_config = shapes.generation_config(ids)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_tokenizer(tokenizer, out)
    shapes.save_processor_configs(shape, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.precision = resolve_precision(args.precision, args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    shape = shape_of(args)
    tokenizer = tok.train_tokenizer(tokenizer_texts(args.seed))
    ids = tok.special_ids(tokenizer)
    config = shapes.qwen2vl_config(shape, tokenizer.get_vocab_size(), ids)
    model = Qwen2VLForConditionalGeneration(config).to(args.device)
    if args.init_from is not None:
        load_phase(model, tokenizer, args.init_from)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.2f}M parameters, {shape} on {args.device}; vocab {tokenizer.get_vocab_size()}")
    stream = dataset.Stream(args.seed, args.batch_size, tokenizer, shape, args.workers,
                            args.first_example, args.family_weights)

    def checkpoint(step: int) -> None:
        save(model, tokenizer, shape, ids, args.out / f"checkpoint-{step}")

    started = time.perf_counter()
    model.train()
    try:
        losses, probe_losses = train(model, stream, ids, args, checkpoint)
    finally:
        stream.close()
    train_s = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    save(model.cpu().eval(), tokenizer, shape, ids, args.out)
    record = run_record(args, shape, num_params, losses, probe_losses, train_s)
    (args.out / "training_run.json").write_text(json.dumps(record, indent=2) + "\n")
    try:
        plot_losses(record, args.out / "training_loss.png")
    except ImportError:
        pass  # the plot needs matplotlib; the losses are in training_run.json
    print(f"trained {args.steps} steps in {train_s:.1f} s ({train_s / args.steps * 1000:.1f} ms/step); "
          f"wrote {args.out}")
    return 0


def load_phase(model: Qwen2VLForConditionalGeneration, tokenizer, directory: Path) -> None:
    """Weights of an earlier run of the same recipe: its tokenizer must be this one (the seed decides it)
    and its shape this one (load_state_dict checks every tensor's size)."""
    from tokenizers import Tokenizer

    if Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab() != tokenizer.get_vocab():
        raise SystemExit(f"{directory}: its tokenizer is not this seed's; --init-from takes a run of the same recipe")
    earlier = Qwen2VLForConditionalGeneration.from_pretrained(directory, torch_dtype=torch.float32)
    model.load_state_dict(earlier.state_dict())


def run_record(args, shape: shapes.Shape, num_params: int, losses: list[float], probe_losses: list[float],
               train_s: float) -> dict:
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return {
        "seed": args.seed, "init_from": str(args.init_from) if args.init_from else None,
        "precision": args.precision, "steps": args.steps, "batch_size": args.batch_size,
        "lr": args.lr, "warmup": args.warmup, "probe_weight": args.probe_weight,
        "first_example": args.first_example, "family_weights": args.family_weights,
        "examples_seen": args.steps * args.batch_size, "shape": vars(shape),
        "num_params": num_params, "device": device_name, "workers": args.workers,
        "train_s": round(train_s, 1), "ms_per_step": round(train_s / args.steps * 1000, 1),
        "loss_first": losses[0], "loss_last": losses[-1], "losses_every_10_steps": [round(x, 4) for x in losses],
        "probe_losses_every_10_steps": [round(x, 4) for x in probe_losses],
        "torch": torch.__version__, "transformers": transformers.__version__,
    }


def plot_losses(record: dict, path: Path) -> Path:
    """The loss curve of training_run.json (ImportError without matplotlib)."""
    from rill.bench.common import save_plot

    losses = record["losses_every_10_steps"]

    def draw(axes):
        steps = sorted({*range(0, record["steps"], 10), record["steps"] - 1})
        axes[0].plot(steps[: len(losses)], losses)
        axes[0].set_yscale("log")
        axes[0].set_xlabel("step")
        axes[0].set_ylabel("answer cross-entropy (log scale)")

    return save_plot(path, draw, title=f"rill train-tiny-vision, seed {record['seed']}: {record['steps']} steps, "
                                        f"{record['train_s'] / 60:.0f} min on {record['device']}")


if __name__ == "__main__":
    raise SystemExit(main())
