"""Chunks in sequence_id order (sans-IO): an early chunk waits in a bounded window, a repeat of
an applied chunk is recognised by its digest, and finishing names the ids still missing."""

from __future__ import annotations

from rill.sessions.chunks import InputChunk
from rill.sessions.errors import ChunkConflict

# Digests kept per session to recognise repeats; a repeat older than this is acknowledged unchecked.
NUM_REMEMBERED_DIGESTS = 1024


class ReorderWindow:
    """offer() chunks in any order; it returns those that are next, in order.

    An early chunk (sequence_id up to `max_pending` past the next expected one) waits; further
    ahead is a conflict (409). The same sequence_id with the same content again is a duplicate
    (acknowledged, ignored); with other content it is a conflict.
    """

    def __init__(self, max_pending: int):
        self.max_pending = max_pending
        self.next_sequence_id = 0
        self.end_sequence_id: int | None = None  # the end_of_input chunk's id, once seen
        self.num_duplicates = 0
        self._pending: dict[int, InputChunk] = {}
        self._digests: dict[int, bytes] = {}  # applied ids, the most recent NUM_REMEMBERED_DIGESTS

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def is_complete(self) -> bool:
        """The end_of_input chunk and everything before it were applied."""
        return self.end_sequence_id is not None and self.next_sequence_id > self.end_sequence_id

    def is_duplicate(self, chunk: InputChunk) -> bool:
        """True for a repeat of a chunk already here; a conflicting repeat raises."""
        sid = chunk.sequence_id
        known = self._pending[sid].digest if sid in self._pending else self._digests.get(sid)
        if known is None:
            if sid < self.next_sequence_id:  # applied long ago: no digest left to compare
                self.num_duplicates += 1
                return True
            return False
        if known != chunk.digest:
            raise ChunkConflict(f"sequence_id {sid} was already received with a different payload",
                                param="sequence_id", code="sequence_id_conflict")
        self.num_duplicates += 1
        return True

    def check_can_offer(self, chunk: InputChunk) -> None:
        sid = chunk.sequence_id
        if self.end_sequence_id is not None and sid > self.end_sequence_id:
            raise ChunkConflict(f"sequence_id {sid} comes after the end of input (sequence_id "
                                f"{self.end_sequence_id})", param="sequence_id", code="input_finished")
        if chunk.end_of_input and self.end_sequence_id is not None:
            raise ChunkConflict(f"end_of_input at sequence_id {sid}, but input already ends at sequence_id "
                                f"{self.end_sequence_id}", param="end_of_input", code="sequence_id_conflict")
        if chunk.end_of_input and self._pending and max(self._pending) > sid:
            raise ChunkConflict(f"end_of_input at sequence_id {sid}, but sequence_id {max(self._pending)} "
                                "was already received", param="sequence_id", code="sequence_id_conflict")
        if sid - self.next_sequence_id > self.max_pending:
            raise ChunkConflict(f"sequence_id {sid} is too far ahead: the next expected is "
                                f"{self.next_sequence_id} and at most {self.max_pending} chunks may wait "
                                "(max_pending_chunks)", param="sequence_id", code="too_far_ahead")

    def offer(self, chunk: InputChunk) -> list[InputChunk]:
        """Take a chunk that is not a duplicate; return the chunks now ready, in order."""
        self.check_can_offer(chunk)
        if chunk.end_of_input:
            self.end_sequence_id = chunk.sequence_id
        self._pending[chunk.sequence_id] = chunk
        ready = []
        while self.next_sequence_id in self._pending:
            ready.append(self._apply(self._pending.pop(self.next_sequence_id)))
        return ready

    def missing(self, last_sequence_id: int | None = None) -> list[int]:
        """Ids not yet received below the last one known (the given one, the end, or the pending)."""
        last = max([self.next_sequence_id - 1, *self._pending, *(
            i for i in (last_sequence_id, self.end_sequence_id) if i is not None)])
        return [i for i in range(self.next_sequence_id, last + 1) if i not in self._pending]

    def _apply(self, chunk: InputChunk) -> InputChunk:
        sid = chunk.sequence_id
        self._digests[sid] = chunk.digest
        self._digests.pop(sid - NUM_REMEMBERED_DIGESTS, None)
        self.next_sequence_id = sid + 1
        return chunk
