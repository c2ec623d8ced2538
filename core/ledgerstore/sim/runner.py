"""One simulated run: a workload, a fault schedule and the invariants, all from one seed.

The workload (:mod:`.workload`): a writer appends to a ledger (pipelined); at a random time a
recoverer opens the ledger with recovery while the writer may still be writing or paused.
Faults (:mod:`.faults`) are drawn from the seed. At the end the world is healed (partitions
removed, paused processes woken, crashed bookies restarted) and the invariants of ``DESIGN.md``
are checked (:mod:`.invariants`). :func:`run_seed` runs one seed, :func:`shrink` a failing
seed's schedule down to what its failure needs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ledgerstore.errors import LedgerStoreError
from ledgerstore.sim import invariants
from ledgerstore.sim.auditor import AutoRecovery
from ledgerstore.sim.diskfaults import DiskFaultSchedule
from ledgerstore.sim.faults import AROUND_BASE, FAULT_KINDS, FaultInjector, draw_faults
from ledgerstore.sim.invariants import Ledger
from ledgerstore.sim.logs import LogWorkload
from ledgerstore.sim.loop import SimulationStuck, VirtualTimeLoop
from ledgerstore.sim.network import LinkFaults
from ledgerstore.sim.readonly import ReadOnlySpells
from ledgerstore.sim.workload import LedgerWorkload
from ledgerstore.sim.world import World


@dataclasses.dataclass
class Outcome:
    """The result of one seed."""

    seed: int
    trace_hash: str
    violations: list[str]
    trace: list[str]
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.violations


class Run:
    """The state of one run: its world, fault kinds, violations, statistics and workloads."""

    def __init__(self, world: World, duration: float, kinds: tuple[str, ...],
                 skip: frozenset[int] = frozenset()) -> None:
        self.world = world
        #: indexes of drawn faults left out (shrinking); -1 is the run-wide bad network
        self.skip = skip
        self.loop = world.loop
        self.duration = duration
        self.kinds = kinds
        self.rng = world.rng_for("schedule")
        self.violations: list[str] = []
        self.stats: dict[str, Any] = {}
        self.faults = FaultInjector(world, kinds, skip, self.stats, self.violation)
        #: bookies turned read-only for spells (around recoveries too)
        self.read_only = ReadOnlySpells(self)
        self.workload = LedgerWorkload(world, duration, self.faults, self.read_only, self.violation)

    @property
    def healed(self) -> bool:
        """Whether the world was healed (no fault starts after that)."""
        return self.faults.healed

    @property
    def ledgers(self) -> list[Ledger]:
        """The ledgers the writer created."""
        return self.workload.ledgers

    def violation(self, text: str) -> None:
        """Record a broken invariant (in the trace too)."""
        self.world.trace("VIOLATION", text)
        self.violations.append(text)


async def _scenario(run: Run) -> None:
    w = run.world
    loop = run.loop
    d = run.duration
    work_load = run.workload
    await w.start_bookies()
    if "lossy-link" in run.kinds and run.rng.random() < 0.5 and -1 not in run.skip:
        # a bad network for the whole run: every link loses, delays, duplicates and reorders
        r = run.rng
        w.net.default = LinkFaults(max_delay=r.choice((0.01, 0.2, 1.0)), drop=r.choice((0.0, 0.01, 0.05, 0.1)),
                                   duplicate=r.choice((0.0, 0.02)), reorder=r.choice((0.0, 0.1)),
                                   stall=r.choice((0.0, 0.01, 0.05)))
        w.trace("net.default", str(w.net.default))
    writer = await w.client("writer").start()
    # the recoverer's fence and read timeout is client config: drawn, often shorter than the
    # default 5 s, so a lost fence is given up on while the writer's add is still in flight
    timeout = w.rng_for("recoverer.config").choice((1.0, 2.0, 2.0, 5.0))
    recoverer = await w.client("recoverer", read_timeout_s=timeout).start()
    logs = LogWorkload(run)  # log writers, a reader and their faults (ledgerstore.sim.logs)
    await logs.start()
    autorecovery = AutoRecovery(run)  # auditor, workers, a bookie losing its disks (ledgerstore.sim.auditor)
    await autorecovery.start()
    disks = DiskFaultSchedule(run)  # failed writes and flipped bits (ledgerstore.sim.diskfaults)
    disks.start()
    faults = draw_faults(run.rng, ["writer", "recoverer"], [b.name for b in w.bookies], d, run.kinds)
    run.stats["faults"] = len(faults)
    faults = [f for i, f in enumerate(faults) if i not in run.skip]
    w.trace("schedule", f"{len(faults)} faults")
    run.faults.awake.set()
    work = loop.create_task(work_load.rounds(writer, recoverer), name="rounds")
    inject = loop.create_task(run.faults.inject(faults), name="faults")
    await asyncio.sleep(d)
    inject.cancel()
    await run.faults.heal()
    w.trace("healed")
    # let the writer's last adds settle (answered, failed or timed out) before judging them
    deadline = loop.time() + 120
    while (not work.done() or any(led.outstanding for led in run.ledgers)) and loop.time() < deadline:
        await asyncio.sleep(0.5)
    if not work.done():
        run.violation("the writer's adds neither succeeded nor failed within 120s of a healthy cluster")
        work.cancel()
    elif work.exception() is not None:
        run.violation(f"the writer failed on a healthy cluster: {work.exception()!r}")
    await run.read_only.at_the_end([led.last_ensemble() for led in run.ledgers if led.recovered is None])
    for led in run.ledgers:  # with the lost bookies still down (and full disks still full)
        await work_load.recover_at_the_end(recoverer, led)
    # the operator frees the full disks and brings the lost machines back (same disks, same ids)
    await run.read_only.free()
    await run.faults.replace_lost()
    await logs.finish()  # the log's final takeover and checks, before a bookie is wiped
    run.stats.update(logs.stats)
    await autorecovery.settle()
    run.stats.update(autorecovery.stats)
    for led in run.ledgers:  # auto-recovery may have replaced bookies since recovery closed it
        led.recovered = led.recovered and autorecovery.current(led.ledger_id)
    reader = await w.client("reader").start()
    for led in run.ledgers:
        if led.recovered is None:
            await work_load.recover_at_the_end(recoverer, led)
        if led.recovered is None:
            run.violation(f"ledger {led.ledger_id} could not be recovered on a healthy cluster")
        else:
            await invariants.check_ledger(run, led, reader)
    run.stats.update(disks.stats, flipped_reads=disks.flipped())
    run.stats.update(run.read_only.stats)
    run.stats["ledgers"] = len(run.ledgers)
    run.stats["acked"] = sum(len(led.acked) for led in run.ledgers)


def run_seed(seed: int, *, bookies: int = 5, duration: float = 60.0,
             faults: tuple[str, ...] = FAULT_KINDS, skip: frozenset[int] = frozenset()) -> Outcome:
    """Run the schedule of ``seed`` to its end and check it. Deterministic: the same arguments
    give the same trace (and hash). ``skip`` leaves out drawn faults by index (-1: the run-wide
    bad network), as :func:`shrink` does."""
    loop = VirtualTimeLoop()
    world = World(seed, loop, bookies)
    run = Run(world, duration, faults, skip)
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            try:
                runner.run(_scenario(run))
            except SimulationStuck as exc:
                run.violation(f"simulation stuck: {exc}")
            except LedgerStoreError as exc:
                run.violation(f"the workload failed on a healthy cluster: {exc!r}")
    finally:
        world.close()
    run.stats["virtual_s"] = round(loop.clock.now, 3)
    run.stats["frames"] = world.net.sent
    return Outcome(seed, world.trace.digest(), run.violations, world.trace.lines, run.stats)


def shrink(seed: int, *, bookies: int = 5, duration: float = 60.0,
           faults: tuple[str, ...] = FAULT_KINDS) -> tuple[Outcome, frozenset[int]]:
    """Leave out, one at a time, each fault of a failing seed's schedule that the failure does not
    need (greedy delta debugging; each try is a deterministic replay). Returns the run with the
    fewest faults that still breaks an invariant, and the indexes left out (replay it with
    ``run_seed(seed, skip=...)``)."""
    best = run_seed(seed, bookies=bookies, duration=duration, faults=faults)
    skip: frozenset[int] = frozenset()
    if best.ok:
        return best, skip
    around = range(AROUND_BASE, AROUND_BASE + int(best.stats.get("around", 0)))
    for index in [-1, *range(int(best.stats.get("faults", 0))), *around]:
        trial = skip | {index}
        out = run_seed(seed, bookies=bookies, duration=duration, faults=faults, skip=trial)
        if not out.ok:
            best, skip = out, trial
    return best, skip
