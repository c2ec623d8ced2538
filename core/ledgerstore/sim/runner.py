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
import random
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
from ledgerstore.sim.scratch import ScratchLedgers
from ledgerstore.sim.wipes import WIPE, WipeSchedule
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
    #: the name of the invariant each violation broke (``ledgerstore.sim.invariants``)
    broken: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclasses.dataclass(frozen=True)
class Shape:
    """How much workload a run carries beside its faults (shrinking makes it smaller): at most
    ``ledgers`` ledgers of at most ``entries`` adds each (None: as drawn), and which of the other
    processes run."""

    ledgers: int | None = None
    entries: int | None = None
    #: the parts of the workload left out: any of :data:`PARTS`
    without: frozenset[str] = frozenset()

    def has(self, part: str) -> bool:
        """Whether ``part`` (one of :data:`PARTS`) runs."""
        return part not in self.without


#: the parts of a run's workload that shrinking may leave out
PARTS = ("logs", "autorecovery", "disk-faults", "tailer", "scratch")
FULL = Shape()


class Run:
    """The state of one run: its world, fault kinds, violations, statistics and workloads."""

    def __init__(self, world: World, duration: float, kinds: tuple[str, ...],
                 skip: frozenset[int] = frozenset(), shape: Shape = FULL, scenario: str | None = None) -> None:
        self.world = world
        self.shape = shape
        #: the directed scenario: only its fault, at every recovery (None: the random schedule)
        self.scenario = scenario
        #: indexes of drawn faults left out (shrinking); -1 is the run-wide bad network
        self.skip = skip
        self.loop = world.loop
        self.duration = duration
        self.kinds = kinds
        self.rng = world.rng_for("schedule")
        self.violations: list[str] = []
        self.broken: list[str] = []
        self.stats: dict[str, Any] = {}
        self.faults = FaultInjector(world, kinds, skip, self.stats, self.violation)
        #: bookies turned read-only for spells (around recoveries too)
        self.read_only = ReadOnlySpells(self)
        self.faults.scenario = scenario
        self.workload = LedgerWorkload(world, duration, self.faults, self.read_only, self.violation)
        self.workload.ledgers_max = shape.ledgers
        self.workload.entries_max = shape.entries

    @property
    def healed(self) -> bool:
        """Whether the world was healed (no fault starts after that)."""
        return self.faults.healed

    @property
    def ledgers(self) -> list[Ledger]:
        """The ledgers the writer created."""
        return self.workload.ledgers

    def violation(self, text: str, name: str | None = None) -> None:
        """Record a broken invariant (in the trace too); ``name`` says which (by default the
        text's first word: the workload that found it, e.g. ``log`` or ``auto-recovery``)."""
        self.world.trace("VIOLATION", text)
        self.violations.append(text)
        self.broken.append(name or text.split(":", 1)[0].split(" ", 1)[0])


async def _scenario(run: Run) -> None:
    w = run.world
    loop = run.loop
    d = run.duration
    work_load = run.workload
    w.net.observers.append(invariants.FenceWatch(run.violation))
    await w.start_bookies()
    random_faults = run.kinds if run.scenario is None else ()
    if "lossy-link" in random_faults and run.rng.random() < 0.5 and -1 not in run.skip:
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
    shape = run.shape
    if shape.has("tailer"):
        work_load.tailer = await w.client("tailer").start()
    logs = LogWorkload(run)  # log writers, a reader and their faults (ledgerstore.sim.logs)
    if shape.has("logs"):
        await logs.start()
    else:  # the code under test draws from the random module too: seeded as the logs would
        random.seed(w.rng_for("global-random").getrandbits(64))
    autorecovery = AutoRecovery(run)  # auditor, workers, a bookie losing its disks (ledgerstore.sim.auditor)
    if shape.has("autorecovery"):
        await autorecovery.start()
    disks = DiskFaultSchedule(run)  # failed writes and flipped bits (ledgerstore.sim.diskfaults)
    if shape.has("disk-faults"):
        disks.start()
    wipes = WipeSchedule(run, run.faults, work_load)  # a bookie loses its data mid-run (ledgerstore.sim.wipes)
    if WIPE in random_faults:
        wipes.start(d)
    scratch = ScratchLedgers(w, d * 0.9)  # ledgers written and deleted: work for GC and compaction
    if shape.has("scratch"):
        loop.create_task(scratch.run(await w.client("scratch").start()), name="scratch")
    faults = draw_faults(run.rng, ["writer", "recoverer"], [b.name for b in w.bookies], d, random_faults)
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
        run.violation("the writer's adds neither succeeded nor failed within 120s of a healthy cluster",
                      invariants.LIVENESS)
        work.cancel()
    elif work.exception() is not None:
        run.violation(f"the writer failed on a healthy cluster: {work.exception()!r}", invariants.LIVENESS)
    await run.read_only.at_the_end([led.last_ensemble() for led in run.ledgers if led.recovered is None])
    for led in run.ledgers:  # with the lost bookies still down (and full disks still full)
        await work_load.recover_at_the_end(recoverer, led)
    # the operator frees the full disks and brings the lost machines back (same disks, same ids)
    await run.read_only.free()
    await run.faults.replace_lost()
    await wipes.settle()  # the wiped bookie repairs its limbo ledgers
    run.stats.update(wipes.stats)
    if shape.has("logs"):
        await logs.finish()  # the log's final takeover and checks, before a bookie is wiped
        run.stats.update(logs.stats)
    if shape.has("autorecovery"):
        await autorecovery.settle()
        run.stats.update(autorecovery.stats)
        for led in run.ledgers:  # auto-recovery may have replaced bookies since recovery closed it
            led.recovered = led.recovered and autorecovery.current(led.ledger_id)
    reader = await w.client("reader").start()
    for led in run.ledgers:
        if led.recovered is None:
            await work_load.recover_at_the_end(recoverer, led)
        if led.recovered is None:
            run.violation(f"ledger {led.ledger_id} could not be recovered on a healthy cluster", invariants.LIVENESS)
        else:
            await invariants.check_ledger(run, led, reader)
    run.stats.update(disks.stats, flipped_reads=disks.flipped())
    run.stats.update(scratch.stats, **engine_stats(w))
    run.stats.update(run.read_only.stats)
    run.stats["ledgers"] = len(run.ledgers)
    run.stats["acked"] = sum(len(led.acked) for led in run.ledgers)


def engine_stats(world: World) -> dict[str, int]:
    """What the running bookies' storage engines did: GC passes, compactions, bytes reclaimed."""
    totals = {"engine_gc_runs": 0, "engine_compactions": 0, "engine_bytes_reclaimed": 0}
    for b in world.bookies:
        engine = b.engine()
        if engine is None:
            continue
        st = engine.stats()
        totals["engine_gc_runs"] += st.gc_runs
        totals["engine_compactions"] += int(st.extra.get("compactions", 0))
        totals["engine_bytes_reclaimed"] += st.bytes_reclaimed
    return totals


def run_seed(seed: int, *, bookies: int = 5, duration: float = 60.0,
             faults: tuple[str, ...] = FAULT_KINDS, skip: frozenset[int] = frozenset(), shape: Shape = FULL,
             scenario: str | None = None) -> Outcome:
    """Run the schedule of ``seed`` to its end and check it. Deterministic: the same arguments
    give the same trace (and hash). ``skip`` leaves out drawn faults by index (-1: the run-wide
    bad network) and ``shape`` cuts the workload down, as :func:`shrink` does; ``scenario``
    (one of :data:`~ledgerstore.sim.faults.SCENARIOS`) replaces the random faults by that one
    fault at every recovery."""
    loop = VirtualTimeLoop()
    world = World(seed, loop, bookies)
    run = Run(world, duration, faults, skip, shape, scenario)
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            try:
                runner.run(_scenario(run))
            except SimulationStuck as exc:
                run.violation(f"simulation stuck: {exc}", invariants.LIVENESS)
            except LedgerStoreError as exc:
                run.violation(f"the workload failed on a healthy cluster: {exc!r}", invariants.LIVENESS)
    finally:
        world.close()
    run.stats["virtual_s"] = round(loop.clock.now, 3)
    run.stats["frames"] = world.net.sent
    return Outcome(seed, world.trace.digest(), run.violations, world.trace.lines, run.stats, run.broken)


@dataclasses.dataclass(frozen=True)
class Shrunk:
    """A failing seed shrunk: its replay's outcome, and what to replay it with."""

    outcome: Outcome
    #: the invariant that still breaks
    invariant: str
    duration: float
    skip: frozenset[int]
    shape: Shape

    def faults(self) -> tuple[int, int]:
        """How many of the replay's drawn faults it keeps, and how many were drawn."""
        stats = self.outcome.stats
        drawn = [*range(int(stats.get("faults", 0))), *range(AROUND_BASE, AROUND_BASE + int(stats.get("around", 0)))]
        return sum(i not in self.skip for i in drawn), len(drawn)

    def command(self, *, bookies: int, faults: tuple[str, ...], scenario: str | None) -> str:
        """The one command line that replays this run."""
        parts = [f"ledgerstore sim --seeds 1 --seed {self.outcome.seed} --bookies {bookies} "
                 f"--duration {self.duration:g}"]
        if faults != FAULT_KINDS:
            parts.append(f"--faults '{','.join(faults)}'")
        if scenario is not None:
            parts.append(f"--scenario {scenario}")
        if self.skip:
            parts.append(f"--skip='{','.join(str(i) for i in sorted(self.skip))}'")
        if self.shape.ledgers is not None:
            parts.append(f"--ledgers {self.shape.ledgers}")
        if self.shape.entries is not None:
            parts.append(f"--entries {self.shape.entries}")
        if self.shape.without:
            parts.append(f"--without {','.join(p for p in PARTS if p in self.shape.without)}")
        return " ".join(parts)


def shrink(seed: int, *, bookies: int = 5, duration: float = 60.0, faults: tuple[str, ...] = FAULT_KINDS,
           scenario: str | None = None) -> Shrunk:
    """Shrink a failing seed while the *same* invariant breaks (compared by name: the first one
    the seed broke). First the faults: leave out, one at a time, each drawn fault the failure
    does not need (greedy delta debugging; each try is a deterministic replay). Then the
    workload: the other processes (logs, auto-recovery, disk faults, the tailing reader), then
    fewer ledgers, fewer entries and fewer simulated seconds. Returns the smallest run found
    (replay it with :meth:`Shrunk.command`, or ``run_seed`` with its skip and shape)."""
    def run(skip: frozenset[int], shape: Shape, length: float) -> Outcome:
        return run_seed(seed, bookies=bookies, duration=length, faults=faults, skip=skip, shape=shape,
                        scenario=scenario)

    best = run(frozenset(), FULL, duration)
    if best.ok:
        return Shrunk(best, "", duration, frozenset(), FULL)
    target = best.broken[0]
    state = Shrunk(best, target, duration, frozenset(), FULL)

    def attempt(skip: frozenset[int], shape: Shape, length: float) -> bool:
        nonlocal state
        out = run(skip, shape, length)
        if target not in out.broken:
            return False
        state = Shrunk(out, target, length, skip, shape)
        return True

    def drop_faults() -> None:
        stats = state.outcome.stats
        around = range(AROUND_BASE, AROUND_BASE + int(stats.get("around", 0)))
        for index in [-1, *range(int(stats.get("faults", 0))), *around]:
            if index not in state.skip:
                attempt(state.skip | {index}, state.shape, state.duration)

    drop_faults()
    for part in PARTS:
        attempt(state.skip, dataclasses.replace(state.shape, without=state.shape.without | {part}), state.duration)
    for n in range(1, int(state.outcome.stats.get("ledgers", 0))):  # the fewest ledgers that still break it
        fewer = dataclasses.replace(state.shape, ledgers=n)
        # the faults around recoveries are numbered in recovery order: with fewer ledgers, the
        # ones the failure needs may be the ones left out so far
        if attempt(state.skip, fewer, state.duration) or attempt(
                frozenset(i for i in state.skip if i < AROUND_BASE), fewer, state.duration):
            break
    entries = max(1, int(state.outcome.stats.get("acked", 0)))
    while entries > 1 and attempt(state.skip, dataclasses.replace(state.shape, entries=entries // 2), state.duration):
        entries //= 2
    length = state.duration
    while length > 2 and attempt(state.skip, state.shape, length / 2):
        length /= 2
    drop_faults()  # what the smaller workload no longer needs
    return state
