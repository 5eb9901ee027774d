"""One response's streamed events, kept so that a reader can leave and come back.

Events arrive with `sequence_number` 0, 1, 2, ... (the log refuses a gap or a repeat). A reader asks
for the events after sequence number N (`starting_after`, OpenAI's cursor) and gets those already
logged, then each new one as it is appended, until the log closes: every event once, in order,
whether it was logged before or after the reader came. Memory is bounded: the log keeps the newest
`max_events`; a reader asking for events older than those gets EventsDropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator

import trio


class EventsDropped(Exception):
    """The reader asked for events the log no longer holds."""


class EventLog:
    def __init__(self, max_events: int):
        assert max_events >= 1
        self._events: deque[dict] = deque(maxlen=max_events)
        self.num_events = 0  # appended in all; the next event's sequence number
        self.is_closed = False
        self._grown = trio.Event()

    @property
    def first_kept(self) -> int:
        """The sequence number of the oldest event still held."""
        return self.num_events - len(self._events)

    def append(self, event: dict) -> None:
        assert not self.is_closed, "a closed log takes no events"
        number = event.get("sequence_number")
        if number != self.num_events:
            raise ValueError(f"event {event.get('type')!r} has sequence_number {number!r}; "
                             f"the log expects {self.num_events}")
        self._events.append(event)
        self.num_events += 1
        self._wake()

    def close(self) -> None:
        """No more events: readers end once they have read every event."""
        self.is_closed = True
        self._wake()

    def check_resumable(self, starting_after: int | None) -> None:
        """Raise EventsDropped now (before a reader's stream starts) if the events it asks for are gone."""
        start = 0 if starting_after is None else starting_after + 1
        if start < self.first_kept:
            raise EventsDropped(f"events before sequence_number {self.first_kept} are no longer kept "
                                f"(at most {self._events.maxlen} per response)")

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[dict]:
        """The events after sequence number `starting_after` (all of them for None), logged and live."""
        self.check_resumable(starting_after)
        number = 0 if starting_after is None else starting_after + 1
        while True:
            while number < self.num_events:
                self.check_resumable(number - 1)  # a slow reader the log has overtaken
                yield self._events[number - self.first_kept]
                number += 1
            if self.is_closed:
                return
            await self._grown.wait()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = trio.Event()
