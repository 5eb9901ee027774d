"""What rank 0 sends the other ranks: typed control messages over a pipe, tensors by broadcast.

Each model call on rank 0 (a forward over the step's batch, a logits call) is repeated on every rank
with the same inputs. Its arguments (token ids, positions, the AttentionMetadata with block tables
and slot mappings) are split into a skeleton, where each tensor is a TensorSlot, and the tensors'
bytes. The skeleton goes down each rank's pipe inside the message; the bytes go in one
torch.distributed broadcast, so they travel device to device (NCCL) and never through Python.

Idle ranks wait on their pipe, not in a collective: a collective has a timeout, an idle server none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import torch

ALIGN_BYTES = 16  # every tensor starts at a multiple: a byte offset any dtype can be viewed at


class TensorSlot(msgspec.Struct, frozen=True, array_like=True):
    """A tensor's place in the broadcast buffer."""

    offset: int  # bytes
    shape: tuple[int, ...]
    dtype: torch.dtype


# -- messages down each rank's pipe (rank 0 -> rank r); replies come back up the same pipe ------------


class AllocateKV(msgspec.Struct, frozen=True):
    """Allocate the rank's share of the KV cache: the same block ids as rank 0, its own heads."""

    num_blocks: int
    block_size: int


class Forward(msgspec.Struct, frozen=True):
    """Run the decoder on (input_ids, positions, meta), rebuilt from `args` and `num_bytes` broadcast bytes."""

    args: Any
    num_bytes: int


class Logits(msgspec.Struct, frozen=True):
    """Run the LM head on (hidden,): this rank's vocabulary shard, gathered on rank 0."""

    args: Any
    num_bytes: int


class Stop(msgspec.Struct, frozen=True):
    pass


class Ready(msgspec.Struct, frozen=True):
    """Reply: the rank did what the last message asked (joined the group, loaded, allocated)."""


class Failed(msgspec.Struct, frozen=True):
    """Reply: the rank could not; `error` is its traceback. The rank exits after sending it."""

    error: str


# -- skeletons -------------------------------------------------------------------------------------------


def split(args) -> tuple[Any, list[torch.Tensor], int]:
    """args (tensors inside tuples, lists and dataclasses) -> (skeleton, tensors, buffer size in bytes).
    An object met twice (AttentionMetadata.layers repeats each KV group's metadata) is split once."""
    tensors: list[torch.Tensor] = []
    seen: dict[int, Any] = {}
    size = 0

    def walk(x):
        nonlocal size
        if id(x) in seen:
            return seen[id(x)]
        if isinstance(x, torch.Tensor):
            slot = TensorSlot(size, tuple(x.shape), x.dtype)
            tensors.append(x)
            size += _padded(x.numel() * x.element_size())
            out = slot
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            out = type(x)(**{f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
        elif isinstance(x, (tuple, list)):
            out = type(x)(walk(v) for v in x)
        else:
            return x  # ints, floats, None: sent as they are
        seen[id(x)] = out
        return out

    return walk(args), tensors, size


def pack(tensors: list[torch.Tensor], num_bytes: int, device: torch.device) -> torch.Tensor:
    """The tensors' bytes, each at its slot's offset: [num_bytes] uint8 on `device`."""
    buf = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    offset = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        buf[offset : offset + n] = t.contiguous().view(-1).view(torch.uint8)
        offset += _padded(n)
    return buf


def fill(skeleton, buf: torch.Tensor):
    """The skeleton with each TensorSlot replaced by its tensor, a view into buf."""
    seen: dict[int, Any] = {}

    def walk(x):
        if id(x) in seen:
            return seen[id(x)]
        if isinstance(x, TensorSlot):
            n = torch.Size(x.shape).numel() * x.dtype.itemsize
            out = buf[x.offset : x.offset + n].view(x.dtype).view(x.shape)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            out = type(x)(**{f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
        elif isinstance(x, (tuple, list)):
            out = type(x)(walk(v) for v in x)
        else:
            return x
        seen[id(x)] = out
        return out

    return walk(skeleton)


def _padded(num_bytes: int) -> int:
    return -(-num_bytes // ALIGN_BYTES) * ALIGN_BYTES
