"""A live feed's inbox (sans-IO): frames and ordered steps (text, end of input) in arrival order,
with the frame-drop policy: at most `max_waiting` frames wait; one more drops the oldest waiting
frame, so what the model sees is as recent as the encoder allows and memory never grows. Steps are
never dropped and keep their place among the frames.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

Step = Callable[[], None]  # anything else queued is a frame (rill.live_video.frames Frame or RawFrame)


class FrameInbox:
    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting
        self.entries: deque = deque()
        self.num_frames = 0  # frames waiting
        self.num_dropped = 0

    def __len__(self) -> int:
        return len(self.entries)

    def put_frame(self, frame) -> bool:
        """Queue a frame; True when an older waiting frame was dropped to make room."""
        dropped = False
        if self.num_frames >= self.max_waiting:
            oldest = next(i for i, e in enumerate(self.entries) if not callable(e))
            del self.entries[oldest]
            self.num_frames -= 1
            self.num_dropped += 1
            dropped = True
        self.entries.append(frame)
        self.num_frames += 1
        return dropped

    def put_step(self, step: Step) -> None:
        self.entries.append(step)

    def get(self):
        entry = self.entries.popleft()
        if not callable(entry):
            self.num_frames -= 1
        return entry

    @property
    def has_step(self) -> bool:
        """A step waits (the frames before it go in without waiting for the encoder)."""
        return self.num_frames < len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.num_frames = 0
