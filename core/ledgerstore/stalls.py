"""Per-second peaks of what can stall a process: where the worst add latency of a second went.

A :class:`PeakWindow` keeps, for each named component (``loop_lag``, ``journal_fsync``,
``checkpoint``, ``gc_gen2``, ...), the longest duration observed in each of the last
``WINDOW_S`` seconds. Seconds are wall-clock seconds (``int(time.time())``) of when the observed
work *began*, so the windows of several processes on one machine line up with each other and
with a benchmark's own per-second figures. An observation is one ring-slot update (no lock):
the components are observed once per journal group, checkpoint, write-back sync, collection or
probe tick, never per entry, and each is observed by one thread, except the garbage collector,
which runs on whichever thread allocates (a race there can lose one observation, never corrupt
the window).

:data:`peaks` is the process's window: a bookie process (``ledgerstore bookie``) records into it
and serves it as ``GET /api/v1/bookie/stalls``; ``benchmarks/run_all.py`` reads it from every
bookie to say, for the worst seconds of its latency row, which component took them. Storage
engine plugins may record their own background work into it (the entrylog engine's
``writeback_sync``).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

#: seconds of history a window keeps
WINDOW_S = 180
#: the loop-lag probe's timer: a stall of the event loop longer than this is seen
LOOP_LAG_PROBE_S = 0.01


class PeakWindow:
    """Rolling per-second maxima of durations (seconds), by component."""

    __slots__ = ("size", "_rings")

    def __init__(self, size: int = WINDOW_S) -> None:
        self.size = size
        self._rings: dict[str, list[tuple[int, float]]] = {}

    def observe(self, component: str, seconds: float, began: float | None = None) -> None:
        """Count a duration of ``component`` that began at wall-clock time ``began`` (now minus
        ``seconds`` when not given)."""
        sec = int((time.time() - seconds) if began is None else began)
        ring = self._rings.get(component)
        if ring is None:
            ring = self._rings.setdefault(component, [(-1, 0.0)] * self.size)
        i = sec % self.size
        s, v = ring[i]
        if s != sec or seconds > v:
            ring[i] = (sec, seconds)

    def snapshot(self, since: int = 0) -> dict[str, dict[int, float]]:
        """``{component: {second: peak seconds}}`` for the seconds from ``since`` on."""
        out: dict[str, dict[int, float]] = {}
        for name, ring in list(self._rings.items()):
            out[name] = {s: v for s, v in list(ring) if s >= since and s >= 0}
        return out

    def clear(self) -> None:
        """Forget everything observed."""
        self._rings.clear()


#: the process's window (one bookie per process in production and in benchmarks)
peaks = PeakWindow()


async def probe_loop_lag(window: PeakWindow = peaks, interval: float = LOOP_LAG_PROBE_S,
                         component: str = "loop_lag") -> None:
    """Until cancelled: a timer every ``interval``; how much later than asked it fires is how long
    something held the event loop (a slow callback, a blocking call, a GIL-holding thread)."""
    perf, wall = time.perf_counter, time.time
    while True:
        t0 = perf()
        await asyncio.sleep(interval)
        lag = perf() - t0 - interval
        if lag > 0.0:
            window.observe(component, lag, wall() - lag)


def watch_gc(window: PeakWindow = peaks) -> Callable[[], None]:
    """Record the garbage collector's pauses as ``gc_gen0``, ``gc_gen1`` and ``gc_gen2`` (every
    thread stops while it runs). Returns the function that stops watching."""
    started = [0.0]
    perf, wall = time.perf_counter, time.time
    names = ("gc_gen0", "gc_gen1", "gc_gen2")

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = perf()
        elif started[0]:
            took = perf() - started[0]
            started[0] = 0.0
            window.observe(names[min(int(info.get("generation", 0)), 2)], took, wall() - took)

    gc.callbacks.append(callback)

    def stop() -> None:
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)

    return stop


def attribute(worst_ms: list[float], start: float, windows: dict[str, dict[str, dict[int, float]]],
              top: int = 5, min_ms: float = 1.0) -> list[dict[str, Any]]:
    """For the ``top`` seconds with the highest ``worst_ms`` (second ``i`` begins at wall-clock
    ``start + i``): the peaks of every process's components in that second and the one before
    (work that began late in the previous second delays adds due in this one), largest first.
    ``windows`` maps a process name to its :meth:`PeakWindow.snapshot`."""
    order = sorted(range(len(worst_ms)), key=lambda i: worst_ms[i], reverse=True)[:top]
    out = []
    for i in order:
        sec = int(start + i)
        found: list[tuple[float, str]] = []
        for proc, comps in windows.items():
            for name, by_sec in comps.items():
                v = max(by_sec.get(sec, 0.0), by_sec.get(sec - 1, 0.0))
                if v * 1000.0 >= min_ms:
                    found.append((v * 1000.0, f"{proc}.{name}"))
        found.sort(reverse=True)
        out.append({"second": i, "worst_add_ms": worst_ms[i],
                    "peaks_ms": {name: round(ms, 1) for ms, name in found[:8]}})
    return out
