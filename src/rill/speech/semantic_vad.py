"""semantic_vad: a turn ends when the words sound finished, not only after a fixed silence.

OpenAI's `turn_detection: {"type": "semantic_vad", "eagerness": ...}` leaves the how open and fixes
the longest wait: low 8 s, medium 4 s, high 2 s of silence, auto as medium. rill reads the words
with the chat model that answers them (as LiveKit's turn detector does with a model trained for
it): the user's transcript so far is already prefilled into it (the anchor session), and the chance
that the user has finished is the model's probability of the chat template's end-of-user-turn
token (`<|im_end|>` in ChatML) right after those words.

The policy, per pause in the user's speech:
- at `CHECK_PAUSE_MS` of silence the segment's words are final; their end-of-turn probability is
  asked of the engine (a one-token request on the worker, never a model on the trio thread);
- at or above the eagerness's `FINISHED_AT` the turn ends there ("What is 12 plus 30?");
- below it the turn waits for more words, up to the eagerness's cap of silence ("What is 12 plus");
  speech before then continues the same turn (and the same recognition segment, so the words after
  the pause are heard with those before them).
Without an answer (the scorer failed or the prompt does not fit) the cap ends the turn, as server_vad
with that silence would. rill.speech.live applies it; the VAD under it is server_vad's (rill.speech.vad).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

EAGERNESS = ("low", "medium", "high", "auto")
# OpenAI's published caps: the most silence each eagerness waits before the turn ends anyway.
MAX_WAIT_MS = {"low": 8_000, "medium": 4_000, "high": 2_000}
# The end-of-turn probability at which a pause ends the turn: a lower bar answers sooner and cuts
# a slow speaker off more often. Fixed before `rill bench turn-detection` was run.
FINISHED_AT = {"low": 0.7, "medium": 0.5, "high": 0.3}
# Silence after the last speech frame at which the words are read. It is also the segment pause
# of live recognition, so the segment's last words are final by then (rill.speech.live).
CHECK_PAUSE_MS = 200

# text of the user's turn so far -> the chat model's P(end of turn) after it, or None (no answer)
TurnEndScorer = Callable[[str], Awaitable[float | None]]


def level(eagerness: str) -> str:
    """auto is medium (OpenAI's rule)."""
    return "medium" if eagerness == "auto" else eagerness


def check_eagerness(eagerness: str) -> None:
    if eagerness not in EAGERNESS:
        raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS)}, got {eagerness!r}")


def max_wait_ms(eagerness: str) -> int:
    return MAX_WAIT_MS[level(eagerness)]


def ends_turn(eagerness: str, probability: float | None) -> bool:
    """Whether a pause with this end-of-turn probability ends the turn now."""
    return probability is not None and probability >= FINISHED_AT[level(eagerness)]
