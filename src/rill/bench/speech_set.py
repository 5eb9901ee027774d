"""The audio set of `rill bench transcribe`: spoken questions in rill-tiny's phrasing, as WAV files.

Each clip is `espeak-ng -w CLIP.wav` of a held-out utterance of the rill-tiny-speech recipe (number
pairs, words, cities and zones never trained on, said by held-out voice/rate combinations), so that
a trained model's transcripts can be checked as well as timed. The files are made once into a cache
directory keyed by seed and count; every side of the benchmark reads the same files.
"""

from __future__ import annotations

import json
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rill.tiny_speech import transcripts, voices

FAMILIES = transcripts.FAMILIES
MAX_VOICE_TRIES = 8  # voices tried before an utterance too long for the window is replaced
SYNTH_TIMEOUT_S = 20
_SET_FORMAT = 1  # bump when the way clips are made changes; old cached sets are ignored


@dataclass(frozen=True)
class Clip:
    path: Path
    text: str  # the reference transcript, as rill-tiny reads it
    audio: np.ndarray  # 16 kHz mono float32, as decoded by rill.speech.audio

    @property
    def seconds(self) -> float:
        return len(self.audio) / 16_000

    @property
    def num_words(self) -> int:
        return len(self.text.split())


def set_dir(root: Path, seed: int, n: int, max_seconds: float) -> Path:
    return root / f"transcribe-set-seed{seed}-n{n}-max{max_seconds:g}s-v{_SET_FORMAT}"


def load_audio_set(root: Path, seed: int, n: int, max_seconds: float, *, disable_progress: bool = True) -> list[Clip]:
    """n clips no longer than max_seconds (one model window): made on first use, then read back."""
    from rill.speech.audio import load_audio

    folder = set_dir(root, seed, n, max_seconds)
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        _make_set(folder, seed, n, max_seconds, disable_progress)
    entries = json.loads(manifest.read_text(encoding="utf-8"))
    return [Clip(folder / e["file"], e["text"], load_audio(folder / e["file"])) for e in entries]


def _make_set(folder: Path, seed: int, n: int, max_seconds: float, disable_progress: bool) -> None:
    from rill.bench.common import progress
    from rill.speech.audio import load_audio

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    entries = []
    for i in progress(range(n), desc="espeak-ng clips", disable=disable_progress):
        utterance = transcripts.make_utterance(rng, FAMILIES[i % len(FAMILIES)], "eval")
        path = folder / f"clip-{i:04d}.wav"
        for _ in range(MAX_VOICE_TRIES):
            voice = voices.sample_voice(rng, "eval")
            speak(utterance.spoken, voice, path)
            if len(load_audio(path)) <= max_seconds * 16_000:
                break
        else:
            raise RuntimeError(f"no voice says {utterance.spoken!r} within {max_seconds} s")
        entries.append({"file": path.name, "text": utterance.text, "voice": voice.args()})
    # Written last: a set interrupted half-way is made again, never read.
    (folder / "manifest.json").write_text(json.dumps(entries, indent=1), encoding="utf-8")


def speak(text: str, voice: voices.Voice, path: Path) -> None:
    """espeak-ng writes a 22,050 Hz WAV; it is decoded and resampled once (rill.speech.audio), untimed,
    and every in-process side gets those samples; the HTTP side uploads the file itself."""
    try:
        subprocess.run(["espeak-ng", *voice.args(), "-w", str(path), text], capture_output=True, check=True,
                       timeout=SYNTH_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"espeak-ng failed for {text!r}: {exc} (apt-get install espeak-ng)") from exc


def score(clips: list[Clip], texts: list[str], seconds: float) -> dict:
    """One side's run: real-time factor (processing s / audio s), reference words per processing second,
    and the share of transcripts exactly right (rill-tiny-speech's eval rule: case and punctuation aside)."""
    from rill.tiny_speech.evaluate import normalize

    audio_s = sum(c.seconds for c in clips)
    correct = sum(normalize(c.text) == normalize(t) for c, t in zip(clips, texts))
    return {"seconds": seconds, "audio_seconds": audio_s, "rtf": seconds / audio_s,
            "words_per_s": sum(c.num_words for c in clips) / seconds, "exact": correct / len(clips),
            "texts": list(texts)}
