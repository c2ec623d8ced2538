"""Process-level runtime choices."""

from __future__ import annotations

import asyncio
import gc


def install_fast_loop() -> bool:
    """Use uvloop's event loop when it is installed (the ``fast`` extra). Returns whether it is."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


#: young-generation threshold of :func:`tune_gc` (CPython's default is 700)
GC_THRESHOLD0 = 100_000


def tune_gc(threshold0: int = GC_THRESHOLD0) -> None:
    """Make the cyclic garbage collector cheaper for a process that moves many entries.

    A pipelining writer or a busy bookie allocates several container objects per entry (pending
    adds, futures, tuples); with CPython's default thresholds a young collection runs every 700
    of them and the older generations, which hold every outstanding add, are traversed again
    and again: 10% of a writer's CPU in profiles. This freezes the objects alive now (modules,
    configuration: collections skip them from then on) and raises the young threshold to
    ``threshold0``. Reference counting still frees almost everything at once; only cycles wait
    longer. ``ledgerstore bookie`` and ``ledgerstore bench`` call it; applications whose hot loop
    is ledgerstore's client can call it once at start-up.
    """
    gc.freeze()
    _, t1, t2 = gc.get_threshold()
    gc.set_threshold(threshold0, max(t1, 50), max(t2, 1000))
