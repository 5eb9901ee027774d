"""A session's output as SSE frames in order, kept for readers that come and go.

Frame i is sent with `id: i`; a reader that reconnects with Last-Event-ID: i resumes at i + 1,
one without it replays from the start. The log is bounded by the request's max_tokens (one
frame per output step at most) and goes with its session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio


class OutputLog:
    def __init__(self):
        self.frames: list[bytes] = []
        self.is_closed = False
        self._grown = trio.Event()

    def append(self, frame: bytes) -> None:
        assert not self.is_closed, "a closed log takes no frames"
        self.frames.append(frame)
        self._wake()

    def close(self) -> None:
        self.is_closed = True
        self._wake()

    async def wait_closed(self) -> None:
        while not self.is_closed:
            await self._grown.wait()

    async def follow(self, start: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """(index, frame) from `start` on, waiting for new frames until the log closes."""
        i = start
        while True:
            while i < len(self.frames):
                yield i, self.frames[i]
                i += 1
            if self.is_closed:
                return
            await self._grown.wait()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = trio.Event()


def with_id(index: int, frame: bytes) -> bytes:
    """The frame with its SSE `id:` line, for resuming."""
    return b"id: %d\n" % index + frame
