"""Read-only bookies in the simulation: a bookie turns read-only for a spell, as when its disks
fill up or an operator switches it, through the bookie's own switch (``Bookie.set_read_only``,
which also re-registers it read-only), then writable again.

Spells come from the run's fault kind ``read-only``, drawn from a generator of their own: now
and then one bookie for a few seconds, and around recoveries a spell on bookies of the ledger's
current fragment (two of a three-bookie ensemble most often), sometimes with bookies outside it,
so that too few writable bookies are left to replace them. One spell in three lasts until the
operator frees the disks, after the final recoveries: those run with the bookies still
read-only. A spell hits the process running when it was drawn; a bookie that crashes and
restarts comes back writable, except a lasting spell's, which is switched again after the heal.

Invariant (checked by the schedule, :meth:`~ledgerstore.sim.schedule._Run.must_recover`): a
read-only bookie is a running bookie. Recovery's write-back is a recovery add, which a read-only
bookie accepts (BookKeeper's high-priority writes), so a ledger whose last fragment has no
bookie lost beyond Qa - 1 is recovered while the spells last, whatever bookies are read-only.
"""

from __future__ import annotations

import asyncio
import math

from ledgerstore.bookie.server import Bookie
from ledgerstore.errors import LedgerStoreError
from ledgerstore.sim.logs import RunView

KIND = "read-only"
#: the share of spells that last until the operator frees the disks (after the final recoveries)
LASTING = 1 / 3


class ReadOnlySpells:
    """The read-only spells of one run (:meth:`start`, :meth:`around` each recovery,
    :meth:`hold_until_freed` after the heal, :meth:`free` after the final recoveries)."""

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.world = run.world
        self.loop = run.world.loop
        self.rng = run.world.rng_for("read-only")
        self.enabled = KIND in run.kinds
        #: bookie name -> virtual time its last spell ends (inf: until the disks are freed)
        self.until: dict[str, float] = {}
        self.stats = {"read_only_spells": 0}

    def start(self) -> None:
        """Draw single-bookie spells from now until the end of the run."""
        if self.enabled:
            self.loop.create_task(self._draw(), name="read-only")

    async def _draw(self) -> None:
        rng = self.rng
        while True:
            await asyncio.sleep(rng.expovariate(1 / 10.0))
            if self.loop.time() > self.run.duration * 0.9 or self.run.healed:
                return
            self.spell([rng.choice(self.world.bookies).name], self._hold())

    def _hold(self) -> float:
        if self.rng.random() < LASTING:
            return math.inf
        return math.exp(self.rng.uniform(math.log(1.0), math.log(20.0)))

    def around(self, ensemble: list[str]) -> None:
        """A recovery of a ledger whose current fragment is ``ensemble`` starts: in half of the
        recoveries some of its bookies turn read-only within half a second (two of three most
        often), and in half of those some bookies outside it too."""
        rng = self.rng
        if not self.enabled or self.run.healed or rng.random() >= 0.5:
            return
        count = min(rng.choice((1, 2, 2, len(ensemble) - 1)), len(ensemble))
        names = rng.sample(ensemble, max(1, count))
        spares = [b.name for b in self.world.bookies if b.name not in ensemble]
        if spares and rng.random() < 0.5:
            names += rng.sample(spares, rng.randint(1, len(spares)))
        self.loop.call_later(rng.uniform(0.0, 0.5), self.spell, names, self._hold())

    def spell(self, names: list[str], hold: float) -> None:
        """Turn the running bookies of ``names`` read-only for ``hold`` seconds (inf: until
        :meth:`free`)."""
        if self.run.healed:
            return
        for name in names:
            node = self.world.bookie(name)
            if node.bookie is None:
                continue
            end = self.loop.time() + hold
            self.until[name] = max(self.until.get(name, 0.0), end)
            self.stats["read_only_spells"] += 1
            self.world.trace("bookie.read_only", f"{name} for {hold:.3f}s")
            self._switch(node.bookie, True)
            if math.isfinite(hold):
                self.loop.call_later(hold, self._end, name, node.bookie)

    def _end(self, name: str, bookie: Bookie) -> None:
        if self.until.get(name, 0.0) > self.loop.time() or self.world.bookie(name).bookie is not bookie:
            return  # a later spell holds it, or the process it hit is gone
        self.until.pop(name, None)
        self.world.trace("bookie.writable", name)
        self._switch(bookie, False)

    def _switch(self, bookie: Bookie, read_only: bool) -> None:
        self.loop.create_task(self._set(bookie, read_only))

    async def _set(self, bookie: Bookie, read_only: bool) -> None:
        try:
            await bookie.set_read_only(read_only)
        except LedgerStoreError as exc:  # its registration could not be written: the next check will
            self.world.trace("bookie.read_only_failed", f"{bookie.bookie_id} {type(exc).__name__}")

    def read_only(self) -> set[str]:
        """The running bookies that are read-only now."""
        return {b.name for b in self.world.bookies if b.bookie is not None and b.bookie.read_only}

    async def hold_until_freed(self) -> None:
        """After the heal: the bookies of lasting spells that restarted are read-only again."""
        for name, end in self.until.items():
            node = self.world.bookie(name)
            if math.isinf(end) and node.bookie is not None and not node.bookie.read_only:
                await self._set(node.bookie, True)

    async def free(self) -> None:
        """The operator frees the disks: every bookie writable again."""
        self.until.clear()
        for b in self.world.bookies:
            if b.bookie is not None and b.bookie.forced_read_only:
                self.world.trace("bookie.writable", b.name)
                await self._set(b.bookie, False)
