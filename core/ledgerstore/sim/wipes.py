"""The wipe fault: a bookie loses its data mid-run and comes back under its old identity, while
writers, recoverers, logs and auto-recovery are at work (``ledgerstore.bookie.limbo``).

Once in a run that draws it, at a time drawn from the seed, one running bookie crashes and loses
(:data:`KINDS`) everything on its disks (*full*: a reformat that kept the cookie, a restore
from an empty backup), its journal directory alone (*journal*: what the journal held and the
storage engine had not checkpointed is gone), its ledger directory alone (*ledgers*: the
storage is gone, the journal holds what it did not checkpoint), or its ledger directory is put
back as it was earlier in the run (*stale*: a restore from an older copy, taken at a drawn time
before the wipe as a crash then would have left it). Its cookie stays, in its directories and
in the metadata store, so it starts again as the same bookie, and with
``data_integrity_checking_enabled`` it finds the loss (for the last two, by the checkpoint
marks the ledger directory carries), starts with its ledgers in limbo and repairs them from
their other replicas.

Only a bookie that no ledger with an ack quorum of 1 names is wiped (an entry acknowledged by
one bookie is lost with it, which no protocol prevents), only while no other bookie is lost for
good and fewer than the injector's limit are down; and no bookie is lost for good after it (two
lasting failures of a fragment exceed Qa - 1). The wiped bookie is preferably one of the
writer's current fragment, where recovery meets it.

Invariants: the ledger invariants (no acknowledged entry lost, none past the close, every one
on Qa bookies of its write set at the end) and the fence watch hold; and, on the healed
cluster, the wiped bookie repairs every limbo ledger (liveness).
"""

from __future__ import annotations

import asyncio

from ledgerstore.sim import invariants
from ledgerstore.sim.faults import FaultInjector
from ledgerstore.sim.logs import RunView
from ledgerstore.sim.workload import LedgerWorkload
from ledgerstore.sim.world import SimBookie

__all__ = ["WIPE", "WipeSchedule"]

#: the fault kind's name (``ledgerstore sim --faults``)
WIPE = "wipe"
#: how long the healed cluster has for the wiped bookie to leave limbo (virtual seconds)
SETTLE_S = 300.0
#: what a wipe loses: every disk, the journal directory, the ledger directory, or the ledger
#: directory's newer state (put back as it was earlier)
KINDS = ("journal", "ledgers", "full", "stale")


class WipeSchedule:
    """The wipe of one run (drawn from its own generator: the other draws do not move)."""

    def __init__(self, run: RunView, faults: FaultInjector, workload: LedgerWorkload) -> None:
        self.run = run
        self.faults = faults
        self.workload = workload
        self.world = run.world
        self.loop = run.world.loop
        self.rng = run.world.rng_for("wipe")
        #: the bookie wiped, once it is
        self.wiped: SimBookie | None = None
        #: the wipe at a recovery: (not before this time, what it loses, which bookie)
        self._armed: tuple[float, str, float] | None = None
        #: every bookie's ledger directory as of a time before the wipe (a *stale* wipe's copy)
        self._copies: dict[str, dict[str, bytes]] = {}
        self.stats: dict[str, float] = {"mid_run_wipes": 0, "partial_wipes": 0, "ledger_wipes": 0,
                                        "stale_restores": 0}

    def start(self, duration: float) -> None:
        """Draw whether and when this run wipes a bookie, and schedule it: at a time drawn from
        the seed, or at the first recovery after it (a bookie of the ledger's current fragment,
        its writer paused meanwhile, back before the recovery begins)."""
        rng = self.rng
        mode = rng.random()
        at, kind, pick, down_for = (rng.uniform(0.1, 0.7) * duration, KINDS[int(rng.random() * len(KINDS))],
                                    rng.random(), rng.uniform(0.5, 10.0))
        copy_at = rng.uniform(0.2, 0.9) * at
        if mode >= 0.75:
            return
        if kind == "stale":
            self.loop.call_later(copy_at, self._copy_ledger_dirs)
        if mode < 0.25:
            self.loop.call_later(at, self._wipe, kind, pick, down_for)
        else:
            self._armed = (at, kind, pick)
            self.faults.before_recovery = self._at_recovery

    def _copy_ledger_dirs(self) -> None:
        """Take every bookie's copy of its ledger directory: what a crash now would leave there."""
        for node in self.world.bookies:
            self._copies[node.name] = node.files.engine_snapshot()
        self.world.trace("wipe.copy", f"ledger directories copied ({sum(map(len, self._copies.values()))} files)")

    def _candidates(self, among: list[str] | None = None) -> list[SimBookie]:
        """Running bookies no ledger with Qa 1 names (of ``among``, names, when given)."""
        w = self.world
        single = set().union(*(md.bookies() for md in w.meta.ledgers() if md.ack_quorum < 2))
        return [b for b in w.bookies if b.running and b.bookie_id not in single and (among is None or b.name in among)]

    def _may_wipe(self) -> bool:
        faults = self.faults
        down = sum(not b.running for b in self.world.bookies)
        if self.wiped is not None or faults.healed or faults.lost or down >= faults.max_down:
            self.world.trace("wipe.skipped", f"healed {faults.healed}, lost {sorted(faults.lost)}, {down} down")
            return False
        return True

    def _wipe(self, kind: str, pick: float, down_for: float) -> None:
        """The timed wipe: a bookie of the writer's current fragment if one may be wiped."""
        if not self._may_wipe():
            return
        safe = self._candidates()
        ledgers = self.workload.ledgers
        current = ledgers[-1].last_ensemble() if ledgers and ledgers[-1].handle is not None else []
        preferred = [b for b in safe if b.name in current] or safe
        if not preferred:
            self.world.trace("wipe.skipped", "every running bookie holds a ledger with Qa 1")
            return
        node = preferred[int(pick * len(preferred))]
        self._wipe_node(node, kind, f"back in {down_for:.3f}s")
        self.loop.call_later(down_for, self.faults._schedule_restart, node.name)

    async def _at_recovery(self, ensemble: list[str], ledger_id: int) -> None:
        """At the first recovery after the drawn time: wipe a bookie of the ledger's current
        fragment with its writer paused, and start it again before the recovery begins."""
        if self._armed is None or self.loop.time() < self._armed[0]:
            return
        _, kind, pick = self._armed
        self._armed = None
        if not self._may_wipe():
            return
        safe = self._candidates(ensemble)
        if not safe:
            self.world.trace("wipe.skipped", f"L{ledger_id}: its fragment's bookies hold a ledger with Qa 1")
            return
        node = safe[int(pick * len(safe))]
        self.faults.pause("writer", 5.0)
        self._wipe_node(node, kind, f"at the recovery of L{ledger_id}")
        await self.faults.restart(node.name)

    def _wipe_node(self, node: SimBookie, kind: str, when: str) -> None:
        """Crash ``node`` and lose what ``kind`` says (:data:`KINDS`), keeping its cookie."""
        w = self.world
        naming = sorted(md.ledger_id for md in w.meta.ledgers() if node.bookie_id in md.bookies())
        node.crash()
        if kind == "journal":
            journal = node.journal_dir
            for name in node.files.listdir(journal):
                node.files.remove(journal / name)
            lost = "journal"
        elif kind == "ledgers":
            node.files.restore_engine({})
            lost = "ledger directory"
        elif kind == "stale":
            node.files.restore_engine(self._copies.get(node.name, {}))
            lost = "ledger directory's newer state (restored from an older copy)"
        else:
            node.wipe_disks()
            lost = "every disk"
        self.faults.wiped.add(node.name)
        self.wiped = node
        self.stats["mid_run_wipes"] += 1
        self.stats["partial_wipes"] += kind == "journal"
        self.stats["ledger_wipes"] += kind == "ledgers"
        self.stats["stale_restores"] += kind == "stale"
        w.trace("wipe", f"{node.name}: {lost} lost, cookie kept, ledgers {naming} name it; {when}")

    async def settle(self) -> None:
        """On the healed cluster: wait until the wiped bookie has no ledger left in limbo."""
        node = self.wiped
        if node is None:
            return
        deadline = self.loop.time() + SETTLE_S
        while self.loop.time() < deadline:
            b = node.bookie
            if b is not None and not len(b.limbo):
                self.world.trace("wipe.repaired", f"{node.name}: {b.limbo.repaired_total} ledgers repaired, "
                                 f"{b.repair.entries_copied} entries copied")
                return
            await asyncio.sleep(1.0)
        left = sorted(node.bookie.limbo.ledgers) if node.bookie is not None else "(not running)"
        self.run.violation(f"{node.name} still holds ledgers in limbo {SETTLE_S:g}s after the cluster healed: "
                           f"{left}", invariants.LIVENESS)
