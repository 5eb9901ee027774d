"""What rill-tiny-speech hears: spoken questions in rill-tiny's own phrasing, and how each is said.

A transcript is a user question exactly as rill-tiny reads it ("What is 347 + 58?", "Reverse the
word: stream", "What time is it in Europe/Paris?"), taken from rill.tiny.tasks' phrasings. Its
spoken form is what espeak-ng is given: the same text with the symbols a person would say as
words ("plus", "minus", "equals"); espeak-ng reads the digits aloud itself.

Held out of training, as for rill-tiny (rill.tiny.splits): number pairs, rill-tiny's held-out
words, cities and zones. Training words come from rill-tiny's training words, the system word
list (/usr/share/dict/words, Debian's wamerican) less every held-out word, and invented words, so
the model learns to spell what it hears rather than to recall a closed list.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rill.tiny import splits, tasks

# An evaluation split beside splits.EVAL: the same families in held-out voices, but with the number pairs,
# rill-tiny's words, the real cities and the zones that training uses: what a user asking about them gets.
HEARD = "heard"
FAMILIES = ("add", "sub", "reverse", "uppercase", "count", "weather", "time", "about")
# Share of each family among training utterances: the word and place families carry the spelling.
TRAIN_WEIGHTS = {"add": 1.0, "sub": 1.0, "reverse": 1.5, "uppercase": 1.5, "count": 1.5, "weather": 1.5, "time": 1.5, "about": 0.3}
WORD_LIST = Path("/usr/share/dict/words")
_SPOKEN_SYMBOLS = ((re.compile(r"\s*\+\s*"), " plus "), (re.compile(r"(?<=\d)\s*-\s*(?=\d)"), " minus "),
                   (re.compile(r"\s*=\s*"), " equals "), (re.compile(r'"'), ""), (re.compile(r"_"), " "))


@dataclass(frozen=True)
class Utterance:
    family: str
    text: str  # the transcript, as rill-tiny reads it
    key: tuple  # what it is about, e.g. ("add", 347, 58) or ("word", "stream"), for split checks

    @property
    def spoken(self) -> str:
        return spoken_form(self.text)


def spoken_form(text: str) -> str:
    """What espeak-ng says for `text`: it reads "-" as "dash" or not at all, "+" as "plus" only
    between digits, and "=" not at all, so those become words; quotes and "_" are silent."""
    for pattern, words in _SPOKEN_SYMBOLS:
        text = pattern.sub(words, text)
    return re.sub(r"\s+", " ", text).strip()


@cache
def held_out_names() -> frozenset[str]:
    """Lower-cased held-out words and place names: never in a training transcript."""
    places = {p.lower() for c in splits.eval_cities() for p in c.split()}
    zones = {p.lower() for z in splits.eval_zones() for p in re.split(r"[/_]", z)} - {r.lower() for r in splits._REGIONS}
    return frozenset(splits.eval_words() | places | zones)


@cache
def dictionary_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(lower-case words, capitalised names) from the system word list, held-out names removed;
    empty when the list is missing (the recipe then relies on rill-tiny's words and invented ones)."""
    if not WORD_LIST.exists():
        return (), ()
    held = held_out_names()
    words = [w for w in WORD_LIST.read_text(encoding="utf-8", errors="ignore").split() if w.isascii() and w.isalpha()]
    keep = [w for w in words if w.lower() not in held and w.lower()[::-1] not in held]
    lower = sorted({w for w in keep if w.islower() and 3 <= len(w) <= 10})
    names = sorted({w for w in keep if w[0].isupper() and w[1:].islower() and 3 <= len(w) <= 10})
    return tuple(lower), tuple(names)


def _is_clean(word: str) -> bool:
    low = word.lower()
    return all(p not in held_out_names() for p in (low, low[::-1]))


def _invented_word(rng: random.Random) -> str:
    while True:
        word = splits._invented_word(rng).lower()
        if _is_clean(word):
            return word


def sample_word(rng: random.Random, split: str) -> str:
    """A lower-case word for reverse / uppercase / count (spoken, so no random letter strings)."""
    if split == splits.EVAL:
        return splits.sample_word(rng, split)
    if split == HEARD:
        return rng.choice(_heard_words())
    lower, _ = dictionary_words()
    roll = rng.random()
    if roll < 0.3 or not lower:
        word = rng.choice(splits.train_words()) if roll < 0.2 else _invented_word(rng)
    else:
        word = rng.choice(lower)
    return word if _is_clean(word) else sample_word(rng, split)


def sample_place(rng: random.Random, split: str) -> str:
    """A city: rill-tiny's (held-out ones for eval), invented ones, or a name from the word list.
    Training never names a city whose zone is held out either ("Berlin" of Europe/Berlin)."""
    if split == HEARD:
        return rng.choice(_heard_places(splits.cities(splits.TRAIN)))
    _, names = dictionary_words()
    while True:
        if split == splits.TRAIN and names and rng.random() < 0.3:
            return rng.choice(names)
        city = splits.sample_city(rng, split)
        if split == splits.EVAL or _names_are_clean(city):
            return city


def sample_zone(rng: random.Random, split: str) -> str:
    if split == HEARD:
        return rng.choice(_heard_places(splits.zones(splits.TRAIN)))
    _, names = dictionary_words()
    while True:
        if split == splits.TRAIN and names and rng.random() < 0.3:
            return f"{rng.choice(splits._REGIONS)}/{rng.choice(names)}"
        zone = splits.sample_zone(rng, split)
        if split == splits.EVAL or _names_are_clean(zone):
            return zone


@cache
def _heard_words() -> tuple[str, ...]:
    return tuple(w for w in splits.train_words() if _is_clean(w))


@cache
def _heard_places(places: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p for p in places if _names_are_clean(p))


def _names_are_clean(place: str) -> bool:
    return all(_is_clean(n) for n in re.split(r"[\s/_]", place) if n)


def make_utterance(rng: random.Random, family: str, split: str) -> Utterance:
    template = rng.choice(tasks.PHRASINGS.get(family, ("",)))
    if family in ("add", "sub"):
        a, b = splits.sample_pair(rng, splits.TRAIN if split == HEARD else split, ordered=family == "sub")
        return Utterance(family, template.format(a=a, b=b), (family, a, b))
    if family == "uppercase":
        words = [sample_word(rng, split) for _ in range(rng.choice((1, 1, 2, 2, 3)))]
        return Utterance(family, template.format(w=" ".join(words)), ("words", *words))
    if family in ("reverse", "count"):
        word = sample_word(rng, split)
        return Utterance(family, template.format(w=word), ("word", word))
    if family == "weather":
        city = sample_place(rng, split)
        return Utterance(family, template.format(c=city), ("city", city))
    if family == "time":
        zone = sample_zone(rng, split)
        return Utterance(family, template.format(z=zone), ("zone", zone))
    questions, _ = rng.choice(tasks.ABOUT)
    return Utterance("about", rng.choice(questions), ("about",))


def sample_family(rng: random.Random) -> str:
    return rng.choices(FAMILIES, weights=[TRAIN_WEIGHTS[f] for f in FAMILIES])[0]


def is_held_out(utterance: Utterance) -> bool:
    """True when the utterance names any held-out pair, word, city or zone."""
    kind, *values = utterance.key
    if kind in ("add", "sub"):
        return splits.is_eval_pair(*values)
    return not all(_names_are_clean(v) for v in values)
