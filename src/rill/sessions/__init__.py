"""Streaming input: sessions whose prompt arrives in chunks (DESIGN.md, "sessions").

Sans-IO rules (chunks, order, limits, lifecycle, NDJSON framing, incremental tokenizing) and
the SessionManager that keeps sessions and reaps idle ones on trio. Transports and the OpenAI
serving logic build on it: rill.openai.streaming, rill.transports.streaming_input.
"""

from rill.sessions.chunks import InputChunk, Modality
from rill.sessions.config import OutputMode, SessionOptions, StartPolicy, StreamingInputConfig, parse_start_policy
from rill.sessions.errors import (
    ChunkConflict, PayloadTooLarge, SessionError, SessionGone, SessionNotFound, TooManySessions, UnsupportedModality,
)
from rill.sessions.manager import SessionManager
from rill.sessions.session import StreamingSession
from rill.sessions.state import CloseReason, SessionState

__all__ = [
    "ChunkConflict", "CloseReason", "InputChunk", "Modality", "OutputMode", "PayloadTooLarge", "SessionError",
    "SessionGone", "SessionManager", "SessionNotFound", "SessionOptions", "SessionState", "StartPolicy",
    "StreamingInputConfig", "StreamingSession", "TooManySessions", "UnsupportedModality", "parse_start_policy",
]
