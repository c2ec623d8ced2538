"""Disk faults in the simulation: a bookie's ledger disk fails writes (EIO, or ENOSPC which the
bookie takes for a full disk) or returns entries with a flipped bit, for a few seconds at a time.

The faults live on the bookie's :class:`~ledgerstore.sim.disk.EngineDisk` (see
:class:`~ledgerstore.sim.disk.DiskFaults`) and hit the process running when they were drawn: a
bookie that crashes and restarts replays its journal on a disk that works (a restart that
cannot replay is a bookie that stays down, which the schedule counts as a failure). A flipped
bit must never reach an application: the entry's digest fails and the client reads it from
another replica; the schedule's final checks read every acknowledged entry back with its
payload, and :attr:`DiskFaultSchedule.stats` counts the flipped reads served.
"""

from __future__ import annotations

import asyncio

from ledgerstore.sim.disk import DiskFaults
from ledgerstore.sim.logs import RunView
from ledgerstore.sim.world import SimBookie

#: the kinds of disk fault, drawn with these weights
KINDS = ("eio", "enospc", "flip", "flip")


class DiskFaultSchedule:
    """Draws disk faults on the bookies from the seed while the run lasts (:meth:`start`)."""

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.world = run.world
        self.loop = run.world.loop
        self.rng = run.world.rng_for("disk-faults")
        self.stats: dict[str, int] = {"disk_faults": 0}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Draw faults from now until the end of the run (when the run's fault kinds allow
        crashes: a failing disk is a fault of the machine, as a crash is)."""
        if "crash" in self.run.kinds:
            self._task = self.loop.create_task(self._draw(), name="disk-faults")

    async def _draw(self) -> None:
        rng = self.rng
        until = self.run.duration * 0.9
        n = 0
        while True:
            await asyncio.sleep(rng.expovariate(1 / 8.0))
            if self.loop.time() > until or self.run.healed:
                return
            node = rng.choice(self.world.bookies)
            kind = rng.choice(KINDS)
            p = rng.choice((0.05, 0.3, 1.0))
            hold = min(rng.uniform(0.5, 10.0), self.run.duration - self.loop.time())
            n += 1
            engine = node.engine()
            if engine is None:
                continue  # the bookie is down: its disk is not in use
            faults = DiskFaults(write_error=0.0 if kind == "flip" else p, full=kind == "enospc",
                                flip=p if kind == "flip" else 0.0, rng=self.world.rng_for(f"{node.name}.disk.{n}"),
                                engine=engine)
            node.engine_disk.faults = faults
            self.stats["disk_faults"] += 1
            self.world.trace("disk.fault", f"{node.name} {kind} p={p:g} for {hold:.3f}s")
            self.loop.call_later(hold, self._clear, node, faults)

    def _clear(self, node: SimBookie, faults: DiskFaults) -> None:
        if node.engine_disk.faults is faults:
            node.engine_disk.faults = DiskFaults()
            self.world.trace("disk.healed", node.name)

    def flipped(self) -> int:
        """Reads answered with a flipped bit by the bookies running now."""
        return sum(e.flipped for b in self.world.bookies if (e := b.engine()) is not None)
