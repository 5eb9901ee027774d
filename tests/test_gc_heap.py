"""rill.gc_heap: the startup heap leaves the collector's walks; what comes later is still collected.
Run in a subprocess, so that this test process's own heap is not frozen by it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, weakref
    from rill.gc_heap import freeze_startup_heap

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return a

    before = cycle()
    assert any(o is before for o in gc.get_objects())
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() > 1000, frozen  # the interpreter's and rill's imports at least
    assert not any(o is before for o in gc.get_objects())  # out of every generation the collector walks

    later = cycle()
    gone = weakref.ref(later)
    del later
    gc.collect()
    assert gone() is None  # cyclic garbage made after the freeze is still collected
    print("ok", frozen)
""")


def test_freeze_takes_the_startup_heap_out_of_collections_and_later_cycles_are_still_collected():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
