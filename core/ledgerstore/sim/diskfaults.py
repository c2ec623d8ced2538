"""Disk faults in the simulation: a bookie's ledger disk fails writes (EIO, or ENOSPC which the
bookie takes for a full disk) or returns entries with a flipped bit, for a few seconds at a time;
and faults aimed at a step of the journal's protocol, on the bookie's simulated files
(:class:`~ledgerstore.sim.files.SimFileSystem`), each ending in a crash and a restart:

- ``crash-before-fsync``: the bookie crashes as its journal calls fsync on a group it wrote;
- ``torn-write``: the same, and a random prefix of that group stays on disk (a torn last block);
- ``journal-eio``, ``journal-enospc``: the journal's next write fails; the journal stops taking
  adds and the operator restarts the bookie;
- ``fsync-fail``: the journal's next fsync fails, the same way;
- ``crash-in-checkpoint``: the bookie crashes inside its next checkpoint, after the storage
  engine flushed and before the journal's LastLogMark moved.

And faults aimed at a step of the entry-log engine's own protocol (:data:`STORAGE_FAULTS`),
timed by the engine's file operations, each a crash and a restart:

- ``crash-in-compaction-copied``: inside a compaction, once the live entries were copied to
  the active log, as the copies are synced (the index still points at the old log);
- ``crash-in-compaction-indexed``: inside a compaction, as the first index file is synced
  after the copies were (the index may point at the copies, not durably);
- ``crash-in-compaction-before-delete``: inside a compaction, once the index pointing at the
  copies is durable, as the old log's files are removed;
- ``crash-in-gc``: inside a GC pass, as the index file of a deleted ledger is removed.

The faults live on the bookie's simulated files (:attr:`SimBookie.disk_faults
<ledgerstore.sim.world.SimBookie.disk_faults>`, a :class:`~ledgerstore.sim.disk.DiskFaults`)
and hit the process running when they were drawn: a
bookie that crashes and restarts replays its journal on a disk that works (a restart that
cannot replay is a bookie that stays down, which the schedule counts as a failure). A flipped
bit must never reach an application: the entry log's CRC32C fails (or, past it, the entry's
digest) and the client reads it from another replica; the schedule's final checks read every acknowledged entry back with its
payload, and :attr:`DiskFaultSchedule.stats` counts the flipped reads served.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from pathlib import Path

from ledgerstore.errors import LedgerStoreError
from ledgerstore.sim.disk import DiskFaults
from ledgerstore.sim.logs import RunView
from ledgerstore.sim.world import SimBookie

#: the kinds of disk fault, drawn with these weights
#: journal fault -> the file operation it is aimed at, and what happens there: "crash" (the
#: bookie crashes as the operation starts, before it took effect), "tear" (the same, keeping a
#: random prefix of the journal's last write) or the errno the operation fails with
JOURNAL_FAULTS: dict[str, tuple[str, str | int]] = {
    "crash-before-fsync": ("sync", "crash"),
    "torn-write": ("sync", "tear"),
    "journal-eio": ("write", errno.EIO),
    "journal-enospc": ("write", errno.ENOSPC),
    "fsync-fail": ("sync", errno.EIO),
    "crash-in-checkpoint": ("replace", "crash"),  # the LastLogMark, after the engine's flush
}
#: storage fault -> the chain of engine file operations it waits for, each as (op, file suffix):
#: the bookie crashes as the last one starts
STORAGE_FAULTS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "crash-in-compaction-copied": (("engine.create", (".compacting",)), ("engine.sync", (".log",))),
    "crash-in-compaction-indexed": (("engine.create", (".compacting",)), ("engine.sync", (".log",)),
                                    ("engine.sync", (".idx",))),
    "crash-in-compaction-before-delete": (("engine.create", (".compacting",)), ("engine.remove", (".lmap", ".log"))),
    "crash-in-gc": (("engine.remove", (".idx",)),),
}
KINDS = ("eio", "enospc", "flip", "flip", *JOURNAL_FAULTS, *STORAGE_FAULTS)
#: the directed scenarios of this schedule (``ledgerstore sim --scenario``): that fault alone,
#: aimed at a bookie about every 8 s
DIRECTED = ("crash-in-checkpoint", *STORAGE_FAULTS)
#: at most this many bookies down at once (as the schedule's crashes)
MAX_DOWN = 2
#: seconds a bookie whose journal failed runs on, refusing adds, before it is stopped
FAILED_FOR = 1.0


class DiskFaultSchedule:
    """Draws disk faults on the bookies from the seed while the run lasts (:meth:`start`)."""

    def __init__(self, run: RunView) -> None:
        self.run = run
        self.world = run.world
        self.loop = run.world.loop
        self.rng = run.world.rng_for("disk-faults")
        self.stats: dict[str, int] = {"disk_faults": 0}
        self._task: asyncio.Task[None] | None = None
        #: a directed scenario aimed at a storage or journal step: only that fault is drawn
        self.directed = run.scenario in DIRECTED

    def start(self) -> None:
        """Draw faults from now until the end of the run (when the run's fault kinds allow
        crashes: a failing disk is a fault of the machine, as a crash is)."""
        if "crash" in self.run.kinds or self.directed:
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
            kind = self.run.scenario if self.directed else rng.choice(KINDS)
            assert kind is not None
            p = rng.choice((0.05, 0.3, 1.0))
            hold = min(rng.uniform(0.5, 10.0), self.run.duration - self.loop.time())
            n += 1
            engine = node.engine()
            if engine is None:
                continue  # the bookie is down: its disk is not in use
            if kind in JOURNAL_FAULTS or kind in STORAGE_FAULTS:
                # armed until a step of the journal (or the engine) meets it, or the spell ends:
                # early enough that a failed journal's bookie is stopped before the heal, which
                # restarts it
                armed = min(hold, self.run.duration - self.loop.time() - 2 * FAILED_FOR)
                family = "journal" if kind in JOURNAL_FAULTS else "storage"
                if (family in self.run.kinds or self.directed) and armed > 0 and \
                        sum(not b.running for b in self.world.bookies) < MAX_DOWN:
                    self.stats["disk_faults"] += 1
                    self.world.trace("disk.fault", f"{node.name} {kind} for {armed:.3f}s, back {hold:.3f}s after")
                    aim = aim_journal_fault if family == "journal" else aim_storage_fault
                    aim(node, kind, self._restart_after(node, hold))
                    self.loop.call_later(armed, node.files.disarm)
                continue
            faults = DiskFaults(write_error=0.0 if kind == "flip" else p, full=kind == "enospc",
                                flip=p if kind == "flip" else 0.0, rng=self.world.rng_for(f"{node.name}.disk.{n}"),
                                generation=node.files.generation)
            node.disk_faults = faults
            self.stats["disk_faults"] += 1
            self.world.trace("disk.fault", f"{node.name} {kind} p={p:g} for {hold:.3f}s")
            self.loop.call_later(hold, self._clear, node, faults)

    def _restart_after(self, node: SimBookie, hold: float) -> Callable[[], None]:
        """What to do once the fault crashed ``node`` (or failed its journal): restart it after
        ``hold`` seconds, as an operator would."""
        def crashed() -> None:
            self.loop.call_later(hold, lambda: self.loop.create_task(self._restart(node)))
        return crashed

    async def _restart(self, node: SimBookie) -> None:
        try:
            await node.start()
        except LedgerStoreError as exc:
            self.run.violation(f"{node.name} did not restart: {exc}")

    def _clear(self, node: SimBookie, faults: DiskFaults) -> None:
        if node.disk_faults is faults:
            node.disk_faults = DiskFaults()
            self.world.trace("disk.healed", node.name)

    def flipped(self) -> int:
        """Reads answered with a flipped bit by the bookies' disks."""
        return sum(b.files.flipped for b in self.world.bookies)


def aim_journal_fault(node: SimBookie, kind: str, then: Callable[[], None] = lambda: None) -> None:
    """Aim a fault of ``kind`` (a key of :data:`JOURNAL_FAULTS`) at the next step of ``node``'s
    journal it concerns; ``then()`` runs once the bookie crashed, or once its journal failed
    and the bookie was stopped for a restart. A directed scenario calls this as the schedule does."""
    op, what = JOURNAL_FAULTS[kind]

    def hit(path: Path) -> None:
        node.world.trace("disk.journal", f"{node.name} {kind}: {op} of {path.name}")
        if isinstance(what, int):  # the journal fails, the bookie refuses adds, a second later it stops
            node.world.loop.call_later(FAILED_FOR, _stop, node, then)
        elif node.running:
            node.crash(tear=what == "tear")
            then()

    if isinstance(what, int):
        node.files.fail_next(op, what)
    node.files.on_next(op, hit)


def _stop(node: SimBookie, then: Callable[[], None]) -> None:
    """The journal failed: the bookie refuses adds until restarted (it crashes here, which loses
    nothing the journal had made durable)."""
    if node.running:
        node.crash()
        then()


def aim_storage_fault(node: SimBookie, kind: str, then: Callable[[], None] = lambda: None) -> None:
    """Aim a fault of ``kind`` (a key of :data:`STORAGE_FAULTS`) at ``node``'s storage engine:
    each step of its chain arms the next as it is met, and the bookie crashes as the last one
    starts (before it takes effect); ``then()`` runs once it crashed."""
    steps = STORAGE_FAULTS[kind]

    def arm(i: int) -> None:
        op, suffixes = steps[i]

        def hit(path: Path) -> None:
            if i + 1 < len(steps):
                arm(i + 1)
                return
            node.world.trace("disk.storage", f"{node.name} {kind}: {op} of {path.name}")
            if node.running:
                node.crash()
                then()

        node.files.on_next(op, hit, lambda path: path.name.endswith(suffixes))

    arm(0)
