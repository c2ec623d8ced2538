"""Auto-recovery in the simulation: two processes each running the real auditor candidate and
replication worker (:class:`~ledgerstore.recovery.service.RecoveryService`), a fault that loses a
bookie's disks, and the auto-recovery invariants.

Each run draws the lost-bookie delay, the open-ledger grace period and the lease. The *wipe*
fault stands for a disk replaced under a bookie (or ``bookieformat`` with its cookie deleted):
the bookie crashes, its journal, ledger storage, directories and cookie are gone, and it starts
again as a new incarnation holding nothing. The auditor then marks every ledger that names it and
the workers copy what it held to a replacement; an open ledger is recovered first. A bookie
whose crash outlasts the delay gets its ledgers marked too (and cleared when it comes back).

Only one bookie is wiped per run, and only when every ledger naming it has an ack quorum of at
least 2: losing one copy of an entry acknowledged by one bookie loses the entry, which no
protocol prevents (a ledger survives Qa - 1 failures).

Invariants, once the cluster is healthy and quiet (no marker left): every copy the wiped bookie
held of an entry that is still in its ledger is back at that place of the entry's write set (no
fragment below its write quorum), no fragment names a bookie twice; the ledger invariants of
the schedule (no acknowledged entry lost) are checked after this.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
from collections.abc import Callable

from ledgerstore.api import Notification
from ledgerstore.config import AutoRecoveryConfig, ClientConfig
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta import layout
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.recovery.markers import MARKERS, Marker
from ledgerstore.recovery.service import RecoveryService
from ledgerstore.sim.logs import RunView
from ledgerstore.sim.metadata import _Watch
from ledgerstore.sim.world import SimBookie

PROCESSES = ("autorecovery-1", "autorecovery-2")
#: wall-clock time of the simulation's start (seconds since the epoch): what ``time.time()``
#: would read at virtual time 0 on a process without skew
EPOCH = 1_800_000_000.0


class AutoRecovery:
    """The auto-recovery processes of one run, the wipe fault and the auto-recovery checks."""

    def __init__(self, run: RunView, settings: AutoRecoveryConfig | None = None) -> None:
        self.run = run
        #: None: drawn from the seed at :meth:`start`
        self.settings = settings
        self.world = run.world
        self.loop = run.world.loop
        self.rng = run.world.rng_for("autorecovery")
        self.services: list[RecoveryService] = []
        #: (ledger id, entry id, write-set index, fragment's first entry) -> the wiped bookie
        self.lost: dict[tuple[int, int, int, int], str] = {}
        self.wiped: str | None = None
        #: (which bookie, how long it stays down) of the wipe drawn for the end of the run
        self._wipe_plan: tuple[float, float] | None = None
        self.stats: dict[str, float] = {"wipes": 0}
        #: process name -> its wall clock's offset from the true time (clock skew), in seconds
        self.skew: dict[str, float] = {}

    def wall_clock(self, node: str) -> Callable[[], float]:
        """``time.time()`` as the process ``node`` reads it: the virtual time plus its skew."""
        return lambda: EPOCH + self.loop.time() + self.skew.get(node, 0.0)

    async def start(self) -> None:
        rng = self.rng
        settings = self.settings or AutoRecoveryConfig(
            lost_bookie_recovery_delay_s=rng.choice((0.0, 2.0, 10.0)),
            open_ledger_rereplication_grace_s=rng.choice((1.0, 5.0, 30.0)),
            lease_s=rng.choice((5.0, 30.0)), replicas_check_interval_s=0.0)
        self.world.trace("autorecovery.settings", f"delay {settings.lost_bookie_recovery_delay_s} grace "
                         f"{settings.open_ledger_rereplication_grace_s} lease {settings.lease_s}")
        # clock skew: the markers' leases, grace periods and retry times are wall-clock times
        # that one process writes and another compares with its own clock
        self.skew = {name: rng.choice((0.0, 0.0, 1.5, -1.5, 45.0, -45.0)) for name in PROCESSES}
        self.world.trace("autorecovery.skew", str(self.skew))
        server = self.world.meta
        server.watches.append(_Watch(server, MARKERS, self._on_marker))
        for name in PROCESSES:
            client = await self.world.client(name).start()
            svc = RecoveryService(ClientConfig(), settings, name, client=client, clock=self.loop.time,
                                  wall_clock=self.wall_clock(name))
            await svc.start()
            self.services.append(svc)
        if "crash" in self.run.kinds and rng.random() < 0.5:
            self._wipe_plan = (rng.random(), rng.uniform(0.5, 15.0))

    def _on_marker(self, n: Notification) -> None:
        cur = self.world.meta.data.get(n.key)
        if cur is None:
            self.world.trace("autorecovery.unmarked", n.key.rsplit("/", 1)[-1])
        else:
            m = Marker.from_bytes(cur[0], cur[1])
            self.world.trace("autorecovery.marker", f"L{m.ledger_id} missing {m.missing} owner {m.owner}")

    # --- the wipe fault ------------------------------------------------------------------------------

    def _ledgers(self) -> list[LedgerMetadata]:
        return self.world.meta.ledgers()

    def _wipe_one(self, pick: float, restart_after: float) -> None:
        """Wipe one of the bookies that no ledger with an ack quorum of 1 names (``pick`` in
        [0, 1) chooses which), while every bookie runs."""
        if not all(b.running for b in self.world.bookies):
            return
        single = set().union(*(md.bookies() for md in self._ledgers() if md.ack_quorum < 2 or not md.is_closed))
        safe = [b for b in self.world.bookies if b.bookie_id not in single]
        if not safe:
            self.world.trace("autorecovery.wipe_skipped", "every bookie holds an open ledger or one with Qa 1")
            return
        self.wipe(safe[int(pick * len(safe))], restart_after)

    def wipe(self, node: SimBookie, restart_after: float) -> None:
        """Lose ``node``'s disks and cookie, and start it again after ``restart_after`` seconds."""
        mine = [md for md in self._ledgers() if node.bookie_id in md.bookies()]
        held = node.stored()
        for md in mine:
            for first, last, ensemble in md.fragment_ranges():
                if node.bookie_id not in ensemble:
                    continue
                index = ensemble.index(node.bookie_id)
                for eid in held.get(md.ledger_id, ()):
                    if first <= eid <= last and index in md.write_set(eid):
                        self.lost[(md.ledger_id, eid, index, first)] = node.bookie_id
        node.crash()
        node.wipe_disks()
        shutil.rmtree(self.world.tmp / node.name, ignore_errors=True)
        self.world.meta.data.pop(f"{layout.COOKIES}/{node.bookie_id}", None)  # bookieformat -deleteCookie
        self.wiped = node.bookie_id
        self.stats["wipes"] += 1
        self.world.trace("autorecovery.wipe", f"{node.name}: {len(self.lost)} copies lost, back in "
                         f"{restart_after:.3f}s")
        self.loop.call_later(restart_after, self._restart, node)

    def _restart(self, node: SimBookie) -> None:
        if not node.running:
            self.loop.create_task(self._start(node))

    async def _start(self, node: SimBookie) -> None:
        try:
            await node.start()
        except LedgerStoreError as exc:
            self.run.violation(f"{node.name} did not start on its new disks: {exc}")

    # --- checking ------------------------------------------------------------------------------------

    async def settle(self, timeout: float = 600.0) -> None:
        """On a healthy cluster: wait until no ledger is marked under-replicated any more (the
        auditor has seen every bookie back and the workers are done), then check."""
        deadline = self.loop.time() + timeout
        if self._wipe_plan is not None:
            # only once every ledger is closed: a wiped bookie answers "no such entry" for entries
            # it had acknowledged, which a recovery takes for entries never written, and it forgot
            # which ledgers it fenced (both beyond the fault model of recovery, in BookKeeper too)
            await self._close_every_ledger()
            self._wipe_one(*self._wipe_plan)
            while not all(b.running for b in self.world.bookies) and self.loop.time() < deadline:
                await asyncio.sleep(0.5)
        await asyncio.sleep(5.0)  # the auditor's next pass sees the healed cluster
        while self.loop.time() < deadline:
            if not [k for k in self.world.meta.data if k.startswith(MARKERS + "/")]:
                break
            await asyncio.sleep(1.0)
        else:
            left = sorted(k for k in self.world.meta.data if k.startswith(MARKERS + "/"))
            self.run.violation(f"auto-recovery: {len(left)} ledgers still marked under-replicated {timeout:g}s "
                               f"after the cluster healed: {left[:4]}")
        self.check()

    async def _close_every_ledger(self) -> None:
        client = self.services[0].client
        for md in self._ledgers():
            for _ in range(5):
                if md.is_closed or md.password is None:
                    break
                try:
                    await asyncio.wait_for(client.open_ledger(md.ledger_id, base64.b64decode(md.password)), 120)
                    break
                except (LedgerStoreError, TimeoutError) as exc:
                    self.world.trace("autorecovery.close_failed", f"L{md.ledger_id} {type(exc).__name__}")
                    await asyncio.sleep(2.0)

    def current(self, ledger_id: int) -> LedgerMetadata | None:
        """A ledger's metadata as stored now (auto-recovery changes the fragments of closed
        ledgers: checks made against a copy read before would look at the replaced bookies)."""
        return self.world.meta.ledger(ledger_id)

    def check(self) -> None:
        stored = {b.bookie_id: b.stored() for b in self.world.bookies}
        ledgers = {md.ledger_id: md for md in self._ledgers()}
        for md in ledgers.values():
            for first, bookies in md.ensembles:
                if len(set(bookies)) != len(bookies):
                    self.run.violation(f"auto-recovery: ledger {md.ledger_id}'s fragment at entry {first} names a "
                                       f"bookie twice: {bookies}")
        missing: list[str] = []
        for (lid, eid, index, first), was in sorted(self.lost.items()):
            lmd = ledgers.get(lid)
            if lmd is None or not lmd.is_closed or eid > lmd.last_entry_id:
                continue  # deleted, or the entry is not in the ledger
            start, now = lmd.ensemble_for(eid)
            if start != first:
                continue  # not acknowledged then: an ensemble change gave it to a later fragment
            holder = now[index]
            if eid not in stored.get(holder, {}).get(lid, ()):
                missing.append(f"L{lid} e{eid} at {holder} (was {was})")
        if missing:
            self.run.violation(f"auto-recovery: {len(missing)} copies lost with a wiped bookie were not "
                               f"re-replicated (fragments below their write quorum): {missing[:4]}")
        self.world.trace("autorecovery.checked", f"{len(self.lost)} lost copies")

    async def stop(self) -> None:
        for svc in self.services:
            await svc.stop()
