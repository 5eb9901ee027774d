"""Rank 0's handle on the ranks it spawns: their processes, one pipe each, and a watch on both.

A rank that exits while the engine runs is a failure: a monitor thread waiting on the processes'
sentinels records a RankFailedError at once and tells whoever registered (the async engine, which
then fails every request as a dead engine does), so an engine whose ranks died never waits on them.
A rank blocked in a collective with a dead peer gets an error from gloo; NCCL's collectives are
aborted by the monitor.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp

from rill.distributed import wire
from rill.distributed.group import master_store
from rill.distributed.worker import WorkerSpec, worker_main
from rill.errors import RankFailedError

log = logging.getLogger("rill.distributed")

STOP_TIMEOUT_S = 10.0  # a rank told to stop gets this long before it is terminated
DEATH_GRACE_S = 1.0  # after a collective failed: how long a peer may take to finish exiting


class Ranks:
    """Ranks 1 .. size - 1 of one engine, spawned (torch.multiprocessing, spawn) on creation."""

    def __init__(self, config, size: int):
        ctx = mp.get_context("spawn")
        self.store = master_store(size)
        self.procs: list = []
        self.conns: list = []
        self.failure: RankFailedError | None = None
        self._listeners: list[Callable[[BaseException], None]] = []
        self._closing = False
        self._monitor_thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()  # wakes the monitor at close
        # Stops the ranks at close(), or at interpreter exit if nobody closed them (even mid-spawn).
        self._stop = weakref.finalize(self, _stop_all, self.procs, self.conns, self._wake_r, self._wake_w)
        threads = max(1, torch.get_num_threads() // size)
        for rank in range(1, size):
            ours, theirs = ctx.Pipe()
            spec = WorkerSpec(config, rank, size, self.store.port, os.getpid(), threads)
            proc = ctx.Process(target=worker_main, args=(spec, theirs), name=f"rill-tp-rank{rank}", daemon=True)
            proc.start()
            theirs.close()  # only the child holds its end: its death closes the pipe
            self.procs.append(proc)
            self.conns.append(ours)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def await_replies(self, doing: str) -> None:
        """Wait for every rank's Ready; raise RankFailedError if one fails or exits instead."""
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            ready = wait([conn, proc.sentinel])
            reply = conn.recv() if conn in ready and conn.poll() else None
            if isinstance(reply, wire.Ready):
                continue
            detail = _last_line(reply.error) if isinstance(reply, wire.Failed) else None
            if isinstance(reply, wire.Failed):
                log.error("tensor-parallel rank %d failed while %s:\n%s", rank, doing, reply.error)
            proc.join(1.0)
            raise RankFailedError(f"tensor-parallel rank {rank} failed while {doing}: "
                                  f"{detail or f'its process exited with code {proc.exitcode}'}")

    def send(self, msg) -> None:
        """Send msg to every rank; RankFailedError if one is gone."""
        if self.failure is not None:
            raise self.failure
        try:
            for conn in self.conns:
                conn.send(msg)
        except OSError as exc:
            raise self.death(exc) or exc from exc

    def death(self, exc: BaseException) -> RankFailedError | None:
        """The error to raise for exc (a broken pipe, a collective that failed) when a rank died:
        which rank. None when every rank lives (exc is rank 0's own)."""
        if self.failure is not None:
            return self.failure
        dead = self._exited(DEATH_GRACE_S)  # a peer's socket closes as it exits: allow it to finish
        return None if dead is None else _rank_exited(*dead, cause=f": {exc}")

    def _exited(self, timeout: float | None) -> tuple[int, object] | None:
        """(rank, process) of a rank that has exited, waiting up to timeout for one; None if none did.
        Read from the sentinels: is_alive() would race with the monitor thread's reaping."""
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.procs, start=1)}
        ready = wait(list(sentinels), timeout)
        return next((sentinels[s] for s in ready), None)

    def watch(self, on_failure: Callable[[BaseException], None]) -> None:
        """on_failure(error), from the monitor thread, when a rank dies (at once if one has)."""
        self._listeners.append(on_failure)
        if self.failure is not None:
            on_failure(self.failure)

    def start_monitor(self, on_death: Callable[[], None]) -> None:
        """Watch the ranks from now on; on_death() runs in the monitor thread after a rank dies."""
        self._monitor_thread = threading.Thread(target=self._monitor, args=(on_death,), name="rill-tp-monitor",
                                                daemon=True)
        self._monitor_thread.start()

    def _monitor(self, on_death: Callable[[], None]) -> None:
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.procs, start=1)}
        ready = wait([*sentinels, self._wake_r])
        if self._closing or self._wake_r in ready:
            return
        rank, proc = next(sentinels[s] for s in ready if s in sentinels)
        self.failure = _rank_exited(rank, proc, _reported(self.conns[rank - 1]))
        log.error("%s: the engine is dead", self.failure)
        on_death()
        for listener in self._listeners:
            listener(self.failure)

    def close(self) -> None:
        """Stop every rank (Stop, then terminate past STOP_TIMEOUT_S); idempotent."""
        if self._closing:
            return
        self._closing = True
        os.write(self._wake_w, b"x")
        if self._monitor_thread is not None:
            self._monitor_thread.join()
        self._stop()


def _stop_all(procs, conns, wake_r: int, wake_w: int) -> None:
    os.write(wake_w, b"x")  # (again, at interpreter exit: a monitor may still wait)
    for conn in conns:
        try:
            conn.send(wire.Stop())
        except OSError:
            pass  # already gone
    for proc in procs:
        proc.join(STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.terminate()
            proc.join(STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
    os.close(wake_r)
    os.close(wake_w)


def _reported(conn) -> str:
    """': <the error>' when the rank sent Failed before exiting, else ''."""
    try:
        reply = conn.recv() if conn.poll() else None
    except (EOFError, OSError):
        return ""
    return f": {_last_line(reply.error)}" if isinstance(reply, wire.Failed) else ""


def _rank_exited(rank: int, proc, cause: str = "") -> RankFailedError:
    proc.join(1.0)  # reaped here or by another thread: its exit code is known after either
    code = "" if proc.exitcode is None else f" with code {proc.exitcode}"
    return RankFailedError(f"tensor-parallel rank {rank} (pid {proc.pid}) exited{code}{cause}")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text
