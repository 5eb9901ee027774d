"""A realtime connection's lifecycle: its states and the moves between them, as a table
(`RealtimeConnection._move` is the only writer of its state; a move the table lacks is a bug).

    IDLE --OPEN_INPUT--> STREAMING --COMMIT_INPUT--> COMMITTED --START_RESPONSE--> RESPONDING
    STREAMING <--START_ANSWER / END_ANSWER--> ANSWERING          (respond_per_chunk answers)
    IDLE / STREAMING / COMMITTED --START_RESPONSE--> RESPONDING --END_RESPONSE--> IDLE
    STREAMING / COMMITTED --DROP_INPUT--> IDLE                   (abort the input's engine session)
"""

from __future__ import annotations

import enum


class State(enum.Enum):
    IDLE = "idle"
    STREAMING = "streaming"  # streamed text fills an open engine session
    ANSWERING = "answering"  # respond_per_chunk: the session answers the latest chunk
    COMMITTED = "committed"  # respond_at_end: the message is whole and prefilled; waits for response.create
    RESPONDING = "responding"  # an in-band response generates


class Move(enum.Enum):
    OPEN_INPUT = "open_input"
    COMMIT_INPUT = "commit_input"
    DROP_INPUT = "drop_input"
    START_ANSWER = "start_answer"
    END_ANSWER = "end_answer"
    START_RESPONSE = "start_response"
    END_RESPONSE = "end_response"


S, M = State, Move
TRANSITIONS: dict[tuple[State, Move], State] = {
    (S.IDLE, M.OPEN_INPUT): S.STREAMING,
    (S.STREAMING, M.COMMIT_INPUT): S.COMMITTED,
    (S.STREAMING, M.START_ANSWER): S.ANSWERING,
    (S.ANSWERING, M.END_ANSWER): S.STREAMING,
    (S.STREAMING, M.DROP_INPUT): S.IDLE,
    (S.COMMITTED, M.DROP_INPUT): S.IDLE,
    (S.IDLE, M.START_RESPONSE): S.RESPONDING,
    (S.STREAMING, M.START_RESPONSE): S.RESPONDING,
    (S.COMMITTED, M.START_RESPONSE): S.RESPONDING,
    (S.RESPONDING, M.END_RESPONSE): S.IDLE,
}
