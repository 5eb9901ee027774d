"""Fair admission between requests (engine/fair_queue.py, engine/scheduler.py), driven directly:
no thread, no model. A request is one SamplingParams object shared by its sequences."""

from __future__ import annotations

from rill.engine.block_manager import BlockManager
from rill.engine.fair_queue import FairQueue
from rill.engine.scheduler import Scheduler
from rill.engine.sequence import Sequence, Status
from rill.sampling_params import SamplingParams


def seqs_of(params: SamplingParams, count: int, prompt_len: int = 4, name: str = "r") -> list[Sequence]:
    return [Sequence(f"{name}-{i}", 0, list(range(1, prompt_len + 1)), params, block_size=4, max_tokens=64)
            for i in range(count)]


def step_decodes(scheduler: Scheduler) -> list[Sequence]:
    """One schedule(), then advance every scheduled sequence as the engine would (a sampled token each)."""
    batch = scheduler.schedule()
    for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
        seq.num_computed_tokens += num_new
    for seq in batch.sampling:
        seq.token_ids.append(7)
    return batch.seqs


def test_one_request_waiting_is_fifo():
    queue, params = FairQueue(), SamplingParams()
    a, b, c = seqs_of(params, 3)
    for seq in (a, b, c):
        queue.append(seq)
    assert queue.next_up({}) is a
    queue.remove(a)
    queue.appendleft(a)  # preempted: first again
    assert list(queue) == [a, b, c] and len(queue) == 3 and b in queue


def test_the_request_with_fewest_running_goes_first_ties_by_arrival():
    queue, big, small = FairQueue(), SamplingParams(), SamplingParams()
    big_seqs, (chat,) = seqs_of(big, 3, name="big"), seqs_of(small, 1, name="chat")
    for seq in (*big_seqs, chat):
        queue.append(seq)
    assert queue.next_up({}) is big_seqs[0]  # neither runs: arrival order
    assert queue.next_up({id(big): 5}) is chat
    queue.remove(chat)
    assert chat not in queue and queue.next_up({id(big): 5}) is big_seqs[0]


def test_a_chat_behind_a_request_holding_every_slot_runs_at_the_next_step():
    scheduler = Scheduler(BlockManager(num_blocks=256, block_size=4), max_num_seqs=8, max_num_batched_tokens=64)
    big, small = SamplingParams(), SamplingParams()
    for seq in seqs_of(big, 40, name="big"):
        scheduler.add(seq)
    step_decodes(scheduler)
    assert len(scheduler.running) == 8 and len(scheduler.waiting) == 32  # the fan-out fills every slot
    (chat,) = seqs_of(small, 1, name="chat")
    scheduler.add(chat)
    assert chat in step_decodes(scheduler)  # the old FIFO ran it after all 40 of big's had finished
    assert chat.status is Status.RUNNING and scheduler.num_preemptions == 1
    assert scheduler.num_running_by_request == {id(big): 7, id(small): 1}
    for _ in range(3):  # no thrash: the freed slot stays with the chat, big keeps its other seven
        step_decodes(scheduler)
    assert scheduler.num_preemptions == 1 and len(scheduler.running) == 8


def test_requests_of_one_sequence_each_are_not_preempted_for_fairness():
    scheduler = Scheduler(BlockManager(num_blocks=256, block_size=4), max_num_seqs=4, max_num_batched_tokens=64)
    for i in range(6):
        scheduler.add(seqs_of(SamplingParams(), 1, name=f"r{i}")[0])
    for _ in range(3):
        step_decodes(scheduler)
    assert scheduler.num_preemptions == 0 and len(scheduler.running) == 4


def test_counts_of_running_sequences_return_to_empty_when_all_leave():
    scheduler = Scheduler(BlockManager(num_blocks=256, block_size=4), max_num_seqs=4, max_num_batched_tokens=64)
    seqs = seqs_of(SamplingParams(), 6)
    for seq in seqs:
        scheduler.add(seq)
    step_decodes(scheduler)
    for seq in seqs:
        scheduler.remove(seq)
    assert not scheduler.num_running_by_request and not scheduler.waiting and not scheduler.running
    assert scheduler.block_manager.num_free_blocks == 256
