"""The rill-tiny-speech recipe: espeak-ng clips, a small tokenizer and a Whisper model from scratch.

    rill train-tiny-speech --out DIR --seed 0 [--steps N] [--threads N] [--device cpu|cuda]

Needs espeak-ng (Debian package) and the system word list (wamerican) at training time only.
Writes a Hugging Face directory that transformers loads unchanged (WhisperForConditionalGeneration,
WhisperTokenizer(Fast), WhisperFeatureExtractor), plus training_run.json and training_loss.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the synthesis workers are forked

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from tqdm import tqdm
from transformers import WhisperForConditionalGeneration

from rill.tiny import splits
from rill.speech.features import LogMel
from rill.tiny.train import resolve_precision
from rill.tiny_speech import augment, dataset, prefixes, transcripts
from rill.tiny_speech import model as shapes
from rill.tiny_speech import tokenizer as tok

TOKENIZER_SAMPLE = 20_000  # training transcripts the BPE merges are learned from
SPEC_TIME_MASK_S = 0.12


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rill train-tiny-speech", description="Train rill-tiny-speech from scratch.")
    p.add_argument("--out", type=Path, required=True, help="output Hugging Face directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=8000)
    p.add_argument("--batch-size", type=int, default=32, help="clips per step")
    p.add_argument("--train-clips", type=int, default=32_768, help="distinct synthesised clips (each heard "
                   "several times, augmented differently each time)")
    p.add_argument("--prefix-clips", type=int, default=16_384, help="clips cut after a word, transcribed as the "
                   "words said so far (rill.tiny_speech.prefixes: what live recognition's interim passes hear)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    p.add_argument("--spec-augment", type=float, default=0.3, help="share of clips with a time and a frequency mask")
    p.add_argument("--ctc-weight", type=float, default=0.3, help="weight of the auxiliary CTC loss on the encoder "
                   "(a training-only head; 0: none)")
    p.add_argument("--init-from", type=Path, default=None, help="start from this model directory's weights (an "
                   "earlier run or checkpoint of the same seed and shape) instead of random ones: a second phase")
    p.add_argument("--save-every", type=int, default=0, help="also write the model every N steps (0: only at the end)")
    p.add_argument("--workers", type=int, default=None, help="synthesis worker processes")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="bf16: float32 weights, bfloat16 autocast; auto: bf16 on CUDA and AVX-512 CPUs (as rill train-tiny)")
    p.add_argument("--cache-dir", type=Path, default=dataset.DEFAULT_CACHE, help="where synthesised clips are kept")
    p.add_argument("--clean-start", type=float, default=0.6, help="share of clean presentations at step 0, "
                   "falling linearly to the recipe's share over the first quarter of the steps (clean first)")
    p.add_argument("--window-s", type=int, default=shapes.Shape.window_s)
    p.add_argument("--hop-length", type=int, default=shapes.Shape.hop_length, help="feature hop in samples")
    p.add_argument("--d-model", type=int, default=shapes.Shape.d_model)
    p.add_argument("--encoder-layers", type=int, default=shapes.Shape.encoder_layers)
    p.add_argument("--decoder-layers", type=int, default=shapes.Shape.decoder_layers)
    return p.parse_args(argv)


def shape_of(args: argparse.Namespace) -> shapes.Shape:
    return shapes.Shape(window_s=args.window_s, hop_length=args.hop_length, d_model=args.d_model, encoder_layers=args.encoder_layers,
                        decoder_layers=args.decoder_layers)


def max_speech_samples(shape: shapes.Shape) -> int:
    """Clips leave room for the random offset inside the window."""
    return shape.n_samples - int(augment.MAX_OFFSET_S * shapes.SAMPLE_RATE)


def tokenizer_texts(seed: int, n: int = TOKENIZER_SAMPLE) -> list[str]:
    rng = random.Random(f"rill-tiny-speech/{seed}/tokenizer")
    return [" " + transcripts.make_utterance(rng, transcripts.sample_family(rng), splits.TRAIN).text for _ in range(n)]


def encode_targets(tokenizer, texts: list[str], ids: dict[str, int]) -> list[list[int]]:
    """<|startoftranscript|><|notimestamps|> text <|endoftext|>, as `generate` will see it."""
    prompt = shapes.prompt_ids(ids)
    encoded = tokenizer.encode_batch([" " + t for t in texts], add_special_tokens=False)
    return [prompt + e.ids + [ids[tok.ENDOFTEXT]] for e in encoded]


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a twentieth of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


class Batches:
    """Clip indices in a seeded order, epoch after epoch; every presentation augmented afresh."""

    def __init__(self, clips: dataset.Clips, targets: list[list[int]], args, shape: shapes.Shape, pad_id: int) -> None:
        self.clips, self.targets, self.args, self.shape, self.pad_id = clips, targets, args, shape, pad_id
        self.log_mel = LogMel(shapes.feature_config(shape))
        order = np.random.default_rng(args.seed).permutation
        epochs = (order(len(clips)) for _ in itertools.count())
        self.indices = itertools.chain.from_iterable(epochs)

    def next(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index = list(itertools.islice(self.indices, self.args.batch_size))
        rng = np.random.default_rng([self.args.seed, step])
        clean = clean_share(step, self.args)
        audios = [augment.augment(self.clips.audio(i), rng, self.shape.n_samples, clean) for i in index]
        features = self.log_mel.batch(audios).clone()  # [B, 80, num_frames], as WhisperFeatureExtractor's
        if self.args.spec_augment:
            max_mask = int(SPEC_TIME_MASK_S * shapes.SAMPLE_RATE / self.shape.hop_length)
            features = spec_augment(features, rng, self.args.spec_augment, max_mask)
        return features, *self.pad([self.targets[i] for i in index])

    def pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, rows))
        tokens = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width - 1), -100, dtype=torch.long)
        for r, row in enumerate(rows):
            tokens[r, : len(row)] = torch.tensor(row)
            labels[r, 1 : len(row) - 1] = torch.tensor(row[2:])  # <|notimestamps|> is given, not learned
        return tokens[:, :-1], labels


def clean_share(step: int, args: argparse.Namespace) -> float:
    """Clean first: presentations without noise or filter fall from --clean-start to the recipe's
    share over the first quarter of training, so the model first hears the words, then the room."""
    ramp = min(1.0, step / max(1, args.steps // 4))
    return args.clean_start + (augment.CLEAN_SHARE - args.clean_start) * ramp


def spec_augment(features: torch.Tensor, rng: np.random.Generator, share: float, max_time_mask: int) -> torch.Tensor:
    """SpecAugment-lite: one time mask of up to `max_time_mask` frames (SPEC_TIME_MASK_S: shorter than
    a spoken digit, which the transcript must still name) and one band of up to 8 mel bins, at the
    features' floor value, on a `share` of the clips."""
    features = features.clone()
    _, bins, frames = features.shape
    for row in np.flatnonzero(rng.random(len(features)) < share):
        t0, t = int(rng.integers(0, frames)), int(rng.integers(0, max_time_mask + 1))
        f0, f = int(rng.integers(0, bins)), int(rng.integers(0, 8))
        floor = features[row].min()
        features[row, :, t0 : t0 + t] = floor
        features[row, f0 : f0 + f, :] = floor
    return features


def ctc_loss(head: torch.nn.Linear, encoder_states: torch.Tensor, labels: torch.Tensor, blank: int) -> torch.Tensor:
    """CTC of the transcript's tokens over the encoder's frames, through a training-only head.

    The auxiliary loss the hybrid CTC/attention recipes use: it makes the encoder's frames name
    what is said from the first steps, where the decoder alone first learns the transcripts'
    language (a plateau near 1.8 nats that the attention takes long to leave). The head is not
    part of the saved model, which stays a plain WhisperForConditionalGeneration.
    """
    log_probs = F.log_softmax(head(encoder_states).float(), dim=-1).transpose(0, 1)  # [T, B, V]
    keep = (labels != -100) & (labels != blank)  # the text tokens, without <|endoftext|>
    targets = labels[keep]
    frames = torch.full((labels.shape[0],), log_probs.shape[0], dtype=torch.long)
    return F.ctc_loss(log_probs, targets, frames, keep.sum(dim=1), blank=blank, zero_infinity=True)


def train(model: WhisperForConditionalGeneration, batches: Batches, args, checkpoint=None) -> tuple[list[float], list[float]]:
    """Returns the decoder's cross-entropy and the CTC loss, every 10 steps."""
    device = torch.device(args.device)
    head = torch.nn.Linear(model.config.d_model, model.config.vocab_size).to(device)
    params = [*model.parameters(), *head.parameters()]
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98), fused=device.type == "cuda")
    losses, ctc_losses = [], []
    bar = tqdm(range(args.steps), desc="train rill-tiny-speech", mininterval=2.0)
    for step in bar:
        features, tokens, labels = (t.to(device) for t in batches.next(step))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            out = model(input_features=features, decoder_input_ids=tokens, use_cache=False)
            ctc = ctc_loss(head, out.encoder_last_hidden_state, labels, batches.pad_id) if args.ctc_weight else None
        loss = F.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        (loss + args.ctc_weight * ctc if ctc is not None else loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == args.steps - 1:
            losses.append(loss.item())
            ctc_losses.append(ctc.item() if ctc is not None else 0.0)
            bar.set_postfix(loss=f"{losses[-1]:.4f}", ctc=f"{ctc_losses[-1]:.3f}")
        if checkpoint and args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            checkpoint(step + 1)
    return losses, ctc_losses


def save(model, tokenizer, shape: shapes.Shape, ids: dict[str, int], out: Path) -> None:
    """Everything transformers' WhisperForConditionalGeneration, WhisperTokenizer and
    WhisperFeatureExtractor (and so pipeline("automatic-speech-recognition")) read."""
    model.generation_config = shapes.generation_config(ids)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_tokenizer(tokenizer, out)
    shapes.feature_extractor(shape).save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.precision = resolve_precision(args.precision, args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    shape = shape_of(args)
    started = time.perf_counter()
    tokenizer = tok.train_tokenizer(tokenizer_texts(args.seed))
    ids = tok.special_ids(tokenizer)
    clips = dataset.build(args.seed, splits.TRAIN, args.train_clips, max_speech_samples(shape),
                          workers=args.workers, root=args.cache_dir)
    if args.prefix_clips:
        cut = prefixes.build(args.seed, args.prefix_clips, max_speech_samples(shape), workers=args.workers,
                             root=args.cache_dir)
        clips = dataset.concat([clips, cut])
    targets = encode_targets(tokenizer, clips.texts, ids)
    data_s = time.perf_counter() - started
    print(f"data: {len(clips)} clips, {len(clips.pcm) / shapes.SAMPLE_RATE / 3600:.2f} h of speech, vocab "
          f"{tokenizer.get_vocab_size()}, longest target {max(map(len, targets))} tokens, {data_s:.1f} s")
    model = WhisperForConditionalGeneration(shapes.whisper_config(shape, tokenizer.get_vocab_size(), ids)).to(args.device)
    if args.init_from is not None:
        load_phase(model, tokenizer, args.init_from)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params / 1e6:.2f}M parameters, {shape} on {args.device}")
    batches = Batches(clips, targets, args, shape, ids[tok.ENDOFTEXT])

    def checkpoint(step: int) -> None:
        save(model, tokenizer, shape, ids, args.out / f"checkpoint-{step}")

    train_started = time.perf_counter()
    model.train()
    losses, ctc_losses = train(model, batches, args, checkpoint)
    train_s = time.perf_counter() - train_started
    args.out.mkdir(parents=True, exist_ok=True)
    save(model.cpu().eval(), tokenizer, shape, ids, args.out)
    record = run_record(args, shape, clips, num_params, losses, data_s, train_s)
    record["ctc_losses_every_10_steps"] = [round(x, 4) for x in ctc_losses]
    (args.out / "training_run.json").write_text(json.dumps(record, indent=2) + "\n")
    try:
        plot_losses(record, args.out / "training_loss.png")
    except ImportError:
        pass  # the plot needs matplotlib (the bench extra); the losses are in training_run.json
    print(f"trained {args.steps} steps in {train_s:.1f} s ({train_s / args.steps * 1000:.1f} ms/step); wrote {args.out}")
    return 0


def load_phase(model: WhisperForConditionalGeneration, tokenizer, directory: Path) -> None:
    """Weights of an earlier run of the same recipe: its tokenizer must be this one (the seed decides it)."""
    from tokenizers import Tokenizer

    if Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab() != tokenizer.get_vocab():
        raise SystemExit(f"{directory}: its tokenizer is not this seed's; --init-from takes a run of the same recipe")
    earlier = WhisperForConditionalGeneration.from_pretrained(directory)
    model.load_state_dict(earlier.state_dict())


def run_record(args, shape: shapes.Shape, clips: dataset.Clips, num_params, losses, data_s, train_s) -> dict:
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return {
        "seed": args.seed, "init_from": str(args.init_from) if args.init_from else None, "precision": args.precision, "ctc_weight": args.ctc_weight, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
        "train_clips": len(clips) - args.prefix_clips, "prefix_clips": args.prefix_clips, "speech_hours": round(len(clips.pcm) / shapes.SAMPLE_RATE / 3600, 3),
        "window_s": shape.window_s, "d_model": shape.d_model, "encoder_layers": shape.encoder_layers,
        "decoder_layers": shape.decoder_layers, "num_params": num_params, "device": device_name,
        "data_s": round(data_s, 1), "train_s": round(train_s, 1), "ms_per_step": round(train_s / args.steps * 1000, 1),
        "loss_first": losses[0], "loss_last": losses[-1], "losses_every_10_steps": [round(x, 4) for x in losses],
        "torch": torch.__version__, "transformers": transformers.__version__,
    }


def plot_losses(record: dict, path: Path) -> Path:
    """The loss curve of training_run.json (ImportError without matplotlib)."""
    from rill.bench.common import save_plot

    losses = record["losses_every_10_steps"]

    def draw(axes):
        steps = sorted({*range(0, record["steps"], 10), record["steps"] - 1})  # as train() records them
        axes[0].plot(steps[: len(losses)], losses)
        axes[0].set_yscale("log")
        axes[0].set_xlabel("step")
        axes[0].set_ylabel("training loss (log scale)")

    return save_plot(path, draw, title=f"rill train-tiny-speech, seed {record['seed']}: {record['steps']} steps, "
                                        f"{record['train_s'] / 60:.0f} min on {record['device']}")


if __name__ == "__main__":
    raise SystemExit(main())
