"""Worker processes for the recipes' training data (rill-tiny's rows, rill-tiny-speech's clips,
rill-tiny-vision's pictures), started from a fork server instead of forked from the caller.

The caller may already run threads: torch's intra-op pool, the tokenizers library's pool, a test's
servers. A child forked from such a process inherits their locks in whatever state they were in,
and can hang or crash (a tokenizers call in a forked child died of a segfault in the middle of a
test run). The fork server is a fresh single-threaded process; children fork from it and import
what the work they are given needs (the work travels pickled, as with any process pool).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("forkserver")


def process_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max(1, workers), mp_context=context())
