"""SessionManager: session id -> StreamingSession, the limits on how many are open, and the
reaper that closes sessions idle past their timeout.

Closed sessions leave the table when nothing can read them any more: at once when deleted,
expired or abandoned, or once their retained output expires (or more than max_open_sessions
are retained). Their ids are remembered (a bounded list) so a late call gets 410, not 404.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict, deque
from collections.abc import Callable

import trio

from rill.sessions.chunks import InputChunk
from rill.sessions.config import StreamingInputConfig
from rill.sessions.errors import PayloadTooLarge, SessionGone, SessionNotFound, TooManySessions
from rill.sessions.session import SESSION_PAYLOAD_TOO_LARGE, StreamingSession
from rill.sessions.state import RETAINED, CloseReason, SessionEvent, SessionState

NUM_REMEMBERED_CLOSED = 4096  # ids of dropped sessions answered with 410; older ones read as unknown
NUM_LATENCY_SAMPLES = 4096  # time-to-first-token samples awaiting the next /metrics scrape


class SessionManager:
    def __init__(self, config: StreamingInputConfig, clock: Callable[[], float] = trio.current_time,
                 id_prefix: str = ""):
        self.config = config
        self.id_prefix = id_prefix  # "NAME." behind a load balancer (rill.scaling.replica)
        self.clock = clock
        self.sessions: dict[str, StreamingSession] = {}
        self.on_close: Callable[[StreamingSession], None] | None = None  # frees the engine side
        self._gone: OrderedDict[str, tuple[CloseReason, str | None]] = OrderedDict()  # id -> (why, owner)
        self._nursery: trio.Nursery | None = None
        self._scope = trio.CancelScope()
        self._changed = trio.Event()
        self.num_opened = 0
        self.num_started = 0
        self.num_expired = 0
        self.num_chunks_received = 0
        self.num_bytes_received = 0
        self.ttft_after_input_s: deque[float] = deque(maxlen=NUM_LATENCY_SAMPLES)

    # -- counts -----------------------------------------------------------------------------------

    @property
    def num_open(self) -> int:
        """Sessions not closed: they hold (or may hold) engine resources."""
        return sum(not s.is_closed for s in self.sessions.values())

    def num_open_for(self, owner: str | None) -> int:
        return sum(not s.is_closed and s.owner == owner for s in self.sessions.values())

    # -- opening and finding -----------------------------------------------------------------------

    def check_can_open(self, owner: str | None) -> None:
        limit, per_key = self.config.max_open_sessions, self.config.max_open_sessions_per_key
        if self.num_open >= limit:
            raise TooManySessions(f"{limit} streaming sessions are open (max_open_sessions); retry later")
        if per_key is not None and self.num_open_for(owner) >= per_key:
            raise TooManySessions(f"this API key has {per_key} streaming sessions open "
                                  "(max_open_sessions_per_key); finish or delete one first")

    def open(self, owner: str | None, *, addressable: bool = True) -> StreamingSession:
        self.check_can_open(owner)
        session = StreamingSession(f"{self.id_prefix}sess_{secrets.token_hex(12)}", owner, self.config, self.clock(),
                                   addressable=addressable)
        self.sessions[session.session_id] = session
        self.num_opened += 1
        self._wake()
        return session

    def get(self, session_id: str, owner: str | None) -> StreamingSession:
        """The caller's session, touched; 404 for ids unknown to this owner, 410 for closed ones."""
        session = self.sessions.get(session_id)
        if session is not None and session.owner == owner and session.addressable:
            session.touch(self.clock())
            return session
        if self.is_gone(session_id, owner):
            reason = self._gone[session_id][0]
            raise SessionGone(f"session {session_id} is closed ({reason.value})", code=f"session_{reason.value}")
        raise SessionNotFound(f"no streaming session {session_id!r}", param="session_id")

    def is_gone(self, session_id: str, owner: str | None) -> bool:
        gone = self._gone.get(session_id)
        return gone is not None and gone[1] == owner

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, session: StreamingSession) -> None:
        if session.state is SessionState.OPEN:
            session.fire(SessionEvent.START)
            self.num_started += 1

    def finish(self, session: StreamingSession) -> None:
        session.fire(SessionEvent.FINISH)
        session.finished_at_s = self.clock()

    def accept(self, session: StreamingSession, chunk: InputChunk) -> list[InputChunk]:
        """session.accept, counted; a chunk past the session's payload limit closes the session."""
        num_received = session.num_chunks_received
        try:
            ready = session.accept(chunk)
        except PayloadTooLarge as exc:
            if exc.code == SESSION_PAYLOAD_TOO_LARGE:
                self.close(session, CloseReason.PAYLOAD_TOO_LARGE)
            raise
        session.touch(self.clock())
        if session.num_chunks_received > num_received:
            self.num_chunks_received += 1
            self.num_bytes_received += chunk.num_payload_bytes
        return ready

    def record_first_token(self, session: StreamingSession) -> None:
        if session.finished_at_s is not None:
            self.ttft_after_input_s.append(self.clock() - session.finished_at_s)

    def close(self, session: StreamingSession, reason: CloseReason) -> None:
        """Idempotent. Frees the engine side; drops the session unless its output stays readable."""
        if not session.is_closed:
            session.fire(SessionEvent.CLOSE)
            session.close_reason = reason
            session.touch(self.clock())
            if reason is CloseReason.EXPIRED:
                self.num_expired += 1
            if self.on_close is not None:
                self.on_close(session)
            self._wake()
        if reason not in RETAINED or not session.addressable:
            self._drop(session, reason)
        else:
            self._evict_retained()

    def _evict_retained(self) -> None:
        """Closed sessions kept for reading are as many as open ones at most: the least recently
        used go first (their ids then read as expired)."""
        retained = [s for s in self.sessions.values() if s.is_closed]
        excess = len(retained) - self.config.max_open_sessions
        for session in sorted(retained, key=lambda s: s.last_activity_s)[:max(0, excess)]:
            self._drop(session, CloseReason.EXPIRED)

    def _drop(self, session: StreamingSession, reason: CloseReason) -> None:
        if self.sessions.pop(session.session_id, None) is None or not session.addressable:
            return
        self._gone[session.session_id] = (reason, session.owner)
        while len(self._gone) > NUM_REMEMBERED_CLOSED:
            self._gone.popitem(last=False)

    # -- the reaper ------------------------------------------------------------------------------------

    def expire_due(self, now_s: float) -> int:
        """Close every session idle past its timeout; the number closed."""
        due = [s for s in self.sessions.values() if (at := s.expires_at_s) is not None and at <= now_s]
        for session in due:
            self.close(session, CloseReason.EXPIRED)
        return len(due)

    def next_expiry_s(self) -> float:
        return min((at for s in self.sessions.values() if (at := s.expires_at_s) is not None), default=float("inf"))

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The reaper, and the nursery session tasks run in. Cancelled: every session closes."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started()
                    while True:
                        self.expire_due(self.clock())
                        with trio.move_on_at(self.next_expiry_s()):
                            await self._changed.wait()
        finally:
            self._nursery = None
            for session in list(self.sessions.values()):
                self.close(session, CloseReason.SHUTDOWN)

    async def stop(self) -> None:  # async: Quart runs sync hooks in a worker thread
        self._scope.cancel()

    def start_soon(self, fn, *args) -> None:
        if self._nursery is None:
            raise RuntimeError("the session manager is not running")
        self._nursery.start_soon(fn, *args)

    @property
    def is_running(self) -> bool:
        return self._nursery is not None

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
