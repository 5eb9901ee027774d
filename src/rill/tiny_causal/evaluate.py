"""Held-out evaluation of rill-tiny-causal: rill-tiny-speech's table, with rill's own streaming runtime.

    rill eval-tiny-causal [--model rill-tiny-causal|DIR] [--per-family N] [--vocabulary held-out|heard]
                          [--delay-ms MS] [--chain N] [--json FILE]

The clips, their variety and the scoring are eval-tiny-speech's (rill.tiny_speech.evaluate): held-out
values spoken by held-out voices, exact transcripts and exact-or-same-sound per family. Each clip is fed
to a VoxtralStream (rill.speech.voxtral_realtime) in 80 ms pieces, as a live stream hears it, and the
text is what came out by finish().

`--chain N` speaks N clips back to back in one stream, each followed by CHAIN_GAP_S of silence, as
`rill bench voice`'s concurrent streams speak three questions to one server-VAD session whose stream runs
on across turns. A clip's text is what the stream wrote from its first sample to the next clip's; the
report adds exact transcripts and empty ones by place in the stream.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rill.speech.whisper import RILL_TINY_CAUSAL, speech_model_path
from rill.tiny import splits
from rill.tiny_speech import augment, dataset, transcripts
from rill.tiny_speech import evaluate as speech_eval

WINDOW_S = 6.4  # the longest clip the eval's offset may pad to (training's MAX_SAMPLES + the offset)
PIECE = 1280  # 80 ms pieces, a live stream's chunks
CHAIN_GAP_S = 1.3  # after each chained clip: the bench's 500 ms VAD silence + 0.5 s, and its 0.3 s lead


class StreamBackend:
    """rill's VoxtralStream over each clip, fed piece by piece."""

    def __init__(self, model_dir: Path, delay_ms: float | None = None) -> None:
        from rill.speech.voxtral_realtime import load_voxtral_realtime

        self.runtime, self.delay_ms = load_voxtral_realtime(model_dir), delay_ms
        self.runtime.audio.num_delay_tokens(delay_ms)  # a bad delay fails before any clip is synthesised
        self.window_samples = int(WINDOW_S * augment.SAMPLE_RATE)

    def open_stream(self):
        from rill.speech.voxtral_realtime import VoxtralStream

        return VoxtralStream(self.runtime, augment.SAMPLE_RATE, delay_ms=self.delay_ms)

    @staticmethod
    def fed(stream, audio: np.ndarray) -> str:
        """The text `stream` writes while `audio` goes in, in 80 ms pieces."""
        with torch.inference_mode():
            return "".join(stream.feed(audio[start : start + PIECE]).text for start in range(0, len(audio), PIECE))

    def transcribe_one(self, audio: np.ndarray) -> str:
        stream = self.open_stream()
        text = self.fed(stream, audio)
        with torch.inference_mode():
            return (text + stream.finish().text).strip()

    def transcribe(self, audios: Sequence[np.ndarray]) -> list[str]:
        return [self.transcribe_one(a) for a in audios]


class ChainBackend(StreamBackend):
    """`chain` clips at a time spoken into one VoxtralStream, CHAIN_GAP_S of silence after each."""

    def __init__(self, model_dir: Path, delay_ms: float | None, chain: int) -> None:
        super().__init__(model_dir, delay_ms)
        self.chain = chain

    def transcribe_chain(self, audios: Sequence[np.ndarray]) -> list[str]:
        stream, gap = self.open_stream(), np.zeros(int(CHAIN_GAP_S * augment.SAMPLE_RATE), np.float32)
        texts = [self.fed(stream, np.concatenate([audio, gap])) for audio in audios]
        with torch.inference_mode():
            texts[-1] += stream.finish().text
        return [text.strip() for text in texts]

    def transcribe(self, audios: Sequence[np.ndarray]) -> list[str]:
        return [text for at in range(0, len(audios), self.chain)
                for text in self.transcribe_chain(audios[at : at + self.chain])]


def by_place(report: dict, chain: int) -> dict:
    """Exact and empty transcripts by a clip's place in its stream."""
    places = [{"n": 0, "correct": 0, "empty": 0} for _ in range(chain)]
    for i, t in enumerate(report["transcripts"]):
        place = places[i % chain]
        place["n"] += 1
        place["correct"] += speech_eval.is_correct(t["expected"], t["got"])
        place["empty"] += not t["got"].strip()
    return {"clips_a_stream": chain, "gap_s": CHAIN_GAP_S, "by_place": places}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rill eval-tiny-causal", description="Held-out transcripts of rill-tiny-causal per family.")
    p.add_argument("--model", default=RILL_TINY_CAUSAL, help="rill-tiny-causal (the shipped weights, the default) or a "
                   "Voxtral Realtime directory (a training run's --out)")
    p.add_argument("--per-family", type=int, default=100, help="clips per family")
    p.add_argument("--json", type=Path, default=None, help="write the full report here")
    p.add_argument("--seed", type=int, default=1234, help="seed of the held-out clips and their variety")
    p.add_argument("--vocabulary", choices=("held-out", "heard"), default="held-out")
    p.add_argument("--delay-ms", type=float, default=None, help="transcription delay (default: the model's, "
                   "tekken.json's); a model trained at several delays (train-tiny-causal --delays-ms) takes any of them")
    p.add_argument("--chain", type=int, default=1, help="clips spoken back to back in one stream, as the bench's "
                   "concurrent streams speak three (1: each clip its own stream)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="synthesis worker processes")
    p.add_argument("--cache-dir", type=Path, default=dataset.DEFAULT_CACHE)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.chain < 1:
        raise SystemExit("--chain must be at least 1")
    model_dir = speech_model_path(args.model)
    backend = StreamBackend(model_dir, args.delay_ms) if args.chain == 1 else ChainBackend(model_dir, args.delay_ms, args.chain)
    max_samples = backend.window_samples - int(augment.MAX_OFFSET_S * augment.SAMPLE_RATE)
    split = splits.EVAL if args.vocabulary == "held-out" else transcripts.HEARD
    clips = dataset.build(args.seed, split, args.per_family * len(transcripts.FAMILIES), max_samples,
                          workers=args.workers, root=args.cache_dir, desc=f"synthesize {args.vocabulary} clips")
    report = speech_eval.evaluate(backend, clips, args.seed)
    report.update(model=str(args.model), backend="rill-stream", per_family=args.per_family, seed=args.seed,
                  vocabulary=args.vocabulary, delay_ms=backend.runtime.audio.num_delay_tokens(args.delay_ms) * backend.runtime.audio.frame_ms)
    if args.chain > 1:
        report["chain"] = by_place(report, args.chain)
    print(speech_eval.format_table(report))
    if args.chain > 1:
        print("\nby place in a stream of " + str(args.chain) + ": " + ", ".join(
            f"{k + 1}: {p['correct']}/{p['n']} exact, {p['empty']} empty" for k, p in enumerate(report["chain"]["by_place"])))
    print(f"\n{report['num_clips']} clips ({report['audio_s']} s of speech) in {report['seconds']} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["all_families_at_bar"] else 1


if __name__ == "__main__":
    sys.exit(main())
