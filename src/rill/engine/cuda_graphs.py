"""CUDA graphs for decode steps (`--cuda-graphs`): one captured decoder pass per batch-size bucket.

A decode step of a small model on a GPU is mostly kernel launches: a few hundred per step, each
costing the host some microseconds while the GPU waits. A CUDA graph records a step's launches
once and replays them with one call. The decoder (embedding through the final norm) is captured
for each bucket of batch sizes at start-up, over static input buffers; a step of n sequences, each
adding one token, copies its inputs into the first n rows of the buffers and replays the smallest
bucket of at least n rows. The rows past n are padding: token 0 at position 0, attending to one
key (slot 0 of block 0, which holds some finite value), writing its KV nowhere (slot -1: the write
kernel skips it). The LM head and sampling run eagerly on the n real rows.

Only steps where every sequence adds one token and none carries images replay a graph; prefill
and mixed steps run eagerly. Block tables are as wide as the longest sequence the engine admits,
so the attention kernel's split count is fixed per bucket (chosen for that width) and nothing in
the captured pass syncs with the host. vLLM does the same (its `cudagraph_capture_sizes`); its
buckets are 1, 2, 4 and then every 8, ours 1, 2, 4, 8 and then every 16.
"""

from __future__ import annotations

import time

import torch

from rill.engine.kv_layout import KVLayout
from rill.models.attention import AttentionMetadata

PAD_SLOT = -1  # write_kv skips a token whose slot is negative
MAX_GRAPH_BATCH = 512  # larger decode steps run eagerly (launch costs matter less there)


def buckets(max_batch: int) -> list[int]:
    """Batch sizes captured: 1, 2, 4, 8, then every 16 up to max_batch (always included)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch] + list(range(16, max_batch, 16)) + [max_batch]
    return sorted(set(sizes))


class DecodeGraphs:
    """Captured decoder passes over static buffers; `run` replays the one that fits a decode step."""

    def __init__(self, model, kv_caches, layout: KVLayout, block_size: int, max_batch: int, max_blocks: int):
        self.model, self.kv_caches, self.layout, self.block_size = model, kv_caches, layout, block_size
        self.sizes = buckets(max_batch)
        self.max_batch, self.max_blocks = self.sizes[-1], max_blocks
        dev, b, groups = model.embed_tokens.weight.device, self.max_batch, layout.num_groups
        self.ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.slots = torch.full((groups, b), PAD_SLOT, dtype=torch.int64, device=dev)
        self.tables = torch.zeros(groups, b, max_blocks, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=dev)
        self.starts = torch.arange(b + 1, dtype=torch.int32, device=dev)  # one query per row, always
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _meta(self, n: int) -> AttentionMetadata:
        lens, starts = self.seq_lens[:n], self.starts[: n + 1]
        if self.layout.num_groups == 1:
            return AttentionMetadata(self.slots[0, :n], self.tables[0, :n], lens, starts, 1)
        groups = [AttentionMetadata(self.slots[g, :n], self.tables[g, :n], lens, starts, 1)
                  for g in range(self.layout.num_groups)]
        return AttentionMetadata(None, None, lens, starts, 1, layers=tuple(groups[g] for g in self.layout.layer_group))

    def _forward(self, n: int) -> torch.Tensor:
        return self.model(self.ids[:n], self.positions[:n], self.kv_caches, self._meta(n))

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every bucket, largest first so that the smaller ones reuse its memory pool.
        Returns the seconds it took."""
        t0 = time.perf_counter()
        pool = None
        # Warm-up and capture on one side stream: cuBLAS makes its workspace for a stream on first use,
        # which must not happen inside a capture (CUBLAS_STATUS_EXECUTION_FAILED, seen on an H200 when
        # a second engine captured in the same process).
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        for n in reversed(self.sizes):
            with torch.cuda.stream(stream):
                self._forward(n)  # compiles the Triton kernels for this shape and warms the allocator
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.outputs[n] = self._forward(n)
            pool = graph.pool()
            self.graphs[n] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def fits(self, seqs) -> bool:
        return len(seqs) <= self.max_batch and all(len(t) <= self.max_blocks for s in seqs for t in s.block_tables)

    @torch.inference_mode()
    def run(self, seqs) -> torch.Tensor:
        """The hidden states [len(seqs), hidden] of a decode step: each sequence's next position."""
        size = self.fill(seqs)
        self.graphs[size].replay()
        return self.outputs[size][: len(seqs)]

    def fill(self, seqs) -> int:
        """Copy a decode step's inputs into the static buffers, padding to the smallest bucket that
        holds them; returns that bucket."""
        n, bs = len(seqs), self.block_size
        size = next(s for s in self.sizes if s >= n)
        ids, positions, lens = [], [], []
        slots = [[] for _ in range(self.layout.num_groups)]
        width = max(len(t) for s in seqs for t in s.block_tables)
        rows = [[t + [0] * (width - len(t)) for t in (s.block_tables[g] for s in seqs)]
                for g in range(self.layout.num_groups)]
        for seq in seqs:
            p = seq.num_computed_tokens
            ids.append(seq.token_ids[p])
            positions.append(p)
            lens.append(p + 1)
            for g, table in enumerate(seq.block_tables):
                slots[g].append(table[p // bs] * bs + p % bs)
        pad = size - n
        self.ids[:size].copy_(torch.tensor(ids + [0] * pad))
        self.positions[:size].copy_(torch.tensor(positions + [0] * pad))
        self.seq_lens[:size].copy_(torch.tensor(lens + [1] * pad, dtype=torch.int32))
        self.slots[:, :size].copy_(torch.tensor([s + [PAD_SLOT] * pad for s in slots]))
        self.tables[:, :n, :width].copy_(torch.tensor(rows, dtype=torch.int32))
        if pad:
            self.tables[:, n:size, 0] = 0
        return size
