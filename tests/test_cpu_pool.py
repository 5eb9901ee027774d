"""The C kernels' thread pool (kernels/cpu_pool.c) as the engine meets it: any number of threads gives the
same bits, two Python threads calling kernels at once (the second runs its chunks alone) get what each gets
alone, a forked child (a process pool started after the kernels ran) can still call them, and every thread
the pool starts is accounted for."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
import torch

from rill.kernels import cpu_attn, cpu_build, cpu_glue, cpu_linear

pytestmark = pytest.mark.skipif(cpu_build.library() is None, reason="rill's C kernels are not built here")


def with_threads(n, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def workload(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(1300, 200, generator=gen) / 14).to(dtype)
    packed = cpu_linear.pack(w)
    x = torch.randn(37, 200, generator=gen).to(dtype)
    gate_up = torch.randn(300, 2 * 260, generator=gen).to(dtype)
    return lambda: (cpu_linear.linear(x, packed), cpu_glue.silu_mul(gate_up))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_threads_than_cores_compute_the_same_bits(dtype):
    run = workload(dtype)
    one = with_threads(1, run)
    for n in (2, 3, 8):
        got = with_threads(n, run)
        assert all(torch.equal(a, b) for a, b in zip(got, one)), n


def test_two_python_threads_calling_at_once_each_get_what_they_get_alone():
    runs = [workload(torch.float32, 1), workload(torch.bfloat16, 2)]
    alone = [run() for run in runs]
    errors: list[str] = []

    def hammer(i):
        for _ in range(30):
            got = runs[i]()
            if not all(torch.equal(a, b) for a, b in zip(got, alone[i])):
                errors.append(f"thread {i} differs")

    threads = [threading.Thread(target=hammer, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def _child(queue):
    torch.set_num_threads(1)  # torch's OpenMP pool is not usable in a forked child (libgomp hangs); rill's is
    run = workload(torch.bfloat16)
    got = with_threads_in_kernels(2, run)
    queue.put([t.tolist() for t in got])


def with_threads_in_kernels(n, fn):
    """fn with the kernels asked for n threads and torch kept at its count (the child's must stay 1)."""
    real = torch.get_num_threads
    torch.get_num_threads = lambda: n  # what the kernels' callers read (torch's own ops keep their count)
    try:
        return fn()
    finally:
        torch.get_num_threads = real


@pytest.mark.skipif(os.name != "posix", reason="fork")
def test_a_forked_child_runs_the_kernels_without_the_parents_workers():
    run = workload(torch.bfloat16)
    want = with_threads(2, run)  # the parent's pool has started its worker
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    got = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert all(torch.equal(torch.tensor(g, dtype=torch.float32), w.float()) for g, w in zip(got, want))


def test_decode_attention_through_the_pool_at_any_thread_count():
    gen = torch.Generator().manual_seed(5)
    k = torch.randn(40, 16, 2, 64, generator=gen)
    v = torch.randn(40, 16, 2, 64, generator=gen)
    tables = torch.randperm(40, generator=gen).to(torch.int32).view(5, 8)
    lens = torch.tensor([1, 30, 128, 77, 5], dtype=torch.int32)
    q = torch.randn(5, 6, 64, generator=gen)
    for dtype in (torch.float32, torch.bfloat16):
        args = (q.to(dtype), k.to(dtype), v.to(dtype), tables, lens, 0.125, None, None)
        one = with_threads(1, lambda: cpu_attn.decode(*args))
        for n in (2, 5):
            assert torch.equal(with_threads(n, lambda: cpu_attn.decode(*args)), one), (dtype, n)


def test_the_pool_starts_at_most_threads_minus_one_workers():
    before = threading.active_count()  # Python does not see the pool's pthreads: count the process's tasks
    tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    with_threads(4, workload(torch.float32))
    if tasks is not None:
        assert len(os.listdir("/proc/self/task")) - tasks <= 3
    assert threading.active_count() == before
