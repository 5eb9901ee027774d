"""What can go wrong with a streaming-input session, each with the HTTP status the issue gives it.

The statuses live here, beside the rules that raise them, so every transport maps them alike
(rill.openai.streaming turns them into OpenAI error bodies)."""

from __future__ import annotations

from rill.errors import RillError


class SessionError(RillError):
    status = 400
    code = "invalid_value"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class UnsupportedModality(SessionError):
    code = "unsupported_modality"


class SessionNotFound(SessionError):
    status = 404
    code = "session_not_found"


class ChunkConflict(SessionError):
    """Out of order past the window, a sequence id reused with another payload, input after its end."""

    status = 409
    code = "chunk_conflict"


class SessionGone(SessionError):
    """Expired or deleted: the id is remembered, its session is not."""

    status = 410
    code = "session_gone"


class PayloadTooLarge(SessionError):
    status = 413
    code = "payload_too_large"


class TooManySessions(SessionError):
    status = 429
    code = "too_many_sessions"
