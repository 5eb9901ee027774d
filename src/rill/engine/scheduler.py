"""Continuous batching with chunked prefill under a per-step token budget, fair between requests.

Running sequences are served first (decodes and unfinished prefill chunks), then waiting
ones are admitted while the budget, max_num_seqs and KV blocks allow: first the head of the
request with the fewest sequences running, arrival order among equals (engine/fair_queue.py;
FCFS when one request waits). When every slot is taken and a waiting request has nothing
running, the request running the most sequences gives up its newest one (recompute), so that
one request with hundreds of sequences cannot keep a short chat waiting for all of them.
When blocks run out, the newest unscheduled running sequence is preempted by recompute;
idle streaming sessions are preempted before anyone else. A sequence with nobody left to
preempt computes a shorter chunk, as much as the free blocks hold, so that one request that
fits the cache alone always makes progress (with sliding windows it may hold far fewer
blocks than its length). KV is counted in block ids over all KV groups (engine/kv_layout.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rill.engine.block_manager import BlockManager
from rill.engine.fair_queue import FairQueue, request_key
from rill.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_computed: list[int] = field(default_factory=list)  # each seq's num_computed_tokens before the step
    sampling: list[Sequence] = field(default_factory=list)  # the seqs that sample a token, in batch order
    num_preempted: int = 0
    has_mm: bool = False  # a sequence with images is in the step (engine/vision_step.py)
    mm: Any = None  # its VisionInputs, once prepared

    def add(self, seq: Sequence, num_new: int) -> None:
        computed = seq.num_computed_tokens
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new)
        self.num_computed.append(computed)
        if computed + num_new == len(seq.token_ids) and seq.wants_output:
            self.sampling.append(seq)  # it reaches the end of its known tokens and wants output

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting = FairQueue()
        self.running: list[Sequence] = []
        self.num_running_by_request: Counter[int] = Counter()  # fair_queue.request_key -> sequences running
        self.parked: list[Sequence] = []  # idle sessions preempted under pressure, back on new input
        self.num_preemptions = 0
        self.vision = None  # engine/vision_step.VisionStep for a model that reads images
        # unfinished sequences with images: the step loop tests this set, empty for text, rather than
        # an attribute of every sequence (a text engine's decode step pays one truth test)
        self.mm_seqs: set[Sequence] = set()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.parked)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        if seq.mm_items:
            self.mm_seqs.add(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its blocks."""
        if seq.mm_items:
            self.vision.release(seq)
            self.mm_seqs.discard(seq)
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self._count_running(seq, -1)
            self.block_manager.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.parked:
            self.parked.remove(seq)
        seq.status = Status.FINISHED

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        if self.vision is not None:
            self.vision.begin()
        if self.waiting and len(self.running) >= self.max_num_seqs:
            self._make_way_for_a_waiting_request(batch)
        running_status, bs, mm_seqs = Status.RUNNING, self.block_manager.block_size, self.mm_seqs
        any_mm = bool(mm_seqs)  # a bool local: the cheapest test the loop below can make per sequence
        seqs, counts, computed_before, sampling = batch.seqs, batch.num_new_tokens, batch.num_computed, batch.sampling
        # This loop runs for every running sequence on every step, so ScheduledBatch.add is inline
        # for a sequence whose input is complete (the common case; an open streaming session may
        # hold tokens back or wait for input), and so is BlockManager.num_new_blocks (most decode
        # steps need no new block).
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not running_status:
                continue  # preempted earlier in this loop
            if seq.input_open:
                num_new = min(seq.num_pending_tokens, budget)
                if any_mm and num_new and seq in mm_seqs:
                    num_new = self._clip_for_vision(seq, num_new, batch)
                if num_new and self._fit(seq, num_new, batch):
                    batch.add(seq, num_new)
                    budget -= num_new
                continue
            computed = seq.num_computed_tokens
            num_new = len(seq.token_ids) - computed
            if num_new <= 0:
                continue
            samples = num_new <= budget  # the chunk reaches the end of the known tokens
            if not samples:
                num_new = budget
            if any_mm and seq in mm_seqs:
                clipped = self._clip_for_vision(seq, num_new, batch)
                if clipped < num_new:
                    num_new, samples = clipped, False
                if not num_new:
                    continue
            if (computed + num_new + bs - 1) // bs > len(seq.block_table):  # every group's table is as long
                fit = self._fit(seq, num_new, batch)
                if fit < num_new:
                    num_new, samples = fit, False
                if not num_new:
                    continue
            seqs.append(seq)
            counts.append(num_new)
            computed_before.append(computed)
            if samples:
                sampling.append(seq)
            budget -= num_new
        self._admit(batch, budget)
        return batch

    def _clip_for_vision(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> int:
        """The encoder budget's cut of seq's next chunk (engine/vision_step.py)."""
        batch.has_mm = True
        return self.vision.clip(seq, seq.num_computed_tokens, num_new)

    def _fit(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> int:
        """Make room for seq's next num_new tokens and take the blocks; return how many fit."""
        num_new = self._make_room(seq, num_new, batch)
        if num_new:
            self.block_manager.append(seq, num_new)
        return num_new

    def _make_room(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> int:
        """Preempt others until seq's next num_new tokens fit; return how many tokens to compute
        (fewer when nobody is left to preempt; 0 when seq itself had to be preempted)."""
        bm = self.block_manager
        while not bm.can_append(seq, num_new):
            victim = self._pick_victim(seq, batch)
            if victim is None:
                num_fit = bm.num_tokens_that_fit(seq)
                if num_fit > 0:
                    return min(num_new, num_fit)
                self._preempt(seq)
                batch.num_preempted += 1
                return 0
            self._preempt(victim)
            batch.num_preempted += 1
        return num_new

    def _pick_victim(self, seq: Sequence, batch: ScheduledBatch) -> Sequence | None:
        scheduled = set(map(id, batch.seqs))  # built here, on the rare preemption path, not per step
        candidates = [s for s in reversed(self.running) if s is not seq and id(s) not in scheduled]
        idle = [s for s in candidates if s.is_idle]
        return (idle or candidates or [None])[0]

    def _preempt(self, seq: Sequence) -> None:
        idle = seq.is_idle
        self.running.remove(seq)
        self._count_running(seq, -1)
        self.block_manager.free(seq)
        if seq.mm_items:
            self.vision.release(seq)
        seq.reset_for_recompute()
        if idle:
            self.parked.append(seq)
        else:
            self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _preempt_an_idle_session(self) -> bool:
        """Idle sessions yield their KV to new work rather than starve it."""
        idle = next((s for s in reversed(self.running) if s.is_idle), None)
        if idle is not None:
            self._preempt(idle)
        return idle is not None

    def unpark(self, seq: Sequence) -> None:
        """New input for a parked session: queue it to recompute its KV and go on."""
        if seq in self.parked:
            self.parked.remove(seq)
            self.waiting.append(seq)

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0:
            if len(self.running) >= self.max_num_seqs:
                if not self._preempt_an_idle_session():  # idle sessions yield their slot too, not only KV
                    break
                batch.num_preempted += 1
            seq = self.waiting.next_up(self.num_running_by_request)
            # A prompt still to be scored (prompt logprobs) or mean-pooled is computed whole: cached
            # blocks would skip it.
            whole = seq.prompt_logprobs is not None or (seq.pooler is not None and seq.pooler.needs_every_position)
            hit = 0 if whole else bm.match_prefix(seq)
            seq.num_computed_tokens = seq.num_cached_tokens = hit  # a sliding group shares only its window
            num_new = min(seq.num_pending_tokens, budget)
            if num_new and seq.mm_items:
                num_new = self._clip_for_vision(seq, num_new, batch)
            while not bm.can_append(seq, num_new) and self._preempt_an_idle_session():
                batch.num_preempted += 1
            if not bm.can_append(seq, num_new) and not self.running:
                num_new = min(num_new, bm.num_tokens_that_fit(seq))  # alone: a chunk that fits
            if num_new == 0 or not bm.can_append(seq, num_new):
                bm.free(seq)
                seq.num_computed_tokens = seq.num_cached_tokens = 0
                break  # nobody overtakes the request whose turn it is
            bm.append(seq, num_new)
            self.waiting.remove(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            self._count_running(seq, 1)
            batch.add(seq, num_new)
            budget -= num_new

    def _count_running(self, seq: Sequence, change: int) -> None:
        key = request_key(seq)
        self.num_running_by_request[key] += change
        if not self.num_running_by_request[key]:
            del self.num_running_by_request[key]

    def _make_way_for_a_waiting_request(self, batch: ScheduledBatch) -> None:
        """Every slot is taken: when the request whose turn it is has nothing running, the request
        running the most (two or more) preempts its newest sequence, before this step schedules it."""
        counts = self.num_running_by_request
        if counts.get(request_key(self.waiting.next_up(counts)), 0):
            return
        key, num = counts.most_common(1)[0]
        if num < 2:
            return  # one sequence each: nothing fairer to make
        victim = next(s for s in reversed(self.running) if request_key(s) == key)
        self._preempt(victim)
        batch.num_preempted += 1
