"""Turns a scheduled batch into tensors, runs the decoder over the paged KV cache, samples."""

from __future__ import annotations

import math
import mmap
import time

import torch

from rill.engine.cuda_graphs import DecodeGraphs
from rill.engine.pooling import PoolSpan, add_pooled
from rill.engine.prompt_logprobs import MAX_ROWS_PER_PASS, PromptSpan, token_logprobs
from rill.engine.sampler import SampledToken, Sampler
from rill.engine.kv_layout import KVLayout
from rill.engine.scheduler import ScheduledBatch
from rill.engine.sequence import Sequence
from rill.models.attention import AttentionMetadata
from rill.models.llama import CausalLM
from rill.kernels import check_head_dim, cpu_build
from rill.models.linear import decode_step, pack_for_cpu
from rill.outputs import TokenLogprob
from rill.sampling_params import SamplingParams

# The warm-up's widest block table, in tokens: twice the decode kernel's smallest split
# (kernels/triton_attn.py MIN_SPLIT_TOKENS), so that it splits the keys and compiles that variant.
WARM_UP_SPLIT_TOKENS = 256


def zeroed_cache(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A KV cache tensor of zeros. On the CPU it is an anonymous mapping, whose pages the OS maps in only
    when first written, so memory grows with the blocks used rather than to the whole budget at start
    (torch.zeros writes every page: rill-tiny sat at 2.1 GB at rest). The mapping asks for transparent
    huge pages (MADV_HUGEPAGE; Linux's default THP mode, "madvise", gives them only where asked): a block's
    first write otherwise costs a fault per 4 KB page, which measured 0.58 s of a 9.3 s run of 64 prompts
    of 256 tokens in bfloat16 (the KV writes of its prefill steps; 0.09 s on pages already mapped)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    buf = mmap.mmap(-1, nbytes)  # anonymous: zero-filled
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without THP: 4 KB pages, as before
            pass
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)  # keeps buf alive


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, sampler: Sampler,
                 layout: KVLayout | None = None):
        cfg = model.config
        pack_for_cpu(model)  # float32 CPU linears run rill's C kernel (or oneDNN) on packed weights (models/linear.py)
        self.model = model
        self.block_size = block_size
        self.sampler = sampler
        self.device = model.embed_tokens.weight.device
        check_head_dim(cfg.head_dim, self.device)  # at load, not at the first attention call
        self.layout = layout or KVLayout.for_windows(cfg.layer_windows)
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        # k cache tensors for K and k for V; layer i reads its slot's (one per layer with one group)
        slots = [(zeroed_cache(shape, cfg.dtype, self.device), zeroed_cache(shape, cfg.dtype, self.device))
                 for _ in range(self.layout.layers_per_group)]
        self.kv_caches = [slots[j] for j in self.layout.layer_slot]
        self.graphs: DecodeGraphs | None = None  # capture_decode_graphs (--cuda-graphs)
        if self.device.type == "cpu" and cfg.dtype in (torch.float32, torch.bfloat16):
            cpu_build.library()  # the C kernels are built by now (pack_for_cpu), once per machine

    def capture_decode_graphs(self, max_batch: int, max_blocks: int) -> float:
        """Capture the decoder for decode steps of up to max_batch sequences whose block tables hold
        up to max_blocks entries (engine/cuda_graphs.py); returns the seconds spent."""
        if self.model.config.moe is not None:  # its expert routing reads counts on the host (models/moe.py)
            raise ValueError("CUDA graphs do not cover mixture-of-experts models yet; run without --cuda-graphs")
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the model is on {self.device}")
        graphs = DecodeGraphs(self.model, self.kv_caches, self.layout, self.block_size, max_batch, max_blocks)
        seconds = graphs.capture()
        self.graphs = graphs
        return seconds

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Run the decoder once over dummy prefills and decodes, so that the attention kernels are
        compiled at start rather than on the first requests (Triton compiles per variant on first
        launch: 3.8 s of an H200's first requests' time to first token). One sequence and two (the
        kernels no longer specialize a count of 1, kernels/triton_attn.py DYNAMIC_INTS; the second
        costs little). Writes KV only into blocks that no request holds
        yet (at start every block is free). The second decode step reads block tables padded (with
        their first block) as wide as a long context's, so that the decode kernel splits the keys and
        its split-K variant and the merge are compiled too. Returns the seconds spent."""
        t0 = time.perf_counter()
        bs, dev = self.block_size, self.device
        if self.kv_caches[0][0].shape[0] < 5:  # the dummy sequences' blocks (2 + 3) would not fit: skip
            return 0.0
        for lengths in ((bs + 1,), (bs + 1, 2 * bs + 1)):
            seqs, first = [], 0
            for i, n in enumerate(lengths):  # n prompt tokens and two more, on blocks first, first + 1, ...
                seq = Sequence(f"warm-up-{i}", 0, [0] * (n + 2), SamplingParams(max_tokens=1), block_size=bs,
                               max_tokens=1, num_kv_groups=self.layout.num_groups)
                blocks = range(first, first + -(-(n + 2) // bs))
                for table in seq.block_tables:
                    table.extend(blocks)
                first = blocks.stop
                seqs.append(seq)
            for i, step in enumerate((lengths, (1,) * len(lengths), (1,) * len(lengths))):  # prefill, 2 decodes
                if i == 2:  # the second decode reads tables as wide as a long context's: the split-K variant
                    for table in (t for seq in seqs for t in seq.block_tables):
                        table.extend([table[0]] * (-(-WARM_UP_SPLIT_TOKENS // bs) - len(table)))
                batch = ScheduledBatch()
                for seq, num_new in zip(seqs, step):
                    batch.add(seq, num_new)
                ids, pos, meta, _ = self._prepare(batch)
                self.model.compute_logits(self._forward(batch, ids, pos, meta)[-1:])
                for seq, num_new in zip(seqs, step):
                    seq.num_computed_tokens += num_new
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _prepare(self, batch: ScheduledBatch):
        if self.layout.num_groups > 1:
            return self._prepare_groups(batch)
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        starts = [0]
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
            begin = seq.num_computed_tokens
            end = begin + num_new
            input_ids.extend(seq.token_ids[begin:end])
            positions.extend(range(begin, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(begin, end))
            seq_lens.append(end)
            starts.append(starts[-1] + num_new)
        width = max(len(s.block_table) for s in batch.seqs)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in batch.seqs]
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            max_query_len=max(batch.num_new_tokens),
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos, meta, starts

    def _prepare_groups(self, batch: ScheduledBatch):
        """_prepare for a model with several KV groups: one block table and slot mapping per group,
        the slots gathered from the tables on the device rather than once per group in Python."""
        bs, dev = self.block_size, self.device
        input_ids: list[int] = []
        positions: list[int] = []
        rows: list[int] = []  # each new token's sequence
        seq_lens: list[int] = []
        starts = [0]
        for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            begin = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[begin : begin + num_new])
            positions.extend(range(begin, begin + num_new))
            rows.extend([i] * num_new)
            seq_lens.append(begin + num_new)
            starts.append(starts[-1] + num_new)
        width = max(len(s.block_tables[0]) for s in batch.seqs)
        tables = torch.tensor([[t + [0] * (width - len(t)) for t in (s.block_tables[g] for s in batch.seqs)]
                               for g in range(self.layout.num_groups)], dtype=torch.int32, device=dev)  # [G, S, W]
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        slots = tables[:, torch.tensor(rows, device=dev), pos // bs].long() * bs + pos % bs  # [G, T]
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        qsl = torch.tensor(starts, dtype=torch.int32, device=dev)
        max_q = max(batch.num_new_tokens)
        groups = [AttentionMetadata(slots[g], tables[g], lens, qsl, max_q) for g in range(self.layout.num_groups)]
        meta = AttentionMetadata(None, None, lens, qsl, max_q, layers=tuple(groups[g] for g in self.layout.layer_group))
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        return ids, pos, meta, starts

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, sampling: list[Sequence]) -> list[SampledToken]:
        """Run one step; return a sampled token for each sequence in `sampling` (a subset of batch)."""
        if self.graphs is not None and batch.mm is None and all(n == 1 for n in batch.num_new_tokens) \
                and self.graphs.fits(batch.seqs):
            hidden = self.graphs.run(batch.seqs)  # a decode step: replay its captured graph
            return self._sample(hidden, list(range(len(batch.seqs) + 1)), batch, sampling)
        ids, pos, meta, starts = self._prepare(batch)
        with decode_step(meta.max_query_len == 1):  # every sequence adds one token (models/linear.py)
            hidden = self._forward(batch, ids, pos, meta)
            return self._sample(hidden, starts, batch, sampling)

    @torch.inference_mode()
    def execute_scoring_prompts(self, batch: ScheduledBatch, sampling: list[Sequence], spans: list[PromptSpan],
                                pools: list[PoolSpan] = (),
                                ) -> tuple[list[SampledToken], list[list[TokenLogprob]]]:
        """`execute`, plus the logprobs of each span's prompt tokens (prompt_logprobs.prompt_spans) and
        the pooled hidden states of pooling requests (engine/pooling.py). A separate entry point, so
        that steps without such requests pay nothing for it."""
        ids, pos, meta, starts = self._prepare(batch)
        hidden = self._forward(batch, ids, pos, meta)
        add_pooled(hidden, pools)
        scored = [self._score(hidden[span.rows], span.target_ids, span.seq.params.prompt_logprobs) for span in spans]
        return self._sample(hidden, starts, batch, sampling), scored

    def _forward(self, batch: ScheduledBatch, ids, pos, meta) -> torch.Tensor:
        if batch.mm is None:
            return self.model(ids, pos, self.kv_caches, meta)
        # a step with images: M-RoPE positions [3, T] and the encoder's rows (engine/vision_step.py)
        return self.model(ids, batch.mm.positions, self.kv_caches, meta, mm_embeds=batch.mm.embeds)

    def _score(self, hidden: torch.Tensor, target_ids: list[int], num_top: int) -> list[TokenLogprob]:
        out = []
        for i in range(0, len(target_ids), MAX_ROWS_PER_PASS):
            logits = self.model.compute_logits(hidden[i : i + MAX_ROWS_PER_PASS])[:, : self.sampler.vocab_size]
            out += token_logprobs(logits, target_ids[i : i + MAX_ROWS_PER_PASS], num_top)
        return out

    def _sample(self, hidden: torch.Tensor, starts: list[int], batch: ScheduledBatch, sampling: list[Sequence],
                ) -> list[SampledToken]:
        if not sampling:
            return []
        index = {id(seq): starts[i + 1] - 1 for i, seq in enumerate(batch.seqs)}
        last = torch.tensor([index[id(seq)] for seq in sampling], device=self.device)
        logits = self.model.compute_logits(hidden[last])
        # A Sequence has the SamplingRow fields; its token lists are only sliced if a penalty reads them.
        return self.sampler(logits, sampling)
