"""The bookie's periodic work (the checkpoint every ``flush_interval_ms``, garbage collection every
``gc_wait_time_ms``) waits a jittered interval: bookies started together, as a deploy or a local
cluster starts them, would otherwise flush and compact in the same seconds, and a write quorum
waits for the slowest bookie it names. With each bookie on its own phase, an ack quorum smaller
than the write quorum (Qa=2 of Qw=3) is answered by the bookies that are not busy."""

from __future__ import annotations

import random
from collections.abc import Iterator


def jittered(interval_s: float, jitter: float) -> Iterator[float]:
    """The waits of a timer of ``interval_s``, forever: the first a random point from half to one
    and a half of it (a phase of its own), then each ``interval_s`` times a random factor within
    ``jitter`` of 1 (so that phases keep drifting apart). ``jitter`` 0: exactly ``interval_s``
    every time, the first included. Draws from the process's :mod:`random` (seeded by the
    simulation)."""
    if jitter <= 0:
        while True:
            yield interval_s
    yield interval_s * random.uniform(0.5, 1.5)
    while True:
        yield interval_s * random.uniform(1.0 - jitter, 1.0 + jitter)
