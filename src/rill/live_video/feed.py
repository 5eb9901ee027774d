"""LiveFeed: one session's frame stream into its engine session, as frames arrive.

One task per feed takes the inbox in order. A frame waits for its partner (a piece is two frames),
then the pair is processed in a worker thread and appended to the engine session as the next piece
of the open video; the engine encodes it inside its next step and prefills it. A step (text or end of
input, from the transport) first closes the open video (an odd last frame becomes a piece of its own)
and then runs, so every input keeps its place.

Pacing: before taking a frame, the task waits until at most `max_frames_in_flight` frames are
appended but not yet in the KV cache (the engine reports its progress once per step); frames that
arrive meanwhile wait in the inbox, at most `max_waiting_frames` of them, the oldest dropped past that
(counted in `counts` and the server's /metrics). When a step waits behind frames, they go in at once.

The window: after each piece, frames past the window (LiveVideoConfig) leave the context once at
least `stride_frames` of them have gathered: the shorter context is sent as a rebase, prefilled beside
the live one off the critical path (rill.engine.live_sessions). One rebase at a time.

Frames come decoded (Frame) or as they came (RawFrame: decoded here, in a worker thread, only once
the frame is taken, so a dropped frame costs nothing; a bad one goes to `on_bad_frame`). A feed may be
paused (no engine session takes frames now: they wait, the drop policy holding) and retargeted to
the next engine session (the realtime API opens one per turn).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import trio

from rill.live_video.config import LiveVideoConfig
from rill.live_video.context import LiveContext
from rill.live_video.framing import PieceMaker
from rill.errors import ValidationError
from rill.live_video.frames import Frame, RawFrame, check_timestamp, decode_frame
from rill.live_video.pacer import FrameInbox, Step
from rill.live_video.stats import FeedCounts, LiveVideoStats


class FeedSink(Protocol):
    """The transport's side: the engine session the feed appends to."""

    request_id: str
    num_sent: int  # input tokens sent to the engine session so far (its opening prompt included)

    def flush_text(self) -> None: ...  # text held back (it could still merge) goes in: a video comes next
    def append_media(self, ids: list[int], items: list) -> None: ...  # engine.append of a piece or closing ids
    def rebased(self, ids: list[int]) -> None: ...  # the context is now these ids (its bookkeeping)


class LiveFeed:
    def __init__(self, engine, sink: FeedSink, maker: PieceMaker, context: LiveContext, config: LiveVideoConfig,
                 stats: LiveVideoStats | None = None, max_tokens: int | None = None, policy=None):
        self.engine, self.sink, self.maker, self.context, self.config = engine, sink, maker, context, config
        self.policy = policy  # rill.media.MediaPolicy, to decode RawFrames
        self.on_bad_frame = lambda tag, error: None  # a RawFrame that could not be used
        self.on_drop = lambda num_dropped: None  # a frame dropped (the feed's total so far)
        self.paused = False
        self.is_working = False  # a frame or step is being handled
        self.stats = stats or LiveVideoStats()
        self.max_tokens = max_tokens  # the context is trimmed before it passes this (e.g. half max_model_len)
        self.counts = FeedCounts()
        self.inbox = FrameInbox(config.max_waiting_frames)
        self.max_pieces_in_flight = math.ceil(config.max_frames_in_flight / maker.frames_per_piece)
        self._wake = trio.lowlevel.ParkingLot()
        self._pending: list[Frame] = []  # frames waiting for the rest of their piece
        self._size: tuple[int, int] | None = None  # the open video's frame size (height, width)
        self._in_flight: deque[int] = deque()  # where appended pieces end, in num_sent coordinates
        self._rebase_target: int | None = None  # the engine's rebase count once the last one took effect
        self._last_timestamp_s: float | None = None
        self.stats.add("num_feeds")
        self.stats.add("num_open_feeds")
        self._closed = False

    # -- the transport's side (trio, non-blocking) ------------------------------------------------------

    def put_frame(self, frame: Frame | RawFrame) -> None:
        self._count("num_frames_received")
        if self.inbox.put_frame(frame):
            self._count("num_frames_dropped")
            self.on_drop(self.counts.num_frames_dropped)
        self._wake.unpark_all()

    def put_step(self, step: Step) -> None:
        self.inbox.put_step(step)
        self._wake.unpark_all()

    @property
    def last_timestamp_s(self) -> float | None:
        return self._last_timestamp_s

    def note_timestamp(self, timestamp_s: float | None) -> None:
        if timestamp_s is not None:
            self._last_timestamp_s = timestamp_s

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def is_busy(self) -> bool:
        """Frames are on their way into the engine session (waiting, being handled, or a half piece)."""
        return not self.paused and bool(len(self.inbox) or self.is_working or self._pending)

    def pause(self) -> None:
        """No engine session takes frames now: they wait in the inbox for the next one, up to a window's
        worth (max_frames; the oldest dropped past it)."""
        self.paused = True
        self.inbox.max_waiting = max(self.config.max_frames, self.config.max_waiting_frames)

    def resume(self) -> None:
        self.paused = False
        self.inbox.max_waiting = self.config.max_waiting_frames
        self._wake.unpark_all()

    @property
    def has_frames(self) -> bool:
        return bool(self.inbox.num_frames or self._pending)

    def retarget(self, context: LiveContext) -> None:
        """The sink opened a new engine session whose context this is: nothing of it is in flight yet."""
        self.context = context
        self._in_flight.clear()
        self._rebase_target = None
        self._size = None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.stats.add("num_open_feeds", -1)
            self.inbox.clear()

    # -- the task ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                while not len(self.inbox) or self.paused:
                    await self._wake.park()
                entry = self.inbox.get()
                self.is_working = True
                try:
                    if callable(entry):
                        await self.close_video()
                        entry()
                    else:
                        await self._take_frame(entry)
                finally:
                    self.is_working = False
        finally:
            self.close()

    async def _take_frame(self, frame: Frame | RawFrame) -> None:
        await self._wait_for_room()
        if isinstance(frame, RawFrame):
            frame = await self._decode(frame)
            if frame is None:
                return
        self._pending.append(frame)
        if len(self._pending) == self.maker.frames_per_piece:
            await self._append_piece()

    async def _decode(self, raw: RawFrame) -> Frame | None:
        try:
            check_timestamp(raw.timestamp_s, self._last_timestamp_s, "timestamp")
            frame = await trio.to_thread.run_sync(decode_frame, raw.payload, self.policy, "image", raw.timestamp_s)
        except ValidationError as exc:
            self._count("num_bad_frames")
            self.on_bad_frame(raw.tag, exc)
            return None
        self.note_timestamp(frame.timestamp_s)
        return frame

    async def close_video(self) -> None:
        """Text follows (or the input ends): an odd frame goes in alone, then the video's closing ids."""
        if self._pending:
            await self._append_piece()
        ids = self.context.close_video()
        self._size = None
        if ids:
            self.sink.append_media(ids, [])

    async def _append_piece(self) -> None:
        frames, self._pending = self._pending, []
        if self._size is None:
            self._size = frames[0].pixels.shape[:2]
        piece = await trio.to_thread.run_sync(self.maker.piece, [f.pixels for f in frames], self._size,
                                              frames[0].timestamp_s)
        self.sink.flush_text()
        ids, items = self.context.add_piece(piece)
        self.sink.append_media(ids, items)
        self._in_flight.append(self.sink.num_sent)
        self._count("num_frames_appended", piece.num_frames)
        self._maybe_rebase()

    # -- pacing ------------------------------------------------------------------------------------------

    async def _wait_for_room(self) -> None:
        while not self.inbox.has_step and self.num_pieces_in_flight() >= self.max_pieces_in_flight:
            await self.engine.wait_input_progress()

    def num_pieces_in_flight(self) -> int:
        progress = self.engine.input_progress(self.sink.request_id)
        if progress is not None and not progress.started:
            self._in_flight.clear()  # a start policy holds prefill back: nothing is being computed
        elif progress is not None:
            # the last piece's last placeholder is held back until more input comes: "in" one short of it
            while self._in_flight and self._in_flight[0] - 1 <= progress.num_computed_input:
                self._in_flight.popleft()
        return len(self._in_flight)

    # -- the window --------------------------------------------------------------------------------------

    def _maybe_rebase(self) -> None:
        progress = self.engine.input_progress(self.sink.request_id)
        done = progress.num_rebases if progress is not None else 0
        if self._rebase_target is not None and done < self._rebase_target:
            return  # the last one has not taken effect yet
        config = self.config
        num = self.context.num_to_trim(config.max_frames, config.max_seconds, self.max_tokens)
        over_tokens = self.max_tokens is not None and self.context.num_tokens > self.max_tokens
        if num == 0 or (num < config.stride_frames and not over_tokens):
            return
        self._count("num_frames_trimmed", self.context.trim(num))
        ids, items = self.context.prompt()
        self.engine.rebase(self.sink.request_id, ids, items)
        self.sink.rebased(ids)
        self._rebase_target = done + 1
        self._count("num_rebases")

    def _count(self, name: str, n: int = 1) -> None:
        setattr(self.counts, name, getattr(self.counts, name) + n)
        self.stats.add(name, n)
