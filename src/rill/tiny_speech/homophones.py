"""Which transcripts sound the same: the part of the held-out score that hearing cannot decide.

rill-tiny-speech hears espeak-ng, which turns spelling into phonemes by rule and exception list.
Two spellings that espeak-ng says with the same phonemes ("knight" and "night", "pear" and "pair")
give the same audio, so a model that never read the held-out one cannot know which was meant. The
evaluation reports, beside exact transcripts, those that differ only in such a spelling (same
phonemes), and `held_out_homophones` lists the held-out words that have a training homophone: the
floor of what the word families can score however well the model hears.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path

from rill.tiny import splits
from rill.tiny_speech import dataset, synth, transcripts

VOICE = "en-us"
TIMEOUT_S = 900  # the whole training word list (about 60,000 words) takes a minute on an idle core


def phonemes(texts: list[str]) -> list[str] | None:
    """espeak-ng's phoneme mnemonics for each text (one call for all); None without espeak-ng."""
    if not synth.espeak_available() or not texts:
        return None if texts else []
    lines = "\n".join(_sayable(t) + "." for t in texts)
    done = subprocess.run([synth.ESPEAK, "-q", "-x", "-v", VOICE, "--stdin"], input=lines, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    out = [" ".join(line.split()) for line in done.stdout.splitlines() if line.strip()]
    if len(out) != len(texts):  # espeak-ng joined or split a clause: ask one text at a time
        out = [_one(t) for t in texts]
    return out


def _one(text: str) -> str:
    done = subprocess.run([synth.ESPEAK, "-q", "-x", "-v", VOICE, _sayable(text) + "."], capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    return " ".join(done.stdout.split())


def _sayable(text: str) -> str:
    """The text as the recipe speaks it, without marks that end a clause inside it."""
    return re.sub(r"[.?!:;]", " ", transcripts.spoken_form(text))


def same_sound(pairs: list[tuple[str, str]]) -> list[bool] | None:
    """For each (expected, got): do the two texts sound the same to espeak-ng? None without espeak-ng."""
    said = phonemes([t for pair in pairs for t in pair])
    if said is None:
        return None
    return [said[2 * i] == said[2 * i + 1] for i in range(len(pairs))]


@cache
def held_out_homophones(cache_root: Path = dataset.DEFAULT_CACHE) -> dict[str, list[str]]:
    """Held-out words that espeak-ng says exactly like some training word: {word: [training spellings]},
    kept on disk beside the clips (keyed like them by the word list)."""
    path = dataset.cache_dir(cache_root, 0, "homophones", 0).parent / "held-out-homophones.json"
    if path.exists():
        return json.loads(path.read_text())
    found = _find_held_out_homophones()
    if found:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    return found


def _find_held_out_homophones() -> dict[str, list[str]]:
    lower, _ = transcripts.dictionary_words()
    training = sorted(set(lower) | {w.lower() for w in splits.train_words()})
    held = sorted(splits.eval_words())
    said_training, said_held = phonemes(training), phonemes(held)
    if said_training is None or said_held is None:
        return {}
    by_sound: dict[str, list[str]] = {}
    for word, sound in zip(training, said_training):
        by_sound.setdefault(sound, []).append(word)
    return {w: by_sound[s] for w, s in zip(held, said_held) if s in by_sound}
