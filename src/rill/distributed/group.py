"""One engine's tensor-parallel group: this process's rank and the collectives its model shards need.

torch.distributed carries them: NCCL between GPUs, gloo between CPU processes (the tests). Rank 0 is
the engine's own process; it hosts the rendezvous store (a TCPStore on a port the OS picks, so two
engines on one machine never race for a port), and the ranks it spawns connect to it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

STORE_HOST = "127.0.0.1"  # one machine: every rank is a child of rank 0's process
STORE_TIMEOUT = datetime.timedelta(seconds=120)  # a rank that has not joined by then failed to start
# Ranks meet in a collective only inside one model call (idle ranks wait on their pipe), so a wait
# this long means a rank is stuck; a rank that dies is noticed at once (its pipe, its process).
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: str, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU after the one `device` names (cuda, cuda:0 -> cuda:r); CPU for all on CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    return torch.device("cuda", (dev.index or 0) + rank)


def master_store(world_size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a free port (store.port) the other ranks are told."""
    return dist.TCPStore(STORE_HOST, 0, world_size, is_master=True, timeout=STORE_TIMEOUT, wait_for_workers=False)


@dataclass(frozen=True)
class TPGroup:
    """The default process group of this process, seen as one engine's tensor-parallel group."""

    rank: int
    size: int
    device: torch.device

    @classmethod
    def join(cls, rank: int, size: int, device: torch.device, store: dist.Store | None = None,
             port: int | None = None) -> TPGroup:
        """Join the group: rank 0 with its master store, the others with the store's port."""
        if dist.is_initialized():
            raise RuntimeError("this process already belongs to a torch.distributed group: one tensor-parallel "
                               "engine per process")
        if store is None:
            store = dist.TCPStore(STORE_HOST, port, size, is_master=False, timeout=STORE_TIMEOUT)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=size,
                                timeout=COLLECTIVE_TIMEOUT)
        return cls(rank, size, device)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        dist.all_reduce(x)
        return x

    def gather_to_first(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's x, in rank order, on rank 0; None on the others."""
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.is_first else None
        dist.gather(x, parts, dst=0)
        return parts

    def broadcast_from_first(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x into every rank's x (same shape and dtype), in place."""
        dist.broadcast(x, src=0)
        return x

    def abort(self) -> None:
        """Make collectives in flight fail now (a peer died). gloo fails them itself when a peer's
        connection closes; an NCCL collective would wait for its timeout, so it is aborted."""
        if self.device.type != "cuda" or not dist.is_initialized():
            return
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception:  # private API: best effort, the timeout still bounds the wait
            pass

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
