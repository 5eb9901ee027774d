"""Training questions with the time each word ends, from espeak-ng itself.

A word's end is found as rill-tiny-speech's prefix clips find a cut (rill.tiny_speech.prefixes): espeak-ng
says the question's first k words alone, with the same voice, and the length of that audio (silence
trimmed alike) is where word k ends in the whole question. espeak-ng lengthens a sentence's last word, so
the end falls at or a little past the word's end: the delayed target never comes before its word is
heard. This costs one espeak-ng run per word; libespeak's word events (rill.tts.libespeak) would be
cheaper but come from the espeakng-loader wheel's build, not the espeak-ng that says the clips.

A bare symbol ("347 +") has no end of its own (its word "plus" is said with the next number), so it
travels with the next word: the groups are the text between prefixes.cut_points.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rill.tiny import splits
from rill.tiny_speech import dataset, prefixes, synth, transcripts, voices

RECIPE_VERSION = 1
DEFAULT_CACHE = dataset.DEFAULT_CACHE.parent / "tiny-causal"


@dataclass
class TimedClips:
    clips: dataset.Clips
    groups: list[list[str]]  # per clip: its words, grouped so that each group ends where a cut can fall
    ends: list[list[int]]  # per clip: the sample each group ends at

    def __len__(self) -> int:
        return len(self.clips)


def word_groups(text: str) -> list[str]:
    """The text split at its cut points: "What is 347 + 58?" -> ["What", "is", "347", "+ 58?"]."""
    words, cuts = text.split(), prefixes.cut_points(text)
    bounds = [0, *cuts, len(words)]
    return [" ".join(words[a:b]) for a, b in zip(bounds, bounds[1:])]


def group_ends(text: str, voice: voices.Voice, whole_samples: int) -> list[int]:
    """Where each word group ends in the whole question's audio (samples)."""
    groups, ends = word_groups(text), []
    for k in range(1, len(groups)):
        head = synth.synthesize(transcripts.spoken_form(prefixes.text_prefix(" ".join(groups[:k]), 99)), voice)
        ends.append(min(len(head), whole_samples))
    ends.append(whole_samples)
    return np.maximum.accumulate(ends).tolist()  # a shorter prefix never ends after a longer one


def make_timed_shard(seed: int, index: int, max_samples: int, size: int = dataset.SHARD_SIZE) -> TimedClips:
    rng = random.Random(f"rill-tiny-causal/{seed}/train/{index}")
    pieces, texts, families, names, groups, ends = [], [], [], [], [], []
    while len(texts) < size:
        family = transcripts.sample_family(rng)
        utterance = transcripts.make_utterance(rng, family, splits.TRAIN)
        voice = voices.sample_voice(rng, splits.TRAIN)
        audio = synth.synthesize(utterance.spoken, voice)
        if not 0 < len(audio) <= max_samples:
            continue
        pieces.append(synth.to_pcm16(audio))
        texts.append(utterance.text)
        families.append(family)
        names.append(dataset.describe(voice))
        groups.append(word_groups(utterance.text))
        ends.append(group_ends(utterance.text, voice, len(audio)))
    offsets = np.cumsum([0, *map(len, pieces)]).astype(np.int64)
    return TimedClips(dataset.Clips(np.concatenate(pieces), offsets, texts, families, names), groups, ends)


def load_or_make(folder: Path, seed: int, index: int, max_samples: int, size: int = dataset.SHARD_SIZE) -> TimedClips:
    path = folder / f"v{RECIPE_VERSION}-seed{seed}-max{max_samples}" / f"shard-{index:05d}-{size}.npz"
    if path.exists():
        with np.load(path) as d:
            clips = dataset.Clips(d["pcm"], d["offsets"], d["texts"].tolist(), d["families"].tolist(), d["voices"].tolist())
            bounds = np.cumsum([0, *d["counts"]])
            ends = [d["ends"][a:b].tolist() for a, b in zip(bounds, bounds[1:])]
            return TimedClips(clips, [word_groups(t) for t in clips.texts], ends)
    timed = make_timed_shard(seed, index, max_samples, size)
    path.parent.mkdir(parents=True, exist_ok=True)
    c, tmp = timed.clips, path.with_suffix(f".tmp{os.getpid()}.npz")
    np.savez(tmp, pcm=c.pcm, offsets=c.offsets, texts=np.array(c.texts), families=np.array(c.families),
             voices=np.array(c.voices), counts=np.array([len(e) for e in timed.ends]),
             ends=np.array([x for e in timed.ends for x in e], dtype=np.int64))
    os.replace(tmp, path)
    return timed


def build(seed: int, num_clips: int, max_samples: int, *, root: Path = DEFAULT_CACHE, workers: int = 1,
          size: int = dataset.SHARD_SIZE) -> TimedClips:
    """The first shards of `seed` (cached), enough for `num_clips` clips."""
    from rill.tiny.workers import process_pool

    count = -(-num_clips // size)
    with process_pool(workers) as pool:
        shards = [f.result() for f in [pool.submit(load_or_make, root, seed, i, max_samples, size) for i in range(count)]]
    return TimedClips(dataset.concat([s.clips for s in shards]), [g for s in shards for g in s.groups],
                      [e for s in shards for e in s.ends])
