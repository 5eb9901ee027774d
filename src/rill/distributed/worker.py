"""A tensor-parallel rank other than 0: a process rank 0 spawns, which repeats rank 0's model calls.

It joins the group, loads its shard, allocates its share of the KV cache when told, then loops: a
message from its pipe, the tensors from the broadcast, the same call on its shard. It owns no
scheduler and no sampler; its KV cache takes the block ids rank 0's block manager gave.

It exits when told to (Stop), when its pipe closes, when rank 0's process is gone (a thread watches
the parent: a rank blocked in an NCCL collective would otherwise outlive it), and on any error,
after reporting it up the pipe when it still can.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import msgspec
import torch

from rill.distributed import wire
from rill.distributed.group import TPGroup, rank_device
from rill.engine.kv_layout import KVLayout
from rill.engine.model_runner import ModelRunner
from rill.models.dtype_choice import load_config_for_device
from rill.models.loader import load_generation_config, resolve_model_dir
from rill.models.parallel_loader import load_model_shard

PARENT_POLL_S = 1.0


class WorkerSpec(msgspec.Struct, frozen=True):
    """What a spawned rank needs to start (pickled into the child by multiprocessing)."""

    config: object  # rill.config.EngineConfig
    rank: int
    size: int
    store_port: int
    parent_pid: int
    num_threads: int


def worker_main(spec: WorkerSpec, conn) -> None:
    """The spawned process's entry point."""
    _watch_parent(spec.parent_pid)
    torch.set_num_threads(spec.num_threads)
    try:
        _serve(spec, conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # rank 0 is gone or closed the pipe: nothing to report to
    except BaseException:
        error = traceback.format_exc()
        sys.stderr.write(f"rill: tensor-parallel rank {spec.rank} failed:\n{error}")  # into rank 0's log
        _reply(conn, wire.Failed(error))
        raise SystemExit(1) from None


def _serve(spec: WorkerSpec, conn) -> None:
    config = spec.config
    conn.send(wire.Ready())  # started: rank 0 joins the group only once every rank can
    group = TPGroup.join(spec.rank, spec.size, rank_device(config.device, spec.rank), port=spec.store_port)
    model_dir = resolve_model_dir(config.model)
    cfg = load_config_for_device(model_dir, load_generation_config(model_dir), config.dtype, config.device)
    model = load_model_shard(model_dir, cfg, group)
    conn.send(wire.Ready())
    msg = conn.recv()
    if not isinstance(msg, wire.AllocateKV):
        return
    layout = KVLayout.for_windows(cfg.layer_windows)
    kv_caches = ModelRunner(model, msg.num_blocks, msg.block_size, None, layout).kv_caches
    conn.send(wire.Ready())
    with torch.inference_mode():
        _loop(conn, group, model, kv_caches)
    group.leave()


def _loop(conn, group: TPGroup, model, kv_caches) -> None:
    while True:
        msg = conn.recv()
        if isinstance(msg, wire.Stop):
            return
        buf = torch.empty(msg.num_bytes, dtype=torch.uint8, device=group.device)
        args = wire.fill(msg.args, group.broadcast_from_first(buf))
        if isinstance(msg, wire.Forward):
            input_ids, positions, meta = args
            model(input_ids, positions, kv_caches, meta)
        else:
            (hidden,) = args
            model.compute_logits(hidden)  # its shard goes to rank 0 inside the LM head's gather


def _reply(conn, msg) -> None:
    try:
        conn.send(msg)
    except OSError:
        pass


def _watch_parent(parent_pid: int) -> None:
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # rank 0 died: whatever this rank is blocked in will never complete

    threading.Thread(target=watch, name="rill-tp-parent-watch", daemon=True).start()
