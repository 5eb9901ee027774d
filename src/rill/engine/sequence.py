"""One sequence's state inside the engine: token ids, progress counters, KV blocks."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from rill.outputs import TokenLogprob
    from rill.sampling_params import SamplingParams
    from rill.tokenizer.detokenizer import Detokenizer


class Status(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and queued again
    RUNNING = "running"  # holds KV blocks, scheduled every step it has work
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class Sequence:
    """A request's tokens and progress. `num_*` counters are the state; the rest derives."""

    # Images and videos in the prompt (rill.multimodal.inputs.MultiModalItem, by offset), and their
    # M-RoPE layout (rill.multimodal.mrope) where the model uses one: set per instance by the engine
    # core for a prompt with images only. Class defaults, so that a text sequence's instance keeps
    # within CPython's 30 shared dictionary keys (two more attributes each made every attribute read of
    # the scheduler's loop slower: rill bench scheduler's schedule() of 256 decodes, 70 -> 81 us).
    mm_items: tuple = ()
    mrope = None
    # A pooling request's rill.engine.pooling.Pooler (prefill only, /v1/embeddings): a class default
    # for the same reason.
    pooler = None

    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        block_size: int,
        max_tokens: int,
        num_kv_groups: int = 1,
        detokenizer: Detokenizer | None = None,
        generator: torch.Generator | None = None,
        input_open: bool = False,
        respond_per_chunk: bool = False,
        start_after_tokens: int | None = 1,
        matcher: Any = None,
    ):
        self.request_id = request_id
        self.index = index
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # of those, how many came from the prefix cache
        # One block table per KV group (engine/kv_layout.py), all of the same logical length; in
        # each, the leading num_freed_blocks[g] slots were released by the group's sliding window.
        self.block_tables: list[list[int]] = [[] for _ in range(num_kv_groups)]
        self.block_table = self.block_tables[0]  # the same list: the per-step paths read it without indexing
        self.num_freed_blocks = [0] * num_kv_groups
        self.block_hashes: list[int] = []  # prefix-cache chain hash of each full block, filled lazily
        self.block_size = block_size
        self.params = params
        # SamplingParams.prompt_logprobs: filled as prefill chunks compute them (the first prompt
        # token has none); handed out with the first sampled token, then None.
        wants = params is not None and params.prompt_logprobs is not None  # tests build bare sequences
        self.prompt_logprobs: list[TokenLogprob | None] | None = [None] if wants else None
        self.max_tokens = max_tokens  # output budget: params.max_tokens capped by the model length
        self.detokenizer = detokenizer
        self.generator = generator
        self.matcher = matcher  # params.grammar's llguidance matcher, advanced per committed token
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        # streaming input: more prompt may arrive; respond_per_chunk generates between chunks
        self.input_open = input_open
        self.respond_per_chunk = respond_per_chunk
        self.awaiting_input = False  # respond_per_chunk: this turn's answer ended, wait for input
        self.start_after_tokens = start_after_tokens  # None: start only at end of input
        self.output_start = self.num_prompt_tokens  # where this turn's output begins
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None

    def __repr__(self) -> str:
        return f"Sequence({self.request_id}#{self.index}, {self.status.value}, {self.num_computed_tokens}/{self.num_tokens})"

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.output_start

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.output_start :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_prompt_logprobs_owed(self) -> int:
        """Prompt tokens whose logprobs are still to compute (0 when none were asked for)."""
        return 0 if self.prompt_logprobs is None else self.num_prompt_tokens - len(self.prompt_logprobs)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens the scheduler may compute now.

        A session that answers at the end holds its last known token back while input is
        open, so that end of input costs one step that computes it and samples.
        """
        if self.awaiting_input:
            return 0
        n = len(self.token_ids) - self.num_computed_tokens
        if self.input_open and not self.respond_per_chunk:
            n -= 1  # the holdback
        return n if n > 0 else 0

    @property
    def wants_output(self) -> bool:
        """Whether reaching the end of the known tokens should sample a new one."""
        return not self.input_open or self.respond_per_chunk

    @property
    def is_idle(self) -> bool:
        """A streaming session waiting for input: holds KV, has nothing to compute."""
        return self.status is Status.RUNNING and self.num_pending_tokens == 0

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def num_blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def clear_blocks(self) -> None:
        """Forget every block (the block manager has released them)."""
        self.block_tables = [[] for _ in self.block_tables]
        self.block_table = self.block_tables[0]
        self.num_freed_blocks = [0] * len(self.block_tables)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def extend_input(self, token_ids: list[int]) -> None:
        """Streaming input: append a chunk. Output already in the KV cache becomes prompt; a
        sampled token not yet in the cache is dropped (DESIGN.md, respond_per_chunk)."""
        if self.num_output_tokens and self.num_computed_tokens < self.num_tokens:
            self.token_ids.pop()
        self.token_ids.extend(token_ids)
        self.num_prompt_tokens = self.output_start = self.num_tokens
        self.awaiting_input = False

    def reset_for_recompute(self) -> None:
        """Preempted: KV is dropped; everything known so far becomes prompt to recompute."""
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.clear_blocks()
        self.status = Status.WAITING
