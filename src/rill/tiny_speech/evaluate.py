"""Held-out evaluation of rill-tiny-speech: exact transcripts per task family.

    rill eval-tiny-speech [--model DIR] [--per-family N] [--backend transformers|rill] [--json FILE]
                          [--vocabulary held-out|heard]

Clips come from the held-out split: number pairs, words, cities and zones never trained on,
spoken by voice/rate combinations never heard in training, with the recipe's noise, filter, gain
and offset drawn from the evaluation seed. `--vocabulary heard` keeps the held-out voices but asks
about training's number pairs, rill-tiny's training words, real cities and zones: what a user who
asks about those gets. A transcript counts when it equals the expected text after normalize():
lower case, punctuation marks dropped, symbols spaced alike.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rill.tiny import splits
from rill.tiny_speech import augment, dataset, homophones, transcripts

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "rill-tiny-speech"
BAR = 0.95
_SYMBOLS = "+-=/_"  # part of what rill-tiny reads ("347 + 58", "Europe/Paris"): kept
_DROP = str.maketrans("", "", "".join(c for c in string.punctuation if c not in _SYMBOLS))


def normalize(text: str) -> str:
    """Lower case, no punctuation marks, symbols as said: "What is 347+58?" == "what is 347 plus 58".

    rill-tiny's phrasings include both "{a} + {b}" and "{a} plus {b}", which sound the same, so
    the symbols compare as the words spoken for them (transcripts.spoken_form); "_" in a zone
    ("America/New_York") is kept, as rill-tiny's tool call needs it.
    """
    text = text.lower()
    text = re.sub(r"\s*\+\s*", " plus ", text)
    text = re.sub(r"(?<=\d)\s*-\s*(?=\d)", " minus ", text)
    text = re.sub(r"\s*=\s*", " equals ", text)
    return " ".join(text.translate(_DROP).split())


def is_correct(expected: str, got: str) -> bool:
    return normalize(expected) == normalize(got)


def eval_audio(clips: dataset.Clips, seed: int, window_samples: int) -> list[np.ndarray]:
    """Each held-out clip with one draw of the recipe's variety (noise, filter, gain, offset)."""
    rng = np.random.default_rng([seed, 1])
    return [augment.augment(clips.audio(i), rng, window_samples) for i in range(len(clips))]


# -- backends ------------------------------------------------------------------------------------


class TransformersBackend:
    """Greedy `generate` of transformers' WhisperForConditionalGeneration, batched."""

    def __init__(self, model_dir: Path, device: str = "cpu", batch_size: int = 32) -> None:
        import torch
        from transformers import AutoFeatureExtractor, AutoTokenizer, WhisperForConditionalGeneration

        self.torch = torch
        self.extractor = AutoFeatureExtractor.from_pretrained(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = WhisperForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        self.device, self.batch_size = device, batch_size

    @property
    def window_samples(self) -> int:
        return self.extractor.n_samples

    def transcribe(self, audios: Sequence[np.ndarray]) -> list[str]:
        texts = []
        for start in range(0, len(audios), self.batch_size):
            texts += self._batch(audios[start : start + self.batch_size])
        return texts

    def _batch(self, audios: Sequence[np.ndarray]) -> list[str]:
        features = self.extractor(list(audios), sampling_rate=self.extractor.sampling_rate, return_tensors="pt")
        with self.torch.inference_mode():
            out = self.model.generate(features.input_features.to(self.device))
        return [t.strip() for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)]


class RillBackend:
    """rill's own runtime: `rill.Transcriber(model=DIR).transcribe(audio, sample_rate=16000)`."""

    def __init__(self, model_dir: Path) -> None:
        import json as _json

        from rill import Transcriber  # the speech runtime (issue 18, items 2-4)

        self.transcriber = Transcriber(model=str(model_dir))
        config = _json.loads((model_dir / "preprocessor_config.json").read_text())
        self.window_samples = config["n_samples"]

    def transcribe(self, audios: Sequence[np.ndarray]) -> list[str]:
        return [self.transcriber.transcribe(a, sample_rate=augment.SAMPLE_RATE).text.strip() for a in audios]


# -- report --------------------------------------------------------------------------------------


def evaluate(backend, clips: dataset.Clips, seed: int) -> dict:
    started = time.perf_counter()
    texts = backend.transcribe(eval_audio(clips, seed, backend.window_samples))
    alike = homophones.same_sound(list(zip(clips.texts, texts))) or [False] * len(texts)
    families = {f: {"n": 0, "correct": 0, "same_sound": 0, "failures": []} for f in transcripts.FAMILIES}
    transcripts_out = []
    for expected, got, family, voice, sounds_alike in zip(clips.texts, texts, clips.families, clips.voices, alike):
        transcripts_out.append({"family": family, "expected": expected, "got": got, "voice": voice})
        entry = families[family]
        entry["n"] += 1
        right = is_correct(expected, got)
        entry["correct"] += right
        entry["same_sound"] += right or sounds_alike
        if not right and len(entry["failures"]) < 8:
            entry["failures"].append({"expected": expected, "got": got, "voice": voice, "same_sound": sounds_alike})
    for entry in families.values():
        entry["accuracy"] = entry["correct"] / entry["n"] if entry["n"] else None
        entry["same_sound_accuracy"] = entry["same_sound"] / entry["n"] if entry["n"] else None
    n = len(clips)
    return {"families": families, "num_clips": n, "seconds": round(time.perf_counter() - started, 1),
            "audio_s": round(len(clips.pcm) / augment.SAMPLE_RATE, 1),
            "all_families_at_bar": all(e["accuracy"] >= BAR for e in families.values() if e["n"]),
            "transcripts": transcripts_out}


def format_table(report: dict) -> str:
    """Exact transcripts (the bar), and exact or sounding the same to espeak-ng (what hearing decides)."""
    vocabulary = report.get("vocabulary", "held-out")
    lines = [f"| family | {vocabulary} exact transcripts | correct / n | exact or same sound |", "|---|---|---|---|"]
    for family, entry in report["families"].items():
        if entry["n"]:
            lines.append(f"| {family} | {entry['accuracy']:.1%} | {entry['correct']} / {entry['n']} | "
                         f"{entry['same_sound_accuracy']:.1%} |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> Path:
    """rill eval-tiny's bar chart, of exact transcripts (ImportError without matplotlib)."""
    from rill.tiny import evaluate as tiny_evaluate

    vocabulary = report.get("vocabulary", "held-out")
    return tiny_evaluate.plot(report, path, measure=f"{vocabulary} exact transcripts", unit="clips")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rill eval-tiny-speech", description="Held-out transcripts of rill-tiny-speech per family.")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR, help="Hugging Face Whisper directory")
    p.add_argument("--per-family", type=int, default=100, help="clips per family")
    p.add_argument("--json", type=Path, default=None, help="write the full report here (and a plot beside it, FILE.png)")
    p.add_argument("--backend", choices=("transformers", "rill"), default="transformers")
    p.add_argument("--device", default="cpu", help="device for the transformers backend")
    p.add_argument("--seed", type=int, default=1234, help="seed of the held-out clips and their variety")
    p.add_argument("--vocabulary", choices=("held-out", "heard"), default="held-out",
                   help="what the questions name: values never trained on (the bar), or training's own, said by "
                        "held-out voices either way")
    p.add_argument("--workers", type=int, default=None, help="synthesis worker processes")
    p.add_argument("--cache-dir", type=Path, default=dataset.DEFAULT_CACHE)
    return p.parse_args(argv)


def make_backend(args: argparse.Namespace):
    if args.backend == "rill":
        return RillBackend(args.model)
    return TransformersBackend(args.model, args.device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = make_backend(args)
    max_samples = backend.window_samples - int(augment.MAX_OFFSET_S * augment.SAMPLE_RATE)
    split = splits.EVAL if args.vocabulary == "held-out" else transcripts.HEARD
    clips = dataset.build(args.seed, split, args.per_family * len(transcripts.FAMILIES), max_samples,
                          workers=args.workers, root=args.cache_dir, desc=f"synthesize {args.vocabulary} clips")
    report = evaluate(backend, clips, args.seed)
    report.update(model=str(args.model), backend=args.backend, per_family=args.per_family, seed=args.seed,
                  vocabulary=args.vocabulary, held_out_homophones=homophones.held_out_homophones())
    print(format_table(report))
    floor = report["held_out_homophones"]
    if floor and args.vocabulary == "held-out":
        named = ", ".join(f"{w} ({'/'.join(s[:2])})" for w, s in sorted(floor.items()))
        print(f"\n{len(floor)} of {len(splits.eval_words())} held-out words sound exactly like a training word: {named}")
    print(f"\n{report['num_clips']} clips ({report['audio_s']} s of speech) in {report['seconds']} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        try:
            plot(report, args.json.with_suffix(".png"))
        except ImportError:
            print("(no plot: matplotlib is not installed)", file=sys.stderr)
    return 0 if report["all_families_at_bar"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
