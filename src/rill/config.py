"""EngineConfig: what the engine needs to start. The CLI and RILL_* variables fill it."""

from __future__ import annotations

import os
from dataclasses import dataclass

MAX_DEFAULT_KV_CACHE_BYTES = 2 << 30
MAX_STREAM_BUFFER_BYTES = 4 << 20  # EngineConfig.max_stream_buffer_bytes


def default_kv_cache_bytes() -> int:
    """The KV budget when none is given: 2 GiB, or an eighth of the machine's memory if less."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that tells
        return MAX_DEFAULT_KV_CACHE_BYTES
    return min(MAX_DEFAULT_KV_CACHE_BYTES, memory // 8)


@dataclass
class EngineConfig:
    model: str = "rill-tiny"  # "rill-tiny" or a local Hugging Face directory
    dtype: str | None = None  # auto | float32 | bfloat16 | float16; None or auto: the checkpoint's own (models/dtype_choice.py)
    device: str = "cpu"
    block_size: int = 16
    num_kv_blocks: int | None = None  # KV budget in blocks; None: derive from kv_cache_bytes
    kv_cache_bytes: int | None = None  # None: default_kv_cache_bytes()
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    chat_template: str | None = None  # template text overriding the tokenizer's
    seed: int = 0
    # vision models (engine/vision_step.py): embeddings the vision encoder may produce per step (None:
    # max_num_batched_tokens), and how many the encoder cache keeps (None: four steps' worth)
    max_num_encoder_tokens: int | None = None
    encoder_cache_tokens: int | None = None
    # ranks the model is split over (rill.distributed): processes on one machine, one GPU each on CUDA
    tensor_parallel_size: int = 1
    # capture the decoder as CUDA graphs for decode steps of up to max_num_seqs (at most 512)
    # sequences (engine/cuda_graphs.py); CUDA only, one process
    cuda_graphs: bool = False
    # a streamed sequence's tokens reach its reader once this many have gathered (at once until its
    # first text, and its end at once), so a server with many streams and a fast model does per-event
    # work N times less often (SGLang's and vLLM's --stream-interval); 1: every step's tokens at once
    stream_interval: int = 1
    # how many steps' output the worker may have waiting for the trio thread before it stops and
    # waits (engine/outbox.py): a worker that runs far ahead of a busy trio thread holds the GIL it
    # needs and delays every delta; 0: never wait. None: 4 on the CPU, 0 on CUDA, where the worker
    # leaves the GIL while the GPU computes and a brake would only cap the tokens a delivery carries
    max_steps_ahead: int | None = None
    # output a request may hold for a reader that does not read (its client's socket is full), priced
    # as memory (engine/async_engine.py delta_bytes); past it the request is aborted and its KV freed.
    # None or 0: unbounded (the offline LLM reads at once)
    max_stream_buffer_bytes: int | None = MAX_STREAM_BUFFER_BYTES

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps_ahead is None:
            self.max_steps_ahead = 0 if str(self.device).startswith("cuda") else 4
        if self.max_steps_ahead < 0:
            raise ValueError(f"max_steps_ahead must be >= 0, got {self.max_steps_ahead}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.cuda_graphs and not str(self.device).startswith("cuda"):
            raise ValueError(f"cuda_graphs needs a CUDA device, got device {self.device!r}")
        if self.cuda_graphs and self.tensor_parallel_size > 1:
            raise ValueError("cuda_graphs runs in one process: not with tensor_parallel_size > 1")
