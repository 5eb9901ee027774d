"""Engine counters and latency samples, read by the server's /metrics and by benchmarks."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec


class StatsSnapshot(msgspec.Struct, frozen=True):
    num_running: int
    num_waiting: int
    num_parked: int
    num_preemptions: int
    kv_usage: float
    num_kv_blocks: int
    num_free_kv_blocks: int
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    num_prompt_tokens: int
    num_generation_tokens: int
    num_finished: int
    num_aborted: int
    num_steps: int
    # open sessions with images or video (engine/live_sessions.py): request id -> InputProgress
    input_progress: dict | None = None
    num_rebased: int = 0
    # the encoder cache of a model with a vision tower (engine/encoder_cache.py); zeros without one
    encoder_cache_hits: int = 0
    encoder_cache_misses: int = 0
    encoder_cache_entries: int = 0
    encoder_cache_tokens: int = 0
    num_encoder_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hit_tokens / max(1, self.prefix_cache_queried_tokens)


@dataclass
class EngineStats:
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    # Recent latencies in seconds; the server drains them into its histograms.
    ttft_s: deque = field(default_factory=lambda: deque(maxlen=4096))
    itl_s: deque = field(default_factory=lambda: deque(maxlen=65536))
    e2e_s: deque = field(default_factory=lambda: deque(maxlen=4096))
    step_s: deque = field(default_factory=lambda: deque(maxlen=4096))
    encoder_tokens: deque = field(default_factory=lambda: deque(maxlen=4096))  # per step that ran the encoder

    def record_ttft(self, seconds: float) -> None:
        self.ttft_s.append(seconds)

    def record_e2e(self, seconds: float) -> None:
        self.e2e_s.append(seconds)

    def record_step(self, seconds: float, num_tokens: int) -> None:
        self.num_steps += 1
        self.step_s.append(seconds)

    def snapshot(self, scheduler, block_manager, input_progress: dict | None = None,
                 num_rebased: int = 0) -> StatsSnapshot:
        return StatsSnapshot(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            num_parked=len(scheduler.parked),
            num_preemptions=self.num_preemptions,
            kv_usage=block_manager.usage,
            num_kv_blocks=block_manager.num_blocks,
            num_free_kv_blocks=block_manager.num_free_blocks,
            prefix_cache_queried_tokens=block_manager.num_queried_tokens,
            prefix_cache_hit_tokens=block_manager.num_hit_tokens,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
            num_finished=self.num_finished,
            num_aborted=self.num_aborted,
            num_steps=self.num_steps,
            input_progress=input_progress,
            num_rebased=num_rebased,
            **_encoder_fields(scheduler.vision),
        )


def _encoder_fields(vision) -> dict:
    if vision is None:
        return {}
    cache = vision.cache
    return {"encoder_cache_hits": cache.num_hits, "encoder_cache_misses": cache.num_misses,
            "encoder_cache_entries": len(cache.entries), "encoder_cache_tokens": cache.num_tokens,
            "num_encoder_tokens": vision.num_encoded_tokens}
