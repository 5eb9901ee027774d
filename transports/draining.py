"""Ending the SSE streams that a shutdown's grace did not see finish: each gets a terminal error
event, then its response ends (the README's promise; without it, hypercorn's graceful timeout
cancelled them mid-stream and clients saw the connection drop with neither an error nor [DONE]).

Every SSE response of the app (transports/http.py `_sse`) passes its frames through
`Draining.frames`. Once shutdown has begun (`end_at`), each wait for a stream's next frame happens
in a cancel scope with the cut's deadline; when it fires, the stream's generator is cancelled where
it waits (its `finally` aborts the engine request, as a disconnect's does) and the error event is
the last frame. The write of that event is bounded by the end of the grace (transports/send_guard.py).
Before shutdown no scope is entered: one costs about 15 us a frame, 20x the wrapper itself. A stream
that is generating asks for its next frame within an engine step of the signal, so it is in a scope
long before the cut; one that waits with no output at all (a Mode B reader before any input) is cut
by hypercorn at the end of the grace, without the event.
"""

from __future__ import annotations

import math

import trio

from rill.openai import sse
from rill.openai.errors import ApiError

SHUTDOWN = ApiError(503, "the server is shutting down: the stream ended before its answer did", code="server_shutdown")


def cut_time_s(grace_s: float) -> float:
    """How long before the end of the grace the streams are ended, leaving time to send the event."""
    return min(1.0, grace_s / 4)


class Draining:
    """The cut of one app's SSE streams at shutdown."""

    def __init__(self) -> None:
        self._end_at = math.inf
        self.num_ended = 0  # streams ended by a shutdown

    def end_at(self, deadline: float) -> None:
        """Streams still running at `deadline` (trio time) end there with an error event."""
        self._end_at = min(self._end_at, deadline)

    async def frames(self, frames):
        """`frames`, ended by an error event if `end_at`'s deadline comes first."""
        try:
            while True:
                if self._end_at == math.inf:  # the common case: no shutdown, no scope
                    try:
                        frame = await anext(frames)
                    except StopAsyncIteration:
                        return
                else:
                    with trio.CancelScope(deadline=self._end_at) as scope:
                        try:
                            frame = await anext(frames)
                        except StopAsyncIteration:
                            return
                    if scope.cancelled_caught:  # the generator was cancelled where it waited: it is done
                        self.num_ended += 1
                        yield sse.error_frame(SHUTDOWN)
                        return
                yield frame  # never inside the scope: a cancel scope must not span a yield
        finally:
            await frames.aclose()
