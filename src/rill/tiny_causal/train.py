"""Train rill-tiny-causal on one CPU core.

    rill train-tiny-causal [--out DIR] [--steps N] [--clips N] [--threads 1] [--delay-ms 480]
                           [--delays-ms 160,80,240,480] [--init-from DIR] [--max-minutes M]
                           [--checkpoint-every N] [--merges N]

Word-timed training questions (rill.tiny_causal.timings, cached by seed), each clip padded as a live
stream pads it, its delayed text stream (rill.tiny_causal.targets) as the teacher-forced input and
the labels; AdamW with a linear warm-up and a cosine decay; a checkpoint every N steps and at the end
(also when --max-minutes runs out), loadable by rill's runtime (`rill serve --speech-model DIR`).
`--init-from DIR` continues from a checkpoint: its tokenizer and delay are kept.

`--delays-ms` trains at several delays, each batch at one drawn at random: the architecture conditions
its decoder on the delay (a sinusoidal embedding of it scales every MLP), so one checkpoint serves any
of them and the delay becomes a setting of the server (`rill serve --speech-delay-ms`), as Voxtral
Realtime's own is. The first is the checkpoint's default (tekken.json's `transcription_delay_ms`).

`--merges N` adds N byte-pair subword pieces to the tokenizer (rill.tiny_causal.vocab.subword_pieces), so a
word the word pieces do not cover (a held-out value, a number) takes fewer 80 ms frames. With `--init-from`
a checkpoint without them grows its embedding (tied with the output head): every old row is kept and a new
piece's row starts as the mean of its bytes' rows.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rill.tiny_causal import model as M
from rill.tiny_causal import targets, timings, vocab as V
from rill.speech.whisper import speech_model_path
from rill.tiny_speech import augment, synth

DEFAULT_OUT = Path("runs/rill-tiny-causal")
MAX_SAMPLES = 6 * synth.SAMPLE_RATE
N_LEFT = 2
GAP_S = (0.3, 2.0)  # the silence between questions spoken back to back (--chain): a VAD's pause, and longer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rill train-tiny-causal", description="Train rill-tiny-causal (Voxtral Realtime "
                                "architecture) from scratch on espeak-ng questions, word-timed.")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--shape", choices=sorted(M.SHAPES), default="base")
    p.add_argument("--steps", type=int, default=3000, help="steps of the schedule")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--clips", type=int, default=2048, help="training clips synthesised (cached by seed)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--word-weight", type=float, default=3.0, help="loss weight of word tokens against pads")
    p.add_argument("--delay-ms", type=int, default=480, help="transcription delay, a multiple of 80 ms")
    p.add_argument("--delays-ms", type=_delays, default=None,
                   help="train at these delays (comma list of multiples of 80 ms), each batch at one drawn at "
                        "random; the first becomes the checkpoint's default (overrides --delay-ms and an "
                        "--init-from checkpoint's delay)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="synthesis worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-from", type=speech_model_path, default=None,
                   help="continue from this checkpoint directory, or rill-tiny-causal (the shipped weights)")
    p.add_argument("--checkpoint-every", type=int, default=250)
    p.add_argument("--max-minutes", type=float, default=None, help="stop (and save) after this much training time")
    p.add_argument("--cache-dir", type=Path, default=timings.DEFAULT_CACHE)
    p.add_argument("--shard-size", type=int, default=128)
    p.add_argument("--merges", type=int, default=0,
                   help="add this many subword pieces (byte-pair merges) to the tokenizer; with --init-from, "
                        "to a checkpoint that has none")
    p.add_argument("--chain", type=_chain, default=[1],
                   help="questions spoken back to back in one training stream: a comma list, each batch draws "
                        "one (e.g. 1,1,2,3), and holds --batch-size / it streams, so a step hears as much audio "
                        "whatever it draws. Streams longer than the decoder's window teach what a live stream "
                        "that runs on across turns hears: earlier words in the window, BOS out of it")
    return p.parse_args(argv)


def _comma_ints(text: str, ok, rule: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or not all(ok(v) for v in values):
        raise argparse.ArgumentTypeError(f"{rule}, comma separated")
    return values


def _chain(text: str) -> list[int]:
    return _comma_ints(text, lambda c: c >= 1, "--chain: positive counts")


def _delays(text: str) -> list[int]:
    return _comma_ints(text, lambda d: d > 0 and d % 80 == 0, "--delays-ms: positive multiples of 80 ms")


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    done = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def presentation(data: timings.TimedClips, chain: Sequence[int], rng,
                 clean_share: float) -> tuple[np.ndarray, list[str], list[int]]:
    """One presentation of clips `chain` spoken back to back in one stream, as rill-tiny-speech's recipe
    varies a clip (rill.tiny_speech.augment): a lead of silence (up to MAX_OFFSET_S) before the first, a
    gap (GAP_S) before each next one, then a random filter and noise over the whole stream (all but
    `clean_share` of presentations) and a gain; none of these moves a word. Returns the audio, its word
    groups and where each ends."""
    parts, groups, ends, at = [], [], [], 0
    for k, i in enumerate(int(i) for i in chain):
        silence = augment.MAX_OFFSET_S * rng.random() if k == 0 else rng.uniform(*GAP_S)
        parts += [np.zeros(int(silence * synth.SAMPLE_RATE), np.float32), data.clips.audio(i)]
        at += len(parts[-2])
        groups += data.groups[i]
        ends += [e + at for e in data.ends[i]]
        at += len(parts[-1])
    audio = np.concatenate(parts)
    return augment.augment(audio, rng, len(audio), clean_share), groups, ends


def batch(data: timings.TimedClips, chains: np.ndarray, vocab: V.Vocab, extractor, delay: int, rng,
          clean_share: float = augment.CLEAN_SHARE) -> dict:
    """Features, the teacher-forced streams and their loss weights: one stream per row of `chains` (clip
    indices spoken back to back)."""
    streams = []
    presented = [presentation(data, chain, rng, clean_share) for chain in chains]
    padded, frames = M.padded_batch([a for a, _, _ in presented], delay, N_LEFT)
    for audio, groups, ends in presented:
        s = targets.token_stream(vocab, groups, ends, len(audio), delay, N_LEFT)
        streams.append((s + [V.PAD] * frames)[:frames])
    ids = torch.tensor(streams)
    features = extractor(list(padded), sampling_rate=synth.SAMPLE_RATE, return_tensors="pt").input_features
    return dict(ids=ids, features=features)


def fitting(data: timings.TimedClips, vocab: V.Vocab, delay: int) -> np.ndarray:
    """Clips whose delayed stream ends within their padding (long spelled-out words may not)."""
    return np.array([i for i in range(len(data)) if len(targets.token_stream(
        vocab, data.groups[i], data.ends[i], len(data.clips.audio(i)), delay, N_LEFT))
        <= targets.num_frames(len(data.clips.audio(i)), delay, N_LEFT)])


def loss_of(model, b: dict, delay: int, word_weight: float) -> torch.Tensor:
    out = model(input_ids=b["ids"], input_features=b["features"], num_delay_tokens=delay)
    logits, labels = out.logits[:, :-1], b["ids"][:, 1:]
    losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    weights = torch.where(labels == V.PAD, 1.0, word_weight).flatten()
    prompt = 1 + N_LEFT + delay  # labels before index `prompt` are the prompt's own: known, not learned
    mask = (torch.arange(labels.shape[1]) >= prompt - 1).repeat(labels.shape[0])
    weights = weights * mask
    return (losses * weights).sum() / weights.sum()


def setup(args):
    if args.init_from:
        model, extractor, vocab = M.load(args.init_from)
        audio = json.loads((args.init_from / "tekken.json").read_text())["audio"]
        delay_ms = int(audio["transcription_delay_ms"])
        state = json.loads((args.init_from / "train_state.json").read_text()) if (args.init_from / "train_state.json").exists() else {}
        if args.merges:
            if vocab.num_subwords:
                raise SystemExit(f"--merges: {args.init_from} has {vocab.num_subwords} subword pieces already")
            grown = vocab.with_merges(V.subword_pieces(vocab, args.merges, args.seed))
            M.grow_vocab(model, vocab, grown)
            vocab = grown
        return model, extractor, vocab, delay_ms, state.get("total_steps", 0)
    vocab = V.Vocab(V.word_pieces(seed=args.seed))
    if args.merges:
        vocab = vocab.with_merges(V.subword_pieces(vocab, args.merges, args.seed))
    model, extractor = M.create(vocab, args.shape, args.seed)
    return model, extractor, vocab, args.delay_ms, 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.delay_ms % 80 or args.delay_ms <= 0:
        raise SystemExit("--delay-ms must be a positive multiple of 80")
    model, extractor, vocab, delay_ms, done_before = setup(args)
    if args.delays_ms:
        delay_ms = args.delays_ms[0]
    delays = [d // 80 for d in (args.delays_ms or [delay_ms])]
    data = timings.build(args.seed, args.clips, MAX_SAMPLES, root=args.cache_dir, workers=args.workers,
                         size=args.shard_size)
    usable = fitting(data, vocab, max(delays))[: args.clips]  # the same at every delay: the padding grows with it
    print(f"{len(usable)} of {len(data)} clips fit their padding with a {max(delays) * 80} ms delay; "
          f"training at {', '.join(str(d * 80) for d in delays)} ms, default {delay_ms} ms")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    rng, started, losses = np.random.default_rng(args.seed + done_before), time.monotonic(), []
    model.train()
    bar = tqdm(range(args.steps), desc="train-tiny-causal", unit="step", mininterval=5.0)
    step = 0
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        delay = delays[int(rng.integers(len(delays)))]
        count = args.chain[int(rng.integers(len(args.chain)))]
        chains = rng.choice(usable, (max(1, round(args.batch_size / count)), count))
        loss = loss_of(model, batch(data, chains, vocab, extractor, delay, rng), delay, args.word_weight)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}", lr=f"{lr_at(step, args):.1e}")
        timed_out = args.max_minutes and time.monotonic() - started > args.max_minutes * 60
        if (step + 1) % args.checkpoint_every == 0 or timed_out:
            checkpoint(args.out, model, extractor, vocab, delay_ms, done_before + step + 1, losses, started, delays)
        if timed_out:
            break
    checkpoint(args.out, model, extractor, vocab, delay_ms, done_before + step + 1, losses, started, delays)
    print(f"saved {args.out} after {step + 1} steps, loss {np.mean(losses[-20:]):.3f}")
    return 0


def checkpoint(out: Path, model, extractor, vocab, delay_ms, total_steps, losses, started,
               delays: list[int]) -> None:
    M.save(out, model, extractor, vocab, delay_ms, N_LEFT)
    state = dict(total_steps=total_steps, loss_last20=float(np.mean(losses[-20:])), loss_first=losses[0],
                 minutes=round((time.monotonic() - started) / 60, 1), delays_ms=[d * 80 for d in delays])
    (out / "train_state.json").write_text(json.dumps(state, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
