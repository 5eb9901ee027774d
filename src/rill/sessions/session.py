"""StreamingSession: one client's streamed input and its answer, as the manager keeps it.

Sans-IO apart from its output log: it applies the rules (limits, order, lifecycle) and keeps
the figures; the serving side (rill.openai.streaming) feeds the engine and the log.
"""

from __future__ import annotations

import time
from typing import Any

from rill.sessions.chunks import FRAME_MODALITIES, InputChunk, check_chunk
from rill.sessions.config import StreamingInputConfig
from rill.sessions.errors import ChunkConflict, PayloadTooLarge, SessionGone
from rill.sessions.ordering import ReorderWindow
from rill.sessions.output import OutputLog
from rill.sessions.state import RETAINED, CloseReason, SessionEvent, SessionState, next_state

SESSION_PAYLOAD_TOO_LARGE = "session_payload_too_large"  # the error code that closes the session


class StreamingSession:
    def __init__(self, session_id: str, owner: str | None, config: StreamingInputConfig, now_s: float, *,
                 addressable: bool = True):
        self.session_id = session_id
        self.owner = owner  # who may see it: a hash of the API key that created it
        self.addressable = addressable  # Mode B: reachable by id; Mode A: only its own request
        self.created_at = time.time()  # wall clock, for clients
        self.last_activity_s = now_s  # trio clock
        self.timeout_s = config.session_timeout_s
        self.max_chunk_bytes = config.max_chunk_bytes
        self.max_payload_bytes = config.max_payload_bytes_per_session
        self.state = SessionState.OPEN
        self.close_reason: CloseReason | None = None
        self.window = ReorderWindow(config.max_pending_chunks)
        self.output = OutputLog()
        self.num_chunks_received = 0  # duplicates excluded
        self.num_payload_bytes = 0
        self.finished_at_s: float | None = None  # end of input, for the time to first token after it
        self.run: Any = None  # the serving side's driver (rill.openai.streaming.StreamRun)

    def __repr__(self) -> str:
        return f"StreamingSession({self.session_id}, {self.state.value}, {self.num_payload_bytes} bytes)"

    # -- time ---------------------------------------------------------------------------------------

    def touch(self, now_s: float) -> None:
        self.last_activity_s = now_s

    @property
    def expires_at_s(self) -> float | None:
        """When it expires if nothing happens; None while its answer is being generated."""
        if self.state is SessionState.FINISHED:
            return None
        if self.state is SessionState.CLOSED and self.close_reason not in RETAINED:
            return None
        return self.last_activity_s + self.timeout_s

    def expires_in_s(self, now_s: float) -> float | None:
        at = self.expires_at_s
        return None if at is None else max(0.0, at - now_s)

    # -- input --------------------------------------------------------------------------------------

    def accept(self, chunk: InputChunk) -> list[InputChunk]:
        """Check a chunk and take it; the chunks now ready to apply, in order (none for a repeat)."""
        self.check_input_open()
        check_chunk(chunk, self.max_chunk_bytes)
        if self.window.is_duplicate(chunk):
            return []
        self.window.check_can_offer(chunk)
        if chunk.modality in FRAME_MODALITIES:  # frames leave the context (its window): only the chunk cap
            self.num_chunks_received += 1
            return self.window.offer(chunk)
        total = self.num_payload_bytes + chunk.num_payload_bytes
        if total > self.max_payload_bytes:
            raise PayloadTooLarge(f"the session's input would reach {total} bytes; max_payload_per_session is "
                                  f"{self.max_payload_bytes}; the session is closed", code=SESSION_PAYLOAD_TOO_LARGE)
        self.num_payload_bytes = total
        self.num_chunks_received += 1
        return self.window.offer(chunk)

    def check_input_open(self) -> None:
        if self.state is SessionState.CLOSED and self.close_reason not in (CloseReason.COMPLETED, CloseReason.FAILED):
            raise SessionGone(f"session {self.session_id} is closed ({self.close_reason.value})",
                              code=f"session_{self.close_reason.value}")
        if self.state in (SessionState.FINISHED, SessionState.CLOSED):
            raise ChunkConflict(f"session {self.session_id}'s input has ended", code="input_finished")

    def check_can_finish(self, last_sequence_id: int | None = None) -> None:
        missing = self.window.missing(last_sequence_id)
        if missing:
            raise ChunkConflict(f"cannot finish: sequence ids {missing} are missing", param="sequence_id",
                                code="missing_chunks")

    # -- lifecycle ----------------------------------------------------------------------------------

    def fire(self, event: SessionEvent) -> None:
        self.state = next_state(self.state, event)

    @property
    def is_closed(self) -> bool:
        return self.state is SessionState.CLOSED

    @property
    def next_sequence_id(self) -> int:
        return self.window.next_sequence_id
