"""espeak-ng voices for rill-tiny-speech: accent x variant x rate x pitch x amplitude x word gap.

Held out of training: one (accent, variant, rate band) combination in five, chosen by a stable
hash, so the evaluation hears voice/rate combinations the model never heard.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from rill.tiny import splits

ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029", "en-us-nyc")
# espeak-ng's voice variants (espeak-ng-data/voices/!v) that still sound like speech: no robots,
# whispers or croaks.
VARIANTS = (
    "", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5", "klatt", "klatt2", "klatt3",
    "klatt4", "adam", "Alex", "Andy", "Annie", "aunty", "belinda", "benjamin", "boris", "caleb", "david", "ed",
    "edward", "grandma", "grandpa", "iven", "john", "linda", "max", "michel", "Mike", "norbert", "paul", "quincy",
    "rob", "robert", "sandro", "shelby", "steph", "travis", "victor", "zac", "Jacky", "Lee", "Hugo", "Marco",
)
RATE_WPM = (120, 230)  # espeak-ng -s
RATE_BAND_WPM = 20
PITCH = (15, 85)  # -p, 0-99
AMPLITUDE = (60, 180)  # -a, default 100
WORD_GAP = (0, 0, 0, 1, 2)  # -g, in units of 10 ms


@dataclass(frozen=True)
class Voice:
    accent: str
    variant: str
    rate_wpm: int
    pitch: int
    amplitude: int
    word_gap: int

    @property
    def name(self) -> str:
        return f"{self.accent}+{self.variant}" if self.variant else self.accent

    def args(self) -> list[str]:
        """espeak-ng's command-line options for this voice."""
        return ["-v", self.name, "-s", str(self.rate_wpm), "-p", str(self.pitch), "-a", str(self.amplitude),
                "-g", str(self.word_gap)]

    @property
    def combination(self) -> tuple[str, str, int]:
        return self.accent, self.variant, self.rate_wpm // RATE_BAND_WPM


def is_eval_combination(combination: tuple[str, str, int]) -> bool:
    return zlib.crc32(repr(combination).encode()) % 5 == 0


def sample_voice(rng: random.Random, split: str) -> Voice:
    while True:
        voice = Voice(rng.choice(ACCENTS), rng.choice(VARIANTS), rng.randint(*RATE_WPM), rng.randint(*PITCH),
                      rng.randint(*AMPLITUDE), rng.choice(WORD_GAP))
        if is_eval_combination(voice.combination) == (split == splits.EVAL):
            return voice
