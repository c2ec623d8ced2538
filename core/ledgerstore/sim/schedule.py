"""One simulated run: a workload, a fault schedule and the invariants, all from one seed.

The workload: a writer appends to a ledger (pipelined); at a random time a recoverer opens the
ledger with recovery (fence, recover the tail, close) while the writer may still be writing or
paused. Faults are drawn from the seed (:func:`draw_faults`). At the end the world is healed
(partitions removed, paused processes woken, crashed bookies restarted) and the invariants of
``DESIGN.md`` are checked (:func:`check_ledger`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import random
from typing import Any

from ledgerstore.client.client import Client
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.proto.codec import Op
from ledgerstore.sim.auditor import AutoRecovery
from ledgerstore.sim.diskfaults import DiskFaultSchedule
from ledgerstore.sim.logs import LogWorkload
from ledgerstore.sim.loop import SimulationStuck, VirtualTimeLoop
from ledgerstore.sim.network import LinkFaults
from ledgerstore.sim.readonly import ReadOnlySpells
from ledgerstore.sim.world import World

log = logging.getLogger(__name__)

#: every kind of fault a schedule may draw
FAULT_KINDS = ("lossy-link", "partition", "crash", "pause-writer", "expire-session", "metadata-fail",
               "slow-bookie", "hold-link", "stop-at-add", "read-only")
#: kinds drawn by a schedule of their own (``ledgerstore.sim.readonly``), not by :func:`draw_faults`
OWN_SCHEDULE = frozenset({"read-only"})
PASSWORD = b"sim"
#: the frames a writer's adds travel in (what a stop-at-add fault waits for)
ADD_OPS = frozenset({Op.ADD, Op.ADD_BATCH})
#: a held link or a stop timed at an add lasts less than the writer's add timeout (10 s): the
#: held add still completes, as in a pause that ends before the client gives up
STOP_AT_ADD = (0.5, 9.0)


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault: at ``at`` seconds, ``kind`` on ``target`` for ``hold`` seconds."""

    at: float
    kind: str
    target: tuple[str, ...]
    hold: float
    params: tuple[float, ...] = ()


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


@dataclasses.dataclass
class _Ledger:
    """One ledger of the run: what its writer saw acknowledged and how recovery closed it."""

    ledger_id: int
    acked: dict[int, bytes] = dataclasses.field(default_factory=dict)
    order: list[int] = dataclasses.field(default_factory=list)
    failed: BaseException | None = None
    outstanding: int = 0
    recovered: LedgerMetadata | None = None
    #: the writer's handle (the schedule may look at its current fragment)
    handle: Any = None


def draw_faults(rng: random.Random, clients: list[str], bookies: list[str], duration: float,
                kinds: tuple[str, ...] = FAULT_KINDS, mean_gap: float = 4.0) -> list[Fault]:
    """The fault schedule of a run (a pure function of ``rng``'s state). Network faults hit the
    links that carry traffic: between a client and a bookie, in either direction."""
    out: list[Fault] = []
    t = 0.0
    kinds = tuple(k for k in kinds if k not in OWN_SCHEDULE)
    if not kinds:
        return out

    while True:
        t += rng.expovariate(1.0 / mean_gap)
        if t > duration * 0.9:
            return out
        out.append(draw_fault(rng, rng.choice(kinds), t, clients, bookies))


def draw_fault(rng: random.Random, kind: str, t: float, clients: list[str], bookies: list[str]) -> Fault:
    """One fault of ``kind`` starting at ``t``, on one of ``bookies`` (or a link between it and
    one of ``clients``), its length and parameters drawn from ``rng``."""
    def link() -> tuple[str, str]:
        pair = (rng.choice(clients), rng.choice(bookies))
        return pair if rng.random() < 0.5 else (pair[1], pair[0])

    hold = math.exp(rng.uniform(math.log(0.1), math.log(15.0)))  # short blips as often as long cuts
    if kind == "lossy-link":
        a, b = link()
        params = (rng.choice((0.0, 0.01, 0.1, 0.5)), rng.choice((0.0, 0.05)), rng.choice((0.0, 0.2)),
                  rng.choice((0.002, 0.05, 0.5, 3.0)), rng.choice((0.0, 0.05, 0.3)))
        return Fault(t, kind, (a, b), hold, params)
    if kind == "partition":
        a, b = link()
        return Fault(t, kind, (a, b), hold, (float(rng.random() < 0.5),))
    if kind == "pause-writer":
        return Fault(t, kind, ("writer",), rng.uniform(1.0, 30.0))
    if kind == "metadata-fail":
        return Fault(t, kind, (rng.choice(("writer", "recoverer")),), 0.0, (float(rng.randint(1, 3)),))
    if kind == "slow-bookie":
        # a congested or overloaded bookie: frames to it are late by a heavy-tailed delay (each
        # on its own link, so one client's frame waits seconds while another's pass), a few are
        # lost, and some reset their connection
        tail = (rng.choice((0.05, 0.2, 0.6)), rng.choice((0.3, 1.0, 3.0)), rng.choice((0.0, 0.1, 0.3, 0.5)),
                rng.choice((0.0, 0.0, 0.1)))
        return Fault(t, kind, (rng.choice(bookies),), hold, tail)
    if kind == "hold-link":
        # one process stopped between two sends: its frames to one bookie wait, the rest went out
        return Fault(t, kind, (rng.choice(clients), rng.choice(bookies)), hold)
    if kind == "stop-at-add":
        # timed to a protocol step, not to a clock: at the client's next add to the bookie, either
        # the whole process stops (a GC pause just as it sends) or only that connection does (its
        # send buffer full, a TCP retransmission wait) while the bookie's other connections lose
        # frames (a flaky port); either way the add that triggered it waits too
        return Fault(t, kind, (rng.choice(clients), rng.choice(bookies)), rng.uniform(*STOP_AT_ADD),
                     (float(rng.random() < 0.3), rng.choice((0.0, 0.3, 0.5))))
    if kind == "crash":
        # one crash in six is a machine lost until the end of the run: the final recoveries run
        # without it, as an operator's would before the machine is replaced
        return Fault(t, kind, (rng.choice(bookies),), hold, (float(rng.random() < 1 / 6),))
    return Fault(t, kind, (rng.choice(bookies),), hold)  # crash, expire-session


#: fault kinds that can hit a ledger's bookies around its recovery ("failover": a bookie of the
#: fragment crashes and the writer stops at its first add to a bookie outside the fragment, i.e.
#: just as it moves to a new ensemble; drawn when "crash" and "stop-at-add" are)
AROUND_RECOVERY = ("lossy-link", "partition", "crash", "pause-writer", "slow-bookie", "hold-link",
                   "stop-at-add", "stop-at-add", "failover", "failover")
#: faults drawn around recoveries are numbered from here (for shrinking)
AROUND_BASE = 10_000


class _Run:
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
        self.ledgers: list[_Ledger] = []
        #: set while the writer process runs (cleared while it is paused)
        self.awake = asyncio.Event()
        self.max_down = 2
        self.stats: dict[str, Any] = {"around": 0}
        self.around_rng = world.rng_for("around-recovery")
        #: set once :meth:`heal` ran: no fault starts after it
        self.healed = False
        #: bookies crashed for good: restarted only after the final recoveries
        self.lost: set[str] = set()
        #: bookies turned read-only for spells (around recoveries too)
        self.read_only = ReadOnlySpells(self)

    def violation(self, text: str) -> None:
        self.world.trace("VIOLATION", text)
        self.violations.append(text)

    # --- the writer ------------------------------------------------------------------------------

    def _acked(self, fut: asyncio.Future[int], led: _Ledger, payload: bytes) -> None:
        led.outstanding -= 1
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            if led.failed is None:
                led.failed = exc
                self.world.trace("writer.failed", f"L{led.ledger_id} {type(exc).__name__}")
            return
        eid = fut.result()
        self.world.trace("writer.ack", f"L{led.ledger_id} {eid}")
        if led.order and eid <= led.order[-1]:
            self.violation(f"ledger {led.ledger_id}: ack of entry {eid} after the ack of entry {led.order[-1]} "
                           "(acks out of order)")
        led.order.append(eid)
        led.acked[eid] = payload

    async def write(self, client: Client, rng: random.Random, until: float) -> _Ledger | None:
        """Create a ledger and append to it (pipelined) until ``until`` or its first failure."""
        n = len(self.world.bookies)
        ens = rng.randint(min(3, n), min(4, n))
        qw = rng.randint(min(2, ens), ens)
        # Qa = Qw (the usual E3 Qw2 Qa2) more often than not: one "missing" answer then ends a
        # recovery read, which is where fencing races show
        qa = qw if rng.random() < 0.7 else max(1, qw - 1)
        while True:
            try:
                lh = await client.create_ledger(ens, qw, qa, password=PASSWORD)
                break
            except LedgerStoreError as exc:  # metadata failures, too few bookies: try again
                self.world.trace("writer.create_failed", type(exc).__name__)
                if self.loop.time() >= until:
                    return None
                await asyncio.sleep(1.0)
        led = _Ledger(lh.ledger_id, handle=lh)
        self.ledgers.append(led)
        window = rng.choice((1, 1, 1, 2, 4, 16))  # 1: a writer that waits for each ack (sync API)
        mean_gap = rng.choice((0.005, 0.02, 0.1, 0.3))
        # a deep pipeline appends in bursts (a batch handed over at once): every entry of a burst
        # carries the LAC of when it went out, so the bookies' LAC lags what the writer saw acked
        burst = rng.choice((1, 4, 8)) if window == 16 else 1
        self.world.trace("writer.created", f"L{lh.ledger_id} E/Qw/Qa {ens}/{qw}/{qa} window {window} "
                         f"burst {burst} gap {mean_gap}")
        i = 0
        while self.loop.time() < until and led.failed is None:
            await self.awake.wait()
            while led.outstanding + burst > window and led.failed is None:
                await asyncio.sleep(0.01)
            for _ in range(burst):
                if led.failed is not None:
                    break
                payload = f"{self.world.seed}:{led.ledger_id}:{i}".encode()
                i += 1
                try:
                    fut = lh.append_async(payload)
                except LedgerStoreError as exc:
                    led.failed = exc
                    self.world.trace("writer.refused", f"L{led.ledger_id} {type(exc).__name__}")
                    break
                led.outstanding += 1
                fut.add_done_callback(functools.partial(self._acked, led=led, payload=payload))
            await asyncio.sleep(rng.expovariate(1 / mean_gap))
        return led

    async def rounds(self, writer: Client, recoverer: Client) -> None:
        """Ledger after ledger; each may be recovered by the recoverer while it is being written."""
        rng = self.world.rng_for("rounds")
        k = rng.randint(2, 6)
        length = self.duration / k
        for r in range(k):
            end = (r + 1) * length
            at = rng.uniform(self.loop.time(), end) if rng.random() < 0.8 else None
            ledger = self.loop.create_task(self.write(writer, rng, end))
            if at is not None:
                self.loop.create_task(self._recover_when_created(recoverer, ledger, at))
            await ledger
            await asyncio.sleep(max(0.0, end - self.loop.time()))

    async def _recover_when_created(self, client: Client, ledger: asyncio.Task[_Ledger | None], at: float) -> None:
        count = len(self.ledgers)
        await asyncio.sleep(max(0.0, at - self.loop.time()))
        while len(self.ledgers) == count:  # not created yet
            if ledger.done():
                return
            await asyncio.sleep(0.1)
        led = self.ledgers[count]
        await self.around_recovery(led)
        self.read_only.around([b.split(":")[0] for b in led.handle.md.ensembles[-1][1]])
        while led.recovered is None and self.loop.time() < self.duration:
            if not await self.recover(client, led):
                await asyncio.sleep(2.0)

    async def around_recovery(self, led: _Ledger) -> None:
        """Faults cluster where protocols race: most recoveries meet a fault on a bookie of
        the ledger's current fragment (or on a link to it, or a writer pause), starting from a
        second before the recovery to half a second into it."""
        rng = self.around_rng
        failover = "crash" in self.kinds and "stop-at-add" in self.kinds
        kinds = [k for k in AROUND_RECOVERY if k in self.kinds or (k == "failover" and failover)]
        if not kinds or rng.random() >= 0.8 or self.healed:
            return
        bookies = [b.split(":")[0] for b in led.handle.md.ensembles[-1][1]]
        offset = rng.uniform(-1.0, 0.5)
        at = self.loop.time() + max(0.0, offset)
        kind = rng.choice(kinds)
        if kind == "failover":
            # a bookie of the fragment crashes just after its answer to an add reached the writer
            # (the next adds in flight to it, the writer's LAC ahead of what it last sent), and
            # the writer stops as it first sends to a bookie outside the fragment: the new one
            crash = draw_fault(rng, "crash", at, ["writer"], bookies)
            others = [b.name for b in self.world.bookies if b.name not in bookies]
            stop = draw_fault(rng, "stop-at-add", at, ["writer"], others)
            faults = [dataclasses.replace(crash, target=(crash.target[0], crash.target[0])),
                      dataclasses.replace(stop, target=("writer", *others), params=(1.0, 0.0))]
        elif kind == "stop-at-add":  # the writer's add to a bookie of the fragment
            faults = [draw_fault(rng, kind, at, ["writer"], bookies)]
        else:
            faults = [draw_fault(rng, kind, at, ["writer", "recoverer"], bookies)]
        index = AROUND_BASE + self.stats["around"]
        self.stats["around"] += 1
        if index not in self.skip:  # left out (shrinking), its timing stays: only the fault goes
            for fault in faults:
                self.world.trace("fault.around-recovery", f"L{led.ledger_id} {fault}")
                self.loop.call_later(max(0.0, offset), self.apply, fault)
        if offset < 0:
            await asyncio.sleep(-offset)

    # --- recovery --------------------------------------------------------------------------------

    async def recover(self, client: Client, led: _Ledger) -> bool:
        """One attempt to open ``led`` with recovery (fence, recover the tail, close)."""
        try:
            rh = await asyncio.wait_for(client.open_ledger(led.ledger_id, PASSWORD, recovery=True), 120)
        except (LedgerStoreError, TimeoutError) as exc:
            self.world.trace("recovery.failed", f"L{led.ledger_id} {type(exc).__name__}")
            return False
        led.recovered = rh.metadata
        self.world.trace("recovery.closed", f"L{led.ledger_id} last entry {rh.metadata.last_entry_id}")
        return True

    # --- faults ----------------------------------------------------------------------------------

    async def inject(self, faults: list[Fault]) -> None:
        for f in faults:
            await asyncio.sleep(max(0.0, f.at - self.loop.time()))
            self.apply(f)

    def apply(self, f: Fault) -> None:
        if self.healed:
            return
        w = self.world
        net = w.net
        later = self.loop.call_later
        if f.kind == "lossy-link":
            a, b = f.target
            drop, dup, reorder, delay, stall = f.params
            net.set_faults(a, b, LinkFaults(max_delay=delay, drop=drop, duplicate=dup, reorder=reorder, stall=stall))
            later(f.hold, net.clear_faults, a, b)
        elif f.kind == "partition":
            a, b = f.target
            net.partition(a, b, one_way=bool(f.params[0]))
            later(f.hold, net.reconnect, a, b)
        elif f.kind == "slow-bookie":
            tail, scale, drop, reset = f.params
            for client in ("writer", "recoverer"):
                net.set_faults(client, f.target[0], LinkFaults(drop=drop, tail=tail, tail_scale=scale, reset=reset))
                later(f.hold, net.clear_faults, client, f.target[0])
        elif f.kind == "hold-link":
            a, b = f.target
            if (a, b) in net.held_links:
                return
            net.hold_link(a, b)
            later(f.hold, net.release_link, a, b)
        elif f.kind == "pause-writer":
            self._pause("writer", f.hold)
        elif f.kind == "stop-at-add":
            client, *bookies = f.target
            for b in bookies:
                net.on_send(client, b, ADD_OPS, functools.partial(self._stop_at_add, f, b))
        elif f.kind == "metadata-fail":
            w.meta.fail_writes(f.target[0], int(f.params[0]))
        elif f.kind == "expire-session":
            node = w.bookie(f.target[0])
            if node.store is not None and node.running:
                node.store.expire_session()
        elif f.kind == "crash":
            if len(f.target) > 1:  # timed: as the writer hears target[1]'s next answer to an add
                net.on_arrive(f.target[1], "writer", ADD_OPS, functools.partial(self._crash, f))
            else:
                self._crash(f)

    def _crash(self, f: Fault) -> None:
        w = self.world
        node = w.bookie(f.target[0])
        down = sum(not x.running for x in w.bookies)
        if node.running and down < self.max_down and not self.healed:
            node.crash()
            if f.params and f.params[0]:
                self.lost.add(node.name)
                w.trace("bookie.lost", f"{node.name} until the final recoveries")
            else:
                self.loop.call_later(f.hold, self._schedule_restart, node.name)

    def _stop_at_add(self, f: Fault, bookie: str) -> None:
        """``f``'s client is about to send an add to ``bookie``: stop it (or that link) now."""
        net = self.world.net
        client, *bookies = f.target
        for b in bookies:  # one stop per fault, at whichever bookie came first
            net.disarm(client, b, ADD_OPS)
        if self.healed:
            return
        whole, drop = f.params
        if whole:
            self._pause(client, f.hold)
            return
        if (client, bookie) not in net.held_links:
            net.hold_link(client, bookie)
            self.loop.call_later(f.hold, net.release_link, client, bookie)
        if drop:
            for other in ("writer", "recoverer"):
                if other != client:
                    net.set_faults(other, bookie, LinkFaults(drop=drop))
                    self.loop.call_later(f.hold, net.clear_faults, other, bookie)

    def _pause(self, node: str, hold: float) -> None:
        """Pause the process ``node`` for ``hold`` seconds (nothing it sends or is sent moves)."""
        net = self.world.net
        if node in net.held:
            return
        net.hold(node)
        if node == "writer":
            self.awake.clear()
        self.loop.call_later(hold, self._wake, node)

    def _wake(self, node: str) -> None:
        self.world.net.release(node)
        if node == "writer":
            self.awake.set()

    def _schedule_restart(self, name: str) -> None:
        self.loop.create_task(self._restart(name))

    async def _restart(self, name: str) -> None:
        b = self.world.bookie(name)
        if not b.running:
            try:
                await b.start()
            except LedgerStoreError as exc:
                self.violation(f"{name} did not restart: {exc}")

    async def heal(self) -> None:
        """End every fault: the cluster is healthy and quiet for the final checks."""
        w = self.world
        self.healed = True
        w.net.heal()
        w.meta.failing.clear()
        for node in list(w.net.held):
            w.net.release(node)
        self.awake.set()
        for b in w.bookies:
            if b.name not in self.lost:
                await self._restart(b.name)
        while any(b.starting for b in w.bookies):
            await asyncio.sleep(0.1)

    async def replace_lost(self) -> None:
        """The operator brings the lost machines back (same disks, same ids) and frees the full
        disks."""
        await self.read_only.free()
        for name in sorted(self.lost):
            await self._restart(name)
        self.lost.clear()
        while any(b.starting for b in self.world.bookies):
            await asyncio.sleep(0.1)

    def must_recover(self, md: LedgerMetadata) -> str | None:
        """Why the ledger of ``md`` must be recoverable with the lost bookies still down and the
        read-only ones still read-only (None if it need not be): at most Qa−1 bookies of any
        fragment are lost, so every write quorum of the last one still has Qw−Qa+1 to fence and
        every acknowledged entry a copy recovery can read back (it reads 0..LAC to learn the
        length), and a writable bookie outside the last fragment can take each lost one's place
        (issue 14 item 2: recovery's write-back replaces a bookie that does not answer); a
        read-only bookie is running and takes recovery adds (item 6)."""
        read_only = self.read_only.read_only()
        if not self.lost and not read_only:
            return None
        ensemble = [b.split(":")[0] for b in md.ensembles[-1][1]]
        lost = [b for b in ensemble if b in self.lost]
        spares = [b for b in self.world.bookies if b.running and b.name not in ensemble and b.name not in read_only]
        if any(sum(b.split(":")[0] in self.lost for b in bookies) > md.ack_quorum - 1 for _, bookies in md.ensembles):
            return None
        if len(spares) < len(lost) or not (lost or read_only & set(ensemble)):
            return None
        return (f"{lost} lost (Qa {md.ack_quorum}), {sorted(read_only & set(ensemble))} of its last fragment "
                f"read-only, {len(spares)} writable spare bookies running")


async def _scenario(run: _Run) -> None:
    w = run.world
    loop = run.loop
    d = run.duration
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
    run.awake.set()
    work = loop.create_task(run.rounds(writer, recoverer), name="rounds")
    inject = loop.create_task(run.inject(faults), name="faults")
    await asyncio.sleep(d)
    inject.cancel()
    await run.heal()
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
    await run.read_only.at_the_end([[b.split(":")[0] for b in led.handle.md.ensembles[-1][1]]
                                    for led in run.ledgers if led.recovered is None])
    for led in run.ledgers:  # with the lost bookies still down (and full disks still full)
        await _recover_at_the_end(run, recoverer, led)
    await run.replace_lost()
    await logs.finish()  # the log's final takeover and checks, before a bookie is wiped
    run.stats.update(logs.stats)
    await autorecovery.settle()
    run.stats.update(autorecovery.stats)
    for led in run.ledgers:  # auto-recovery may have replaced bookies since recovery closed it
        led.recovered = led.recovered and autorecovery.current(led.ledger_id)
    reader = await w.client("reader").start()
    for led in run.ledgers:
        if led.recovered is None:
            await _recover_at_the_end(run, recoverer, led)
        if led.recovered is None:
            run.violation(f"ledger {led.ledger_id} could not be recovered on a healthy cluster")
        else:
            await check_ledger(run, led, reader)
    run.stats.update(disks.stats, flipped_reads=disks.flipped())
    run.stats.update(run.read_only.stats)
    run.stats["ledgers"] = len(run.ledgers)
    run.stats["acked"] = sum(len(led.acked) for led in run.ledgers)


async def _recover_at_the_end(run: _Run, recoverer: Client, led: _Ledger) -> None:
    """Recover ``led`` if no one did (ten tries); with bookies still lost, it must succeed when
    :meth:`_Run.must_recover` says so."""
    for _ in range(10):
        if led.recovered is not None or await run.recover(recoverer, led):
            return
        await asyncio.sleep(2.0)
    try:
        md = await recoverer.ledger_metadata(led.ledger_id)
    except LedgerStoreError:
        return
    why = run.must_recover(md)
    if why is not None:
        run.violation(f"ledger {led.ledger_id} could not be recovered with {why}")


async def check_ledger(run: _Run, led: _Ledger, reader: Client) -> None:
    """The invariants of one recovered ledger against what its writer saw acknowledged."""
    md = led.recovered
    assert md is not None
    lid = led.ledger_id
    acked = led.acked
    if led.order != list(range(len(led.order))):
        run.violation(f"ledger {lid}: acknowledged entries are not a prefix 0..k: {led.order[:8]}")
    beyond = [e for e in acked if e > md.last_entry_id]
    if beyond:
        run.violation(f"ledger {lid}: entries {beyond[:5]} were acknowledged to the writer but the ledger was "
                      f"closed at {md.last_entry_id} (an ack after fencing, or recovery lost them)")
    for first, bookies in md.ensembles:
        if len(set(bookies)) != len(bookies):
            run.violation(f"ledger {lid}: the fragment at entry {first} names a bookie twice: {bookies}")
    try:
        rh = await reader.open_ledger(lid, PASSWORD, recovery=True)
        entries = await rh.read(0, md.last_entry_id) if md.last_entry_id >= 0 else []
    except LedgerStoreError as exc:
        run.violation(f"ledger {lid}: reading 0..{md.last_entry_id} failed: {exc!r}")
        return
    got = {e.entry_id: e.payload for e in entries}
    # issue 14 item 9: a recovered ledger's length is the payload bytes of entries 0..LAC, in its
    # metadata and on every handle opened afterwards
    length = sum(len(p) for p in got.values())
    if len(got) == md.last_entry_id + 1 and (md.length, rh.length) != (length, length):
        run.violation(f"ledger {lid}: closed at {md.last_entry_id} with {length} payload bytes, but its metadata "
                      f"says length {md.length} and a handle opened afterwards {rh.length}")
    for eid, payload in acked.items():
        if eid <= md.last_entry_id and got.get(eid) != payload:
            run.violation(f"ledger {lid}: acknowledged entry {eid} reads back as {got.get(eid)!r}, not {payload!r}")
    engines = {b.bookie_id: b.engine() for b in run.world.bookies}
    for eid in acked:
        if eid > md.last_entry_id:
            continue
        _, ensemble = md.ensemble_for(eid)
        holders = [ensemble[i] for i in md.write_set(eid)]
        have = 0
        for bid in holders:
            eng = engines.get(bid)
            if eng is not None and eid in eng.ledgers.get(lid, _NO_LEDGER).entries:
                have += 1
        if have < md.ack_quorum:
            run.violation(f"ledger {lid}: acknowledged entry {eid} is on {have} of its write set {holders} "
                          f"(Qa {md.ack_quorum})")


class _Empty:
    entries: dict[int, bytes] = {}


_NO_LEDGER: Any = _Empty()


def run_seed(seed: int, *, bookies: int = 5, duration: float = 60.0,
             faults: tuple[str, ...] = FAULT_KINDS, skip: frozenset[int] = frozenset()) -> Outcome:
    """Run the schedule of ``seed`` to its end and check it. Deterministic: the same arguments
    give the same trace (and hash). ``skip`` leaves out drawn faults by index (-1: the run-wide
    bad network), as :func:`shrink` does."""
    loop = VirtualTimeLoop()
    world = World(seed, loop, bookies)
    run = _Run(world, duration, faults, skip)
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
