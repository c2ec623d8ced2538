"""Read-only bookies in the simulation: a bookie turns read-only for a spell, as when its disks
fill up or an operator switches it, through the bookie's own switch (``Bookie.set_read_only``,
which also re-registers it read-only), then writable again.

Spells come from the run's fault kind ``read-only``, drawn from a generator of their own, on
bookies of a ledger's current fragment (two of a three-bookie ensemble most often): around a
third of the recoveries during the run, for 1 to 10 seconds; and in half of the runs, as the
run ends, on a ledger left for the final recoveries, in half of those with bookies outside its
fragment too (so that too few writable bookies are left to replace them), until the operator
frees the disks after those recoveries. A spell hits the process running when it was drawn: a
bookie that crashes and restarts comes back writable. Spells during the run stay on the
ledger's own bookies and end soon, which leaves the other workloads (log writers,
auto-recovery) writable bookies to move to.

Invariant (checked by the schedule, :func:`~ledgerstore.sim.invariants.must_recover`): a
read-only bookie is a running bookie. Recovery's write-back is a recovery add, which a read-only
bookie accepts (BookKeeper's high-priority writes), so a ledger whose last fragment has no
bookie lost beyond Qa - 1 is recovered while the spells last, whatever bookies are read-only.
"""

from __future__ import annotations

import math

from ledgerstore.bookie.server import Bookie
from ledgerstore.errors import LedgerStoreError
from ledgerstore.sim.logs import RunView

KIND = "read-only"
#: the share of recoveries during the run that meet a spell
AROUND = 1 / 3
#: the share of runs whose final recoveries meet a spell lasting through them
AT_THE_END = 1 / 2


class ReadOnlySpells:
    """The read-only spells of one run (:meth:`around` each recovery, :meth:`at_the_end` after
    the heal, :meth:`free` after the final recoveries)."""

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.world = run.world
        self.loop = run.world.loop
        self.rng = run.world.rng_for("read-only")
        self.enabled = KIND in run.kinds
        #: bookie name -> virtual time its last spell ends (inf: until the disks are freed)
        self.until: dict[str, float] = {}
        self.stats = {"read_only_spells": 0}

    def _draw(self, ensemble: list[str], spares: bool) -> list[str]:
        """Some bookies of ``ensemble`` (two of three most often), and with ``spares`` in half of
        the draws some bookies outside it too."""
        rng = self.rng
        count = min(rng.choice((1, 2, 2, len(ensemble) - 1)), len(ensemble))
        names = rng.sample(ensemble, max(1, count))
        others = [b.name for b in self.world.bookies if b.name not in ensemble]
        if spares and others and rng.random() < 0.5:
            names += rng.sample(others, rng.randint(1, len(others)))
        return names

    def around(self, ensemble: list[str]) -> None:
        """A recovery of a ledger whose current fragment is ``ensemble`` starts: at a third of
        them, bookies of it turn read-only within half a second, for 1 to 10 seconds."""
        rng = self.rng
        if not self.enabled or self.run.healed or rng.random() >= AROUND:
            return
        names = self._draw(ensemble, spares=False)
        hold = math.exp(rng.uniform(math.log(1.0), math.log(10.0)))
        self.loop.call_later(rng.uniform(0.0, 0.5), self.spell, names, hold)

    async def at_the_end(self, ensembles: list[list[str]]) -> None:
        """After the heal, before the final recoveries of ledgers whose current fragments are
        ``ensembles``: in half of the runs, bookies of one of them turn read-only until
        :meth:`free`."""
        rng = self.rng
        if not self.enabled or not ensembles or rng.random() >= AT_THE_END:
            return
        for name in self._draw(rng.choice(ensembles), spares=True):
            node = self.world.bookie(name)
            if node.bookie is not None:
                self.until[name] = math.inf
                self.stats["read_only_spells"] += 1
                self.world.trace("bookie.read_only", f"{name} until the disks are freed")
                await self._set(node.bookie, True)

    def spell(self, names: list[str], hold: float) -> None:
        """Turn the running bookies of ``names`` read-only for ``hold`` seconds."""
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
            self.loop.call_later(hold, self._end, name, node.bookie)

    def _end(self, name: str, bookie: Bookie) -> None:
        # (a margin for the rounding of the timer's time: a spell ends at the time it was set to)
        if self.until.get(name, 0.0) > self.loop.time() + 1e-6 or self.world.bookie(name).bookie is not bookie:
            return  # a later spell holds it, or the process it hit is gone
        self.until.pop(name, None)
        self.world.trace("bookie.writable", name)
        self._switch(bookie, False)

    def _switch(self, bookie: Bookie, read_only: bool) -> None:
        self.loop.create_task(self._set(bookie, read_only))

    async def _set(self, bookie: Bookie, read_only: bool) -> None:
        try:
            await bookie.set_read_only(read_only)
        except LedgerStoreError as exc:  # switched, but its registration still shows the old state
            self.world.trace("bookie.read_only_failed", f"{bookie.bookie_id} {type(exc).__name__}")

    def read_only(self) -> set[str]:
        """The running bookies that are read-only now."""
        return {b.name for b in self.world.bookies if b.bookie is not None and b.bookie.read_only}

    async def free(self) -> None:
        """The operator frees the disks: every bookie writable again."""
        self.until.clear()
        for b in self.world.bookies:
            if b.bookie is not None and b.bookie.forced_read_only:
                self.world.trace("bookie.writable", b.name)
                await self._set(b.bookie, False)
