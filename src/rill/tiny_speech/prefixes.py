"""Clips cut after a word, with the words said so far: what a live stream's interim pass hears.

Streaming recognition (rill.speech.live) decodes a growing segment again every few hundred ms, so
most passes hear a question cut off mid-way. A model trained only on whole questions finishes them
from its priors ("What is the weather in" for a half-heard "What is twelve..."), and two passes
can agree on such a guess. These clips teach it to write only what it heard: the audio of the
whole question, cut where espeak-ng's rendering of its first k words ends (plus or minus a little,
so a word's first sound may follow the cut), transcribed as those k words.

espeak-ng says a prefix as a whole sentence, lengthening its last word, so the cut falls at or just
past the word's end in the whole question: the transcript then still holds every word heard, and the
jitter teaches the model to leave a trailing fragment out. A cut never falls after a bare symbol
("347 +"), whose spoken word ("plus") belongs with the next number.
"""

from __future__ import annotations

import random

import numpy as np

from rill.tiny import splits
from rill.tiny_speech import dataset, synth, transcripts, voices

SPLIT = "train-prefix"  # the cache folder's split name; the utterances are training ones
JITTER_S = (-0.03, 0.06)
_SYMBOLS = frozenset({"+", "-", "="})
_TRAILING = ".,:;?!\"'"


def text_prefix(text: str, num_words: int) -> str:
    """The first `num_words` words of `text`, without the marks that close it ("Reverse the word")."""
    return " ".join(text.split()[:num_words]).rstrip(_TRAILING)


def cut_points(text: str) -> list[int]:
    """Word counts a clip may be cut after: at least one word, not all, never after a bare symbol."""
    words = text.split()
    return [k for k in range(1, len(words)) if words[k - 1] not in _SYMBOLS and text_prefix(text, k)]


def make_prefix_shard(seed: int, split: str, index: int, max_samples: int, size: int = dataset.SHARD_SIZE
                      ) -> dataset.Clips:
    """`size` training questions, each cut after a random word; deterministic from (seed, index)."""
    rng = random.Random(f"rill-tiny-speech/{seed}/{SPLIT}/{index}")
    pieces, texts, families, voice_names = [], [], [], []
    while len(texts) < size:
        family = transcripts.sample_family(rng)
        utterance = transcripts.make_utterance(rng, family, splits.TRAIN)
        points = cut_points(utterance.text)
        if not points:
            continue
        prefix = text_prefix(utterance.text, rng.choice(points))
        voice = voices.sample_voice(rng, splits.TRAIN)
        whole = synth.synthesize(utterance.spoken, voice)
        head = synth.synthesize(transcripts.spoken_form(prefix), voice)
        if not (0 < len(whole) <= max_samples) or len(head) == 0:
            continue
        cut = len(head) + int(rng.uniform(*JITTER_S) * synth.SAMPLE_RATE)
        pieces.append(synth.to_pcm16(whole[: max(1, min(cut, len(whole)))]))
        texts.append(prefix)
        families.append(family)
        voice_names.append(dataset.describe(voice))
    offsets = np.cumsum([0, *map(len, pieces)]).astype(np.int64)
    return dataset.Clips(np.concatenate(pieces), offsets, texts, families, voice_names)


def build(seed: int, num_clips: int, max_samples: int, **kwargs) -> dataset.Clips:
    """The first `num_clips` prefix clips of `seed`, from the cache or synthesised in parallel."""
    return dataset.build(seed, SPLIT, num_clips, max_samples, maker=make_prefix_shard,
                         desc="synthesize prefixes", **kwargs)
