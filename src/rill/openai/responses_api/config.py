"""Limits of the Responses API's stored responses and background runs.

`rill serve` fills ResponsesConfig from flags, whose defaults come from RILL_* variables (see rill.cli).
Everything is held in this process's memory, so every limit is finite.
"""

from __future__ import annotations

import os

import msgspec

DEFAULT_MAX_STORED = 1024
DEFAULT_MAX_AGE_S = 3600.0
DEFAULT_MAX_BACKGROUND = 64
DEFAULT_MAX_EVENTS_PER_RESPONSE = 65536


class ResponsesConfig(msgspec.Struct, kw_only=True):
    """Finished responses kept: at most `max_stored`, each for `max_age_s` after it finished (the
    oldest go first). Runs in flight are never evicted; at most `max_background` run at once."""

    max_stored: int = DEFAULT_MAX_STORED
    max_age_s: float = DEFAULT_MAX_AGE_S
    max_background: int = DEFAULT_MAX_BACKGROUND
    # A background run's event log keeps its newest events up to this many (one per output token at
    # most, plus a few per output item); resuming from before them is a 400.
    max_events_per_response: int = DEFAULT_MAX_EVENTS_PER_RESPONSE

    @classmethod
    def from_env(cls) -> ResponsesConfig:
        env = os.environ.get
        return cls(
            max_stored=int(env("RILL_RESPONSES_MAX_STORED", DEFAULT_MAX_STORED)),
            max_age_s=float(env("RILL_RESPONSES_MAX_AGE_S", DEFAULT_MAX_AGE_S)),
            max_background=int(env("RILL_RESPONSES_MAX_BACKGROUND", DEFAULT_MAX_BACKGROUND)),
        )


def add_arguments(parser) -> None:
    env = ResponsesConfig.from_env()
    g = parser.add_argument_group("Responses API (/v1/responses: stored responses, background runs)")
    g.add_argument("--responses-max-stored", type=int, default=env.max_stored,
                   help="finished responses kept for GET and previous_response_id; the oldest go first "
                        "(default %(default)s)")
    g.add_argument("--responses-max-age-s", type=float, default=env.max_age_s,
                   help="seconds a finished response is kept (default %(default)s)")
    g.add_argument("--responses-max-background", type=int, default=env.max_background,
                   help="background responses running at once; past it POST /v1/responses is a 429 "
                        "(default %(default)s)")


def from_args(args) -> ResponsesConfig:
    return ResponsesConfig(max_stored=args.responses_max_stored, max_age_s=args.responses_max_age_s,
                           max_background=args.responses_max_background)
