"""Streaming sessions whose input holds images or video (a live camera, rill.live_video): their prefill
progress for the trio side, and rebasing, which keeps an endless stream's context bounded.

Progress: once per step, each such session's count of input tokens appended so far and how many of
its context's tokens are not yet in the KV cache go out with the engine's stats snapshot, so a frame
pacer knows when the encoder and prefill have caught up with the frames it sent (and drops frames
rather than queue them when they have not). The uncomputed tokens are always the tail of what was
appended, so `num_appended - num_uncomputed` is how far into the input the KV cache reaches, whatever
rebases did to the context's length.

Rebase: the serving side asks to replace a session's context by a shorter one (the same prompt with
the frames older than its window left out). Full attention sees every token, so the shorter context
must be computed again: it is prefilled as a *shadow* sequence beside the live one, which goes on
serving meanwhile (input appended to the session goes to both). Once the shadow has caught up
(every token but the held-back last one in its KV cache) it takes the live sequence's place and the
live one's blocks are freed. A question that ends the input before that is answered by the live
sequence at once, the shadow dropped: a rebase never sits on the path to the first answer token.
"""

from __future__ import annotations

import msgspec

from rill.engine.sequence import Sequence, Status
from rill.errors import ValidationError


class InputProgress(msgspec.Struct, frozen=True, array_like=True):
    """One live session's input as the engine has it (crosses to the trio side with the stats)."""

    num_appended: int  # input tokens so far: the opening prompt and every append (rebases do not count)
    num_uncomputed: int  # the context's last tokens, not yet in the KV cache
    started: bool  # prefill has begun (a start policy may hold a session back)
    num_rebases: int  # rebases that took effect

    @property
    def num_computed_input(self) -> int:
        """How far into the appended input the KV cache reaches."""
        return self.num_appended - self.num_uncomputed


class LiveSessions:
    def __init__(self, core):
        self.core = core
        self.seqs: dict[str, Sequence] = {}  # open sessions with images or video, by request id
        self.appended: dict[str, int] = {}  # their input tokens so far
        self.shadows: dict[str, Sequence] = {}  # a rebase's shorter context, prefilling
        self.num_rebases: dict[str, int] = {}
        self.num_rebased = 0  # rebases that took effect, engine-wide

    # -- progress -----------------------------------------------------------------------------------

    def watch(self, seq: Sequence) -> None:
        """seq's input holds (or is about to hold) images or video: report its progress from now on."""
        self.seqs[seq.request_id] = seq
        self.appended.setdefault(seq.request_id, seq.num_tokens)

    def progress(self) -> dict[str, InputProgress]:
        sessions, appended, rebases = self.core.sessions, self.appended, self.num_rebases
        return {rid: InputProgress(appended[rid], seq.num_tokens - seq.num_computed_tokens,
                                   sessions.get(rid) is not seq, rebases.get(rid, 0)) for rid, seq in self.seqs.items()}

    def forget(self, request_id: str) -> None:
        """Input ended or the request is gone: no more progress, no rebase."""
        self.seqs.pop(request_id, None)
        self.appended.pop(request_id, None)
        self.num_rebases.pop(request_id, None)
        self._drop_shadow(request_id)

    # -- rebase ---------------------------------------------------------------------------------------

    def rebase(self, seq: Sequence, token_ids: list[int], mm_items) -> None:
        """Replace seq's context by token_ids with mm_items (placed); prefilled beside it unless nothing
        of it is computed yet."""
        core, rid = self.core, seq.request_id
        if seq.respond_per_chunk:
            raise ValidationError("a session that answers every chunk cannot be rebased", param="session_id",
                                  code="unsupported")
        core.check_fits(len(token_ids), None)
        layout = core._mm_layout(token_ids, mm_items)
        self._drop_shadow(rid)
        if core.sessions.get(rid) is seq:  # not started: nothing computed, the prompt is simply replaced
            _replace_prompt(seq, token_ids, mm_items, layout)
            self._took_effect(rid)
            return
        (shadow,) = core._new_sequences(f"{rid}#rebase", token_ids, seq.params, seq.max_tokens, mm_items,
                                        input_open=True, start_after_tokens=1)
        core.requests.pop(shadow.request_id)  # not a request of its own: the live one's stand-in
        shadow.request_id = rid
        self.shadows[rid] = shadow
        core.scheduler.add(shadow)

    def on_append(self, seq: Sequence, token_ids: list[int], mm_items) -> None:
        """Input appended to the live sequence is counted, and goes to its shadow too."""
        if seq.request_id in self.appended:
            self.appended[seq.request_id] += len(token_ids)
        shadow = self.shadows.get(seq.request_id)
        if shadow is not None:
            self.core._extend(shadow, token_ids, mm_items)

    def on_finish(self, seq: Sequence) -> Sequence:
        """End of input: a shadow that has caught up answers (it is the intended context); one that has
        not is dropped and the live sequence answers now. Returns the sequence that answers."""
        shadow = self.shadows.get(seq.request_id)
        if shadow is not None and _caught_up(shadow):
            seq = self._swap(seq, shadow)
        self.forget(seq.request_id)
        return seq

    def after_step(self) -> None:
        """Shadows that caught up in this step take their live sequence's place."""
        for rid, shadow in list(self.shadows.items()):
            if _caught_up(shadow):
                self._swap(self.core.requests[rid][0], shadow)

    def _swap(self, live: Sequence, shadow: Sequence) -> Sequence:
        rid = live.request_id
        del self.shadows[rid]
        shadow.max_tokens, shadow.generator, shadow.matcher = live.max_tokens, live.generator, live.matcher
        shadow.arrival_time = live.arrival_time
        self.core.requests[rid] = [shadow]
        self.seqs[rid] = shadow
        self.core.scheduler.remove(live)  # frees its blocks and its encoder-cache holds
        self._took_effect(rid)
        return shadow

    def _took_effect(self, rid: str) -> None:
        self.num_rebases[rid] = self.num_rebases.get(rid, 0) + 1
        self.num_rebased += 1

    def _drop_shadow(self, rid: str) -> None:
        shadow = self.shadows.pop(rid, None)
        if shadow is not None and not shadow.is_finished:
            self.core.scheduler.remove(shadow)


def _caught_up(shadow: Sequence) -> bool:
    return shadow.status is Status.RUNNING and shadow.num_pending_tokens == 0


def _replace_prompt(seq: Sequence, token_ids: list[int], mm_items, layout) -> None:
    seq.token_ids = list(token_ids)
    seq.num_prompt_tokens = seq.output_start = len(token_ids)
    seq.block_hashes = []
    seq.mm_items, seq.mrope = tuple(mm_items), layout
