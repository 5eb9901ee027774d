"""Spoken-question clips for training and evaluation, synthesised in worker processes, cached on disk.

A set is made of shards of SHARD_SIZE clips. Shard i of (split, seed) draws from its own
random.Random seeded by those three values alone, so a set depends on the seed, not on the number
of workers, and a shard already on disk is reused (synthesis is the slow part). Evaluation shards
cycle through the families, so the first n * len(FAMILIES) clips hold n of each.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rill.tiny import splits
from rill.tiny.workers import process_pool
from rill.tiny_speech import synth, transcripts, voices

SHARD_SIZE = 128
RECIPE_VERSION = 2  # bump when a change to the data recipe makes cached shards stale
DEFAULT_CACHE = Path(os.environ.get("RILL_CACHE", Path.home() / ".cache" / "rill")) / "tiny-speech"
MAX_VOICE_TRIES = 8  # voices tried before an utterance too long for the window is replaced


@dataclass
class Clips:
    pcm: np.ndarray  # [total_samples] int16, the clips back to back
    offsets: np.ndarray  # [n + 1] int64, clip i is pcm[offsets[i]:offsets[i + 1]]
    texts: list[str]
    families: list[str]
    voices: list[str]  # "en-gb+f3 s160 p40 a120 g0"

    def __len__(self) -> int:
        return len(self.texts)

    def audio(self, i: int) -> np.ndarray:
        return synth.from_pcm16(self.pcm[self.offsets[i] : self.offsets[i + 1]])

    def take(self, n: int) -> "Clips":
        return Clips(self.pcm[: self.offsets[n]], self.offsets[: n + 1], self.texts[:n], self.families[:n], self.voices[:n])


def make_shard(seed: int, split: str, index: int, max_samples: int, size: int = SHARD_SIZE) -> Clips:
    rng = random.Random(f"rill-tiny-speech/{seed}/{split}/{index}")
    pieces, texts, families, voice_names = [], [], [], []
    while len(texts) < size:
        family = transcripts.FAMILIES[len(texts) % len(transcripts.FAMILIES)] if split != splits.TRAIN \
            else transcripts.sample_family(rng)
        utterance = transcripts.make_utterance(rng, family, split)
        for _ in range(MAX_VOICE_TRIES):
            voice = voices.sample_voice(rng, splits.EVAL if split == transcripts.HEARD else split)
            audio = synth.synthesize(utterance.spoken, voice)
            if 0 < len(audio) <= max_samples:
                pieces.append(synth.to_pcm16(audio))
                texts.append(utterance.text)
                families.append(family)
                voice_names.append(describe(voice))
                break
    offsets = np.cumsum([0, *map(len, pieces)]).astype(np.int64)
    return Clips(np.concatenate(pieces), offsets, texts, families, voice_names)


def describe(voice: voices.Voice) -> str:
    return f"{voice.name} s{voice.rate_wpm} p{voice.pitch} a{voice.amplitude} g{voice.word_gap}"


def cache_dir(root: Path, seed: int, split: str, max_samples: int) -> Path:
    """One folder per (recipe version, word list, split, seed, window)."""
    lexicon = hashlib.sha256("\n".join(transcripts.dictionary_words()[0]).encode()).hexdigest()[:8]
    return root / f"v{RECIPE_VERSION}-{lexicon}" / f"{split}-seed{seed}-max{max_samples}"


def load_or_make_shard(folder: Path, seed: int, split: str, index: int, max_samples: int, maker=None) -> Clips:
    """Shard `index` from the cache, or made by `maker` (make_shard unless another recipe's; a module-level
    function, so worker processes can run it) and cached."""
    path = folder / f"shard-{index:05d}.npz"
    if path.exists():
        return read_shard(path)
    clips = (maker or make_shard)(seed, split, index, max_samples)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
    np.savez(tmp, pcm=clips.pcm, offsets=clips.offsets, texts=np.array(clips.texts), families=np.array(clips.families),
             voices=np.array(clips.voices))
    os.replace(tmp, path)
    return clips


def read_shard(path: Path) -> Clips:
    with np.load(path) as data:
        return Clips(data["pcm"], data["offsets"], data["texts"].tolist(), data["families"].tolist(), data["voices"].tolist())


def build(seed: int, split: str, num_clips: int, max_samples: int, *, workers: int | None = None,
          root: Path = DEFAULT_CACHE, desc: str | None = None, maker=None) -> Clips:
    """The first `num_clips` clips of (seed, split), from the cache or synthesised in parallel."""
    folder = cache_dir(root, seed, split, max_samples)
    num_shards = -(-num_clips // SHARD_SIZE)
    workers = workers or max(1, os.cpu_count() or 1)
    args = [(folder, seed, split, i, max_samples, maker) for i in range(num_shards)]
    with process_pool(workers) as pool:
        futures = [pool.submit(load_or_make_shard, *a) for a in args]
        shards = [f.result() for f in tqdm(futures, desc=desc or f"synthesize {split}", unit="shard", mininterval=2.0)]
    return concat(shards).take(num_clips)


def concat(shards: list[Clips]) -> Clips:
    starts = np.cumsum([0, *(len(s.pcm) for s in shards)])
    offsets = np.concatenate([[0], *(s.offsets[1:] + start for s, start in zip(shards, starts))]).astype(np.int64)
    return Clips(np.concatenate([s.pcm for s in shards]), offsets, [t for s in shards for t in s.texts],
                 [f for s in shards for f in s.families], [v for s in shards for v in s.voices])
