"""The trio side of one live stream of a causal speech model (rill.speech.causal): non-blocking feed and
end, the worker's deltas in order, close to free it.

    with speech.open_live(16_000) as live:
        live.feed(samples)          # as audio arrives; returns at once
        live.end()                  # the model's delay is flushed with silence
        async for delta in live:    # LiveDelta: token_ids, pieces, text, num_steps; the last has finished
            ...

The deltas' channel is unbounded: a stream's deltas are bounded by the audio it was fed, and the
transcriber that feeds it bounds that (rill.speech.causal_live's backlog).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import trio

from rill.errors import EngineDeadError, RillError
from rill.speech.causal import EndLive, FeedLive, LiveDelta


class LiveHandle:
    def __init__(self, engine, request_id: str, recv: trio.MemoryReceiveChannel):
        self.engine = engine  # AsyncSpeechEngine
        self.request_id = request_id
        self._recv = recv
        self.closed = False

    def feed(self, pcm: np.ndarray) -> None:
        if not self.closed:
            self.engine._send(FeedLive(self.request_id, np.asarray(pcm, dtype=np.float32)))

    def end(self) -> None:
        if not self.closed:
            self.engine._send(EndLive(self.request_id))

    def close(self) -> None:
        """Idempotent: the worker forgets the stream (its caches with it) at its next look at its inbox."""
        if not self.closed:
            self.closed = True
            self._recv.close()
            self.engine.abort(self.request_id)

    def __enter__(self) -> LiveHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aiter__(self) -> AsyncIterator[LiveDelta]:
        """Deltas until the stream's last (finished); raises the worker's refusal (a RillError), or
        EngineDeadError when the worker dies."""
        async for item in self._recv:
            if isinstance(item, LiveDelta):
                if item.error is not None:
                    raise (EngineDeadError if self.engine.dead is not None else RillError)(item.error)
                yield item
                if item.finished is not None:
                    return
            elif getattr(item, "error", None) is not None:  # a RequestRejected, or the engine's failure
                error = item.error
                raise error if isinstance(error, BaseException) else EngineDeadError(error)
