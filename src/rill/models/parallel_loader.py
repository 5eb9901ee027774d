"""Load one tensor-parallel rank's shard of a local Hugging Face model directory.

The same checkpoint tensors fill the same parameters as in loader.py; each is sliced to the rank's
part first (models/parallel.py says which part): column-parallel tensors by rows, row-parallel ones
by columns, the vocabulary by rows (zero-padded to an equal share), the rest whole. Phi-3's fused
qkv_proj and gate_up_proj are split into their parts at the whole model's sizes, then each sliced.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rill.distributed.group import TPGroup
from rill.errors import ModelLoadError
from rill.models.config import ModelConfig
from rill.models.loader import _Checkpoint, _checkpoint_parts, _model_class, _text_prefix
from rill.models.parallel import padded_vocab_per_rank, parallelize, shard_config
from rill.models.rope import RotaryEmbedding


class RankSlicer:
    """Which part of each checkpoint tensor rank `rank` of `size` holds."""

    def __init__(self, cfg: ModelConfig, rank: int, size: int):
        self.cfg, self.rank, self.size = cfg, rank, size
        self.q_rows = cfg.num_heads * cfg.head_dim
        self.kv_rows = cfg.num_kv_heads * cfg.head_dim
        heads = max(1, cfg.num_kv_heads // size)  # replicated when fewer KV heads than ranks
        first = rank * cfg.num_kv_heads // size if cfg.num_kv_heads < size else rank * heads
        self.kv_span = (first * cfg.head_dim, (first + heads) * cfg.head_dim)

    def __call__(self, name: str, source: str, tensor: torch.Tensor) -> torch.Tensor:
        """The rank's part of checkpoint tensor `source`, which fills (part of) our parameter `name`."""
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            return self._vocab_rows(tensor)
        if ".qkv_proj." in name:
            return self._qkv(source, tensor)
        if ".gate_up_proj" in name:  # the dense MLP's and the experts'
            if source.endswith(("gate_up_proj.weight", "gate_up_proj.bias")):  # Phi-3: stored fused
                return torch.cat([self._chunk(part, 0) for part in tensor.chunk(2, dim=0)])
            return self._chunk(tensor, 0)
        if name.endswith(("o_proj.weight", "mlp.down_proj.weight", "experts.down_proj")):
            return self._chunk(tensor, 1)
        return tensor  # norms, routers, the row-parallel layers' biases: whole on every rank

    def _chunk(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        return tensor.chunk(self.size, dim=dim)[self.rank]

    def _qkv(self, source: str, tensor: torch.Tensor) -> torch.Tensor:
        if source.endswith(("qkv_proj.weight", "qkv_proj.bias")):  # Phi-3: q, k, v rows stored fused
            q, k, v = tensor.split([self.q_rows, self.kv_rows, self.kv_rows], dim=0)
            return torch.cat([self._chunk(q, 0), self._kv(k), self._kv(v)])
        if ".q_proj." in source:
            return self._chunk(tensor, 0)
        return self._kv(tensor)

    def _kv(self, tensor: torch.Tensor) -> torch.Tensor:
        begin, end = self.kv_span
        return tensor[begin:end]

    def _vocab_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = padded_vocab_per_rank(self.cfg.vocab_size, self.size)
        part = tensor[self.rank * rows : (self.rank + 1) * rows]
        if part.shape[0] == rows:
            return part
        return torch.cat([part, part.new_zeros(rows - part.shape[0], *part.shape[1:])])


def load_model_shard(model_dir: Path, cfg: ModelConfig, group: TPGroup) -> torch.nn.Module:
    """Rank group.rank's decoder: built at the rank's size, row-parallel modules in, weights sliced."""
    ckpt = _Checkpoint(model_dir)
    with torch.device("meta"):
        model = _model_class(cfg)(shard_config(cfg, group.size))
        parallelize(model, cfg, group)
    model = model.to_empty(device=group.device).to(cfg.dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    for rotary in (m for m in model.modules() if isinstance(m, RotaryEmbedding)):
        rotary.inv_freq = rotary.frequencies().to(group.device)
    slicer, text_prefix = RankSlicer(cfg, group.rank, group.size), _text_prefix(ckpt)
    for name, param in model.named_parameters():  # a tied head is the embedding: listed once
        if name == "lm_head.weight" and "lm_head.weight" not in ckpt:
            raise ModelLoadError(f"{model_dir}: 'lm_head.weight' missing and tie_word_embeddings is false")
        _load_slices(param, name, ckpt, cfg, text_prefix, slicer)
    return model.eval()


def _load_slices(param, name: str, ckpt: _Checkpoint, cfg: ModelConfig, text_prefix: str, slicer: RankSlicer):
    target = param.flatten(0, 1) if param.dim() == 3 else param  # stacked experts [E, rows, cols]: row-wise
    parts = [slicer(name, src, ckpt.get(src)) for src, _ in _checkpoint_parts(name, 0, ckpt, cfg, text_prefix)]
    value = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    if value.shape != target.shape:
        raise ModelLoadError(f"shape mismatch for '{name}' on tensor-parallel rank {slicer.rank}: the checkpoint's "
                             f"slice is {tuple(value.shape)}, the rank's parameter {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(value.to(param.dtype))
