"""A streaming session's lifecycle: an enum and its transition table (STYLE.md principle 5).

    OPEN --start--> STARTED --finish--> FINISHED --close--> CLOSED
      `----------------finish----------^   any but CLOSED --close--^

OPEN: input arrives, prefill has not begun (the start policy is not met). STARTED: the engine
prefills input as it arrives. FINISHED: end of input; the answer is being generated. CLOSED:
done, for the reason in CloseReason.
"""

from __future__ import annotations

import enum

from rill.errors import RillError


class SessionState(str, enum.Enum):
    OPEN = "open"
    STARTED = "started"
    FINISHED = "finished"
    CLOSED = "closed"


class SessionEvent(enum.Enum):
    START = "start"
    FINISH = "finish"
    CLOSE = "close"


class CloseReason(str, enum.Enum):
    COMPLETED = "completed"  # the answer ended on its own
    FAILED = "failed"  # the answer ended with an error
    PAYLOAD_TOO_LARGE = "payload_too_large"  # max_payload_bytes_per_session exceeded
    DELETED = "deleted"  # the client aborted it
    EXPIRED = "expired"  # idle past the session timeout
    CLIENT_GONE = "client_gone"  # Mode A: the connection dropped mid-upload
    SHUTDOWN = "shutdown"  # the server stopped


# Closed sessions whose output stays readable (events, result) until they expire.
RETAINED = frozenset({CloseReason.COMPLETED, CloseReason.FAILED, CloseReason.PAYLOAD_TOO_LARGE})

TRANSITIONS: dict[tuple[SessionState, SessionEvent], SessionState] = {
    (SessionState.OPEN, SessionEvent.START): SessionState.STARTED,
    (SessionState.OPEN, SessionEvent.FINISH): SessionState.FINISHED,
    (SessionState.STARTED, SessionEvent.FINISH): SessionState.FINISHED,
    (SessionState.OPEN, SessionEvent.CLOSE): SessionState.CLOSED,
    (SessionState.STARTED, SessionEvent.CLOSE): SessionState.CLOSED,
    (SessionState.FINISHED, SessionEvent.CLOSE): SessionState.CLOSED,
}


class InvalidTransition(RillError):
    """rill broke its own lifecycle (a bug, not a client error)."""


def next_state(state: SessionState, event: SessionEvent) -> SessionState:
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise InvalidTransition(f"no transition from {state.value} on {event.value}") from None
