"""The startup heap, out of the garbage collector's way.

After the models load, a serving process holds a few hundred thousand long-lived objects (modules,
torch and transformers' Python objects, tokenizer tables) that will never be garbage. CPython's
oldest-generation collection walks every one of them, with the GIL held, so every thread stops:
under `rill bench scheduler` (256 decoding requests) those collections took 300-650 ms each on a
2-core machine, the whole of the p99 of a step's way to trio. `gc.freeze()` moves everything alive
into a permanent generation that collections skip; what requests create later is still collected
as before. vLLM's API server and engine core do the same after start-up.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("rill.server")


def freeze_startup_heap() -> int:
    """Collect once, then exempt every surviving object from later collections. Returns how many
    objects are frozen now. Call it once a server's engines have loaded, not per request: objects
    frozen here that later become cyclic garbage are never freed."""
    gc.collect()
    gc.freeze()
    count = gc.get_freeze_count()
    log.debug("froze the startup heap: %d objects outside the collector's walks", count)
    return count


def thaw_heap() -> None:
    """Give the frozen objects back to the collector, as a server stops: the interpreter's exit then
    finalizes them as usual (frozen, extension types built on nanobind, Triton's among them, print a
    list of "leaked" objects at exit)."""
    gc.unfreeze()
