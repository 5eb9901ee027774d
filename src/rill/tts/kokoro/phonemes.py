"""Text -> phoneme strings in Kokoro's alphabet, and long strings cut to what one forward pass takes.

espeak-ng's IPA (from rill.tts.libespeak, diphthongs and affricates joined with "^" ties or not)
becomes Kokoro's alphabet as Kokoro's own espeak fallback rewrites it (misaki's `EspeakFallback`
for English, `EspeakG2P` for the other languages): a diphthong or affricate is one letter
(eɪ -> A, aɪ -> I, oʊ -> O, aʊ -> W, ɔɪ -> Y, dʒ -> ʤ, tʃ -> ʧ), American English drops length
marks and flaps t (ɾ -> T), and anything still outside the alphabet is dropped by the model.

Long input: KPipeline cuts its phonemes before they pass 510 (ALBERT's 512 positions less the two
boundary tokens), at the last sentence end (!.?…) that fits, else the last colon or semicolon, else
the last comma or dash, keeping a closing bracket or quote with what it closes. rill's text
arrives already cut into clauses (rill.tts.clauses); `split_phonemes` applies the same waterfall to
a clause's phonemes, then a space, then a hard cut, so no clause is ever truncated.
"""

from __future__ import annotations

import re

MAX_PHONEMES = 510
WATERFALL = ("!.?…", ":;", ",—")
CLOSERS = ")”"
# punctuation Kokoro reads (it shapes pauses and pitch) but espeak-ng's phonemes leave out: a mark that
# ends a word (so 3.5 stays a number) or a dash
PUNCTUATION = re.compile(r"((?:[;:,.!?…]+(?=\s|$))|—)")
LANGUAGE_FLAG = re.compile(r"\([a-z-]+\)")  # espeak-ng's "(en)" where a word switches language

# espeak-ng IPA -> Kokoro, longest first (the order matters: "e^ɪ" before "e")
ENGLISH_MAP = (
    ("ʔˌn\u0329", "ʔn"), ("ʔn\u0329", "ʔn"), ("a^ɪ", "I"), ("a^ʊ", "W"), ("d^ʒ", "ʤ"), ("e^ɪ", "A"),
    ("t^ʃ", "ʧ"), ("ɔ^ɪ", "Y"), ("ə^l", "ᵊl"), ("ʲo", "jo"), ("ʲə", "jə"), ("aɪ", "I"), ("aʊ", "W"),
    ("dʒ", "ʤ"), ("eɪ", "A"), ("tʃ", "ʧ"), ("ɔɪ", "Y"), ("ʲ", ""), ("ɚ", "əɹ"), ("e", "A"), ("r", "ɹ"),
    ("x", "k"), ("ç", "k"), ("ɐ", "ə"), ("ɬ", "l"), ("\u0303", ""),
)
AMERICAN_MAP = (("o^ʊ", "O"), ("oʊ", "O"), ("ɜːɹ", "ɜɹ"), ("ɜː", "ɜɹ"), ("ɪə", "iə"), ("ː", ""))
BRITISH_MAP = (("e^ə", "ɛː"), ("iə", "ɪə"), ("ə^ʊ", "Q"), ("əʊ", "Q"))
OTHER_MAP = (
    ("a^ɪ", "I"), ("a^ʊ", "W"), ("d^z", "ʣ"), ("d^ʒ", "ʤ"), ("e^ɪ", "A"), ("o^ʊ", "O"), ("ə^ʊ", "Q"),
    ("s^s", "S"), ("t^s", "ʦ"), ("t^ʃ", "ʧ"), ("ɔ^ɪ", "Y"),
)


def replace_all(text: str, table) -> str:
    for old, new in table:
        text = text.replace(old, new)
    return text


def phonemize_for_kokoro(text: str, language: str, phonemize) -> str:
    """Text -> Kokoro's phonemes, with its punctuation kept: `phonemize(text, language)` (libespeak's)
    runs on the stretches between marks, and each mark follows its stretch's phonemes, as the
    phonemizer Kokoro's pipeline uses restores them (preserve_punctuation)."""
    parts = PUNCTUATION.split(text)
    out = []
    for k in range(0, len(parts), 2):
        stretch, mark = parts[k].strip(), parts[k + 1] if k + 1 < len(parts) else ""
        ps = espeak_to_kokoro(phonemize(stretch, language), language) if stretch else ""
        if ps or mark:
            out.append(ps + mark)
    return " ".join(out)


def espeak_to_kokoro(ipa: str, language: str) -> str:
    """espeak-ng IPA for `language` ("en-us", "en-gb", "es", ...) in Kokoro's alphabet."""
    ipa = LANGUAGE_FLAG.sub("", ipa)
    if not language.startswith("en"):
        return replace_all(ipa, OTHER_MAP).replace("^", "").strip()
    british = language == "en-gb"
    if british:  # before ENGLISH_MAP turns the e of e^ə into A
        ipa = replace_all(ipa, BRITISH_MAP[:1])
    ps = replace_all(ipa, ENGLISH_MAP)
    ps = re.sub(r"(\S)\u0329", r"ᵊ\1", ps).replace("\u0329", "")  # a syllabic consonant: schwa first
    ps = replace_all(ps, BRITISH_MAP[1:] if british else AMERICAN_MAP)
    ps = ps.replace("o", "ɔ")  # espeak-ng before 1.52 wrote o for ɔ
    if not british:
        ps = ps.replace("ɾ", "T").replace("ʔ", "t")
    return ps.replace("^", "").strip()


def split_phonemes(ps: str, limit: int = MAX_PHONEMES) -> list[str]:
    """ps cut into pieces of at most `limit` characters, at the best boundary each time."""
    pieces = []
    ps = ps.strip()
    while len(ps) > limit:
        cut = best_cut(ps, limit)
        pieces.append(ps[:cut].strip())
        ps = ps[cut:].strip()
    return [p for p in [*pieces, ps] if p]


def best_cut(ps: str, limit: int) -> int:
    """Where to end the first piece: after the last boundary of the strongest class within `limit`."""
    head = ps[:limit]
    for marks in WATERFALL:
        at = max(head.rfind(mark) for mark in marks)
        if at > 0:
            end = at + 1
            if end < len(head) and head[end] in CLOSERS:
                end += 1
            return end
    space = head.rfind(" ")
    return space if space > 0 else limit
