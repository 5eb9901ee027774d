"""Images and video inside the engine step: the encoder budget, the encoder cache, M-RoPE positions.

The scheduler asks `clip` for each sequence with images before it takes a chunk: an item whose
placeholders fall in the chunk must be encoded in this step unless the encoder cache has it, and
the step's encoder budget (in output embeddings, as vLLM counts it) bounds how many are. An item
that does not fit ends the chunk just before its placeholders, so one large image cannot stall the
step for everyone's decode; an item larger than the whole budget runs alone in a step. Then
`prepare` runs the vision tower over the step's items (on the worker thread, inside the step) and
hands the model the rows whose token embeddings the encoder's output replaces, and every token's
three M-RoPE positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rill.engine.encoder_cache import EncoderCache
from rill.engine.scheduler import ScheduledBatch
from rill.engine.sequence import Sequence
from rill.multimodal.inputs import MultiModalItem


@dataclass(frozen=True)
class VisionInputs:
    """What a step with images gives the model besides token ids."""

    positions: torch.Tensor  # [3, T] M-RoPE positions of the step's tokens
    embeds: tuple[torch.Tensor, torch.Tensor] | None  # (rows [K], embeddings [K, hidden]) or None


class VisionStep:
    def __init__(self, model, cache: EncoderCache, budget_tokens: int):
        self.model = model
        self.cache = cache
        self.budget_tokens = budget_tokens
        self.budget = budget_tokens
        self.to_encode: dict[str, MultiModalItem] = {}  # this step's encoder work, by content hash
        self.num_step_tokens = 0  # embeddings the encoder computed in this step
        self.num_encoded_tokens = 0  # ... in all steps

    def begin(self) -> None:
        """A new step: the whole budget, nothing to encode yet."""
        self.budget = self.budget_tokens
        self.to_encode = {}
        self.num_step_tokens = 0

    def clip(self, seq: Sequence, begin: int, num_new: int) -> int:
        """How many of seq's tokens [begin, begin + num_new) the step may compute, taking (and
        holding) the encoder work their items need."""
        end = begin + num_new
        for item in seq.mm_items:
            if item.end <= begin or item.offset >= end:
                continue
            key = item.content_hash
            miss = key not in self.cache and key not in self.to_encode
            if miss:
                if self.to_encode and item.num_tokens > self.budget:
                    return max(0, item.offset - begin)  # the rest waits for a later step's budget
                self.budget -= item.num_tokens
                self.to_encode[key] = item
            if self.cache.acquire(key, id(seq)):  # the sequence's first look at the item: count it
                self.cache.count_lookup(hit=not miss)
        return num_new

    def prepare(self, batch: ScheduledBatch) -> VisionInputs:
        self._encode()
        positions, rows, embeds, row = [], [], [], 0
        for seq, n, begin in zip(batch.seqs, batch.num_new_tokens, batch.num_computed):
            end = begin + n
            if seq.mrope is None:
                positions.append(torch.arange(begin, end).expand(3, -1))
            else:
                positions.append(seq.mrope.positions(begin, end))
            for item in seq.mm_items:
                lo, hi = max(begin, item.offset), min(end, item.end)
                if lo < hi:
                    rows.append(torch.arange(row + lo - begin, row + hi - begin))
                    embeds.append(self.cache.get(item.content_hash)[lo - item.offset : hi - item.offset])
            row += n
        device = self.model.embed_tokens.weight.device
        pos = torch.cat(positions, dim=1).to(device)
        if not rows:
            return VisionInputs(pos, None)
        return VisionInputs(pos, (torch.cat(rows).to(device), torch.cat(embeds)))

    def _encode(self) -> None:
        items = list(self.to_encode.values())
        self.to_encode = {}
        if not items:
            return
        out = self.model.encode(torch.cat([it.pixels for it in items]), [it.grid_thw for it in items])
        self.num_step_tokens = out.shape[0]
        self.num_encoded_tokens += out.shape[0]
        for item, embeddings in zip(items, out.split([it.num_tokens for it in items])):
            self.cache.put(item.content_hash, embeddings)

    def after_step(self, batch: ScheduledBatch) -> None:
        """Items whose placeholders are all in a sequence's KV cache: it holds them no longer."""
        for seq in batch.seqs:
            for item in seq.mm_items:
                if item.end <= seq.num_computed_tokens:
                    self.cache.release(item.content_hash, id(seq))

    def release(self, seq: Sequence) -> None:
        """seq finished, was aborted or preempted: it holds none of its items."""
        for item in seq.mm_items:
            self.cache.release(item.content_hash, id(seq))


def start_vision(model_dir, model_config, model, config):
    """(the model's image and video processor, the engine's VisionStep) for a model with a vision tower."""
    from rill.multimodal.qwen2_vl_inputs import Qwen2VLInputs

    budget = config.max_num_encoder_tokens or config.max_num_batched_tokens
    cache = EncoderCache(config.encoder_cache_tokens or 4 * budget)
    if model_config.architecture == "LlavaForConditionalGeneration":
        from rill.multimodal.llava_inputs import LlavaInputs

        return LlavaInputs.from_dir(model_dir, model_config.vision), VisionStep(model, cache, budget)
    return Qwen2VLInputs.from_dir(model_dir, model_config.vision), VisionStep(model, cache, budget)
