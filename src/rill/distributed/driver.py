"""Rank 0's decoder in a tensor-parallel engine: its own shard, and the other ranks' which repeat its calls.

EngineCore and ModelRunner use it as they use a one-process decoder (config, embed_tokens, a call
over the step's batch, compute_logits): the scheduler, block manager, sampler and detokenizer run
on rank 0 only. Before each call runs on rank 0's shard, its inputs go to the other ranks
(wire.py: a message down each pipe, the tensors in one broadcast), as vLLM's driver worker
broadcasts each step's model input and nano-vllm's rank 0 hands its workers the step's batch.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from rill.distributed import wire
from rill.distributed.group import TPGroup, rank_device
from rill.distributed.ranks import Ranks
from rill.errors import ModelLoadError
from rill.models.attention import AttentionMetadata
from rill.models.dtype_choice import load_config_for_device
from rill.models.loader import load_generation_config, resolve_model_dir
from rill.models.parallel import check_divisible
from rill.models.parallel_loader import load_model_shard


class TensorParallelModel:
    def __init__(self, model: torch.nn.Module, group: TPGroup, ranks: Ranks):
        self.model, self.group, self.ranks = model, group, ranks
        self.config = model.config  # rank 0's shard: its heads size the KV cache ModelRunner allocates

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.embed_tokens

    @property
    def size(self) -> int:
        return self.group.size

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches,
                 meta: AttentionMetadata) -> torch.Tensor:
        # input_ids, positions: [T] -> hidden [T, hidden], whole on every rank
        with self._rank_deaths():
            self._send(wire.Forward, (input_ids, positions, meta))
            return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden [N, hidden] -> [N, vocab] on rank 0. Every rank holds the same hidden states, but
        # only rank 0 knows which rows the sampler wants: it sends them (N x hidden, one all-reduce's size).
        with self._rank_deaths():
            self._send(wire.Logits, (hidden,))
            return self.model.compute_logits(hidden)

    @contextmanager
    def _rank_deaths(self):
        """A collective that failed because a rank died raises RankFailedError naming the rank."""
        try:
            yield
        except RuntimeError as exc:
            death = self.ranks.death(exc)
            if death is None:
                raise
            raise death from exc

    def _send(self, kind, args) -> None:
        skeleton, tensors, num_bytes = wire.split(args)
        buf = wire.pack(tensors, num_bytes, self.group.device)
        self.ranks.send(kind(skeleton, num_bytes))
        self.group.broadcast_from_first(buf)

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Have the other ranks allocate their shares of the KV cache (rank 0's is ModelRunner's), then
        start watching them."""
        self.ranks.send(wire.AllocateKV(num_blocks, block_size))
        self.ranks.await_replies("allocating its KV cache")
        self.ranks.start_monitor(self.group.abort)

    def watch(self, on_failure) -> None:
        """on_failure(error) from another thread when a rank dies."""
        self.ranks.watch(on_failure)

    def close(self) -> None:
        """Stop the other ranks and leave the group; idempotent."""
        self.ranks.close()
        self.group.leave()


def load_tensor_parallel(config) -> tuple:
    """loader.load's (model_dir, model config, generation config, decoder) for config.tensor_parallel_size
    ranks: rank 0's shard loaded here while the spawned ranks load theirs."""
    size = config.tensor_parallel_size
    model_dir = resolve_model_dir(config.model)
    generation = load_generation_config(model_dir)
    cfg = load_config_for_device(model_dir, generation, config.dtype, config.device)
    if getattr(cfg, "vision", None) is not None:
        raise ModelLoadError(f"{model_dir}: tensor parallelism does not support vision models yet")
    check_divisible(cfg, size)  # before any process starts
    ranks = Ranks(config, size)
    group = None
    try:
        ranks.await_replies("starting")
        group = TPGroup.join(0, size, rank_device(config.device, 0), store=ranks.store)
        model = load_model_shard(model_dir, cfg, group)
        ranks.await_replies("loading its shard of the model")
    except BaseException:
        ranks.close()
        if group is not None:
            group.leave()
        raise
    return model_dir, cfg, generation, TensorParallelModel(model, group, ranks)
