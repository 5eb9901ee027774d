"""Streaming-input settings: server-wide limits, and the per-session choices a client may make.

`rill serve` fills StreamingInputConfig from flags and RILL_* variables (see rill.cli)."""

from __future__ import annotations

import enum
import os

import msgspec

from rill.sessions.errors import SessionError

DEFAULT_SESSION_TIMEOUT_S = 300.0
DEFAULT_MAX_PAYLOAD_BYTES = 8 << 20
DEFAULT_MAX_CHUNK_BYTES = 256 << 10
DEFAULT_MAX_OPEN_SESSIONS = 1024
DEFAULT_MAX_PENDING_CHUNKS = 64


class OutputMode(str, enum.Enum):
    RESPOND_AT_END = "respond_at_end"  # prefill as input arrives, answer after its end
    RESPOND_PER_CHUNK = "respond_per_chunk"  # answer each chunk until more input arrives


class StartKind(str, enum.Enum):
    ON_FIRST_CHUNK = "on_first_chunk"
    ON_MIN_LENGTH = "on_min_length"
    ON_END_ONLY = "on_end_only"


class StartPolicy(msgspec.Struct, frozen=True):
    """When prefill starts: with the first input token, once N input tokens arrived, or at the end."""

    kind: StartKind = StartKind.ON_FIRST_CHUNK
    min_tokens: int = 1

    def __str__(self) -> str:
        return f"on_min_length:{self.min_tokens}" if self.kind is StartKind.ON_MIN_LENGTH else self.kind.value

    def start_after_tokens(self, num_prefix_tokens: int) -> int | None:
        """The engine's threshold, counting the prompt tokens that come before the input."""
        if self.kind is StartKind.ON_END_ONLY:
            return None
        return num_prefix_tokens + (self.min_tokens if self.kind is StartKind.ON_MIN_LENGTH else 1)


def parse_start_policy(text: str) -> StartPolicy:
    """`on_first_chunk`, `on_end_only` or `on_min_length:N` (N >= 1 input tokens)."""
    name, _, number = text.partition(":")
    try:
        kind = StartKind(name)
    except ValueError:
        kind = None
    if kind is StartKind.ON_MIN_LENGTH and number.isdigit() and int(number) >= 1:
        return StartPolicy(kind, int(number))
    if kind is not None and kind is not StartKind.ON_MIN_LENGTH and not number:
        return StartPolicy(kind)
    raise SessionError(f"start_policy {text!r} is not one of on_first_chunk, on_min_length:N (N >= 1), "
                       "on_end_only", param="streaming_input.start_policy")


class StreamingInputConfig(msgspec.Struct, kw_only=True):
    """Server-wide streaming-input settings (`None` limits mean no limit)."""

    enabled: bool = True
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S
    max_payload_bytes_per_session: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    max_open_sessions: int = DEFAULT_MAX_OPEN_SESSIONS
    max_open_sessions_per_key: int | None = None
    max_pending_chunks: int = DEFAULT_MAX_PENDING_CHUNKS
    start_policy: StartPolicy = StartPolicy()
    output_mode: OutputMode = OutputMode.RESPOND_AT_END

    @classmethod
    def from_env(cls) -> StreamingInputConfig:
        env = os.environ.get
        per_key = env("RILL_MAX_OPEN_SESSIONS_PER_KEY")
        return cls(
            enabled=env("RILL_STREAMING_INPUT", "1").lower() not in ("0", "false", "no", "off"),
            session_timeout_s=float(env("RILL_SESSION_TIMEOUT_SEC", DEFAULT_SESSION_TIMEOUT_S)),
            max_payload_bytes_per_session=int(env("RILL_MAX_PAYLOAD_PER_SESSION", DEFAULT_MAX_PAYLOAD_BYTES)),
            max_chunk_bytes=int(env("RILL_MAX_CHUNK_BYTES", DEFAULT_MAX_CHUNK_BYTES)),
            max_open_sessions=int(env("RILL_MAX_OPEN_SESSIONS", DEFAULT_MAX_OPEN_SESSIONS)),
            max_open_sessions_per_key=int(per_key) if per_key else None,
            max_pending_chunks=int(env("RILL_MAX_PENDING_CHUNKS", DEFAULT_MAX_PENDING_CHUNKS)),
            start_policy=parse_start_policy(env("RILL_START_POLICY", "on_first_chunk")),
            output_mode=OutputMode(env("RILL_OUTPUT_MODE", OutputMode.RESPOND_AT_END.value)),
        )


class SessionOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A request's `streaming_input` object: its own choices over the server's defaults."""

    api: str = "chat"  # Mode B: "chat" (/v1/chat/completions fields) or "completions"
    start_policy: str | None = None
    output_mode: OutputMode | None = None

    def resolve(self, config: StreamingInputConfig) -> tuple[StartPolicy, OutputMode]:
        policy = config.start_policy if self.start_policy is None else parse_start_policy(self.start_policy)
        return policy, self.output_mode or config.output_mode


# -- `rill serve` flags (their defaults come from the RILL_* variables above) -----------------------------


def add_arguments(parser) -> None:
    env = StreamingInputConfig.from_env()
    g = parser.add_argument_group("streaming input (Mode A NDJSON requests, Mode B /v1/streaming_input/sessions)")
    g.add_argument("--no-streaming-input", dest="streaming_input", action="store_false", default=env.enabled,
                   help="turn both modes off (RILL_STREAMING_INPUT=0)")
    g.add_argument("--session-timeout-sec", type=float, default=env.session_timeout_s,
                   help="close a session idle this long (default %(default)s)")
    g.add_argument("--max-payload-per-session", type=int, default=env.max_payload_bytes_per_session,
                   help="input bytes one session may send; past it 413 and the session closes")
    g.add_argument("--max-chunk-bytes", type=int, default=env.max_chunk_bytes, help="payload bytes per chunk")
    g.add_argument("--max-open-sessions", type=int, default=env.max_open_sessions, help="open sessions in all")
    g.add_argument("--max-open-sessions-per-key", type=int, default=env.max_open_sessions_per_key,
                   help="open sessions per API key (default: no limit)")
    g.add_argument("--max-pending-chunks", type=int, default=env.max_pending_chunks,
                   help="how far ahead of the next expected sequence_id a chunk may arrive")
    g.add_argument("--start-policy", type=_policy_arg, default=env.start_policy,
                   help="on_first_chunk | on_min_length:N | on_end_only (default %(default)s)")
    g.add_argument("--output-mode", choices=[m.value for m in OutputMode], default=env.output_mode.value,
                   help="answer at end of input, or after every chunk (default %(default)s)")


def from_args(args) -> StreamingInputConfig:
    return StreamingInputConfig(
        enabled=args.streaming_input, session_timeout_s=args.session_timeout_sec,
        max_payload_bytes_per_session=args.max_payload_per_session, max_chunk_bytes=args.max_chunk_bytes,
        max_open_sessions=args.max_open_sessions, max_open_sessions_per_key=args.max_open_sessions_per_key,
        max_pending_chunks=args.max_pending_chunks, start_policy=args.start_policy,
        output_mode=OutputMode(args.output_mode),
    )


def _policy_arg(text: str) -> StartPolicy:
    import argparse

    try:
        return parse_start_policy(text)
    except SessionError as exc:
        raise argparse.ArgumentTypeError(exc.message) from exc
