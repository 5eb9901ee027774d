"""The scheduler's waiting queue, fair between requests.

One API request may bring many sequences (prompts x n); a plain FIFO would let it hold every
slot while a 4-token chat that came a moment later waits for all of them. Sequences are kept
in per-request deques, in the order their requests arrived; the next to admit is the head of
the request that has the fewest sequences running (ties: the earliest request). With one
request waiting this is FIFO, as before.

A request is told apart by its SamplingParams object: the engine creates all of a request's
sequences (its n choices) with one, and the API layer submits all prompts of one call with
one (rill.openai.serving.Serving.run). A sequence holds its params, so the key is stable for
as long as the sequence waits or runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping

from rill.engine.sequence import Sequence


def request_key(seq: Sequence) -> int:
    """Which request a sequence belongs to (see the module docstring)."""
    return id(seq.params)


class FairQueue:
    """Waiting sequences: append / appendleft / remove / `in` / len like a deque, and `next_up`."""

    def __init__(self) -> None:
        self._requests: dict[int, deque[Sequence]] = {}  # insertion order: the requests' arrival order
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Sequence]:
        for seqs in self._requests.values():
            yield from seqs

    def __contains__(self, seq: Sequence) -> bool:
        seqs = self._requests.get(request_key(seq))
        return seqs is not None and seq in seqs

    def append(self, seq: Sequence) -> None:
        self._requests.setdefault(request_key(seq), deque()).append(seq)
        self._len += 1

    def appendleft(self, seq: Sequence) -> None:
        """A preempted sequence goes first within its request; a request new to the queue goes first."""
        key = request_key(seq)
        if key not in self._requests:
            self._requests = {key: deque(), **self._requests}  # rare: preemption of a request's last waiter
        self._requests[key].appendleft(seq)
        self._len += 1

    def remove(self, seq: Sequence) -> None:
        key = request_key(seq)
        seqs = self._requests[key]
        seqs.remove(seq)
        self._len -= 1
        if not seqs:
            del self._requests[key]

    def next_up(self, num_running: Mapping[int, int]) -> Sequence:
        """The head of the waiting request with the fewest sequences running (ties: the earliest)."""
        if len(self._requests) == 1:
            return next(iter(self._requests.values()))[0]
        key = min(self._requests, key=lambda k: num_running.get(k, 0))  # min keeps the first of equals
        return self._requests[key][0]
