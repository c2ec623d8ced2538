"""The faults of a run: drawn from the seed (:func:`draw_faults`, :func:`draw_fault`), clustered
around recoveries (:meth:`FaultInjector.around_recovery`) and applied to the simulated world
(:meth:`FaultInjector.apply`), until :meth:`FaultInjector.heal` ends them all."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

from ledgerstore.errors import LedgerStoreError
from ledgerstore.proto.codec import Op
from ledgerstore.sim import invariants
from ledgerstore.sim.network import LinkFaults
from ledgerstore.sim.world import World

#: every kind of fault a schedule may draw
FAULT_KINDS = ("lossy-link", "partition", "crash", "pause-writer", "expire-session", "metadata-fail",
               "slow-bookie", "hold-link", "stop-at-add", "read-only", "journal", "lost-answer", "fence-restart",
               "recovery-race", "client-restart",
               "storage",  # crashes inside the entry-log engine's checkpoint, compaction, GC (ledgerstore.sim.diskfaults)
               "wipe")  # a bookie loses its data mid-run, its identity kept (ledgerstore.sim.wipes)
#: kinds aimed at one recovery: drawn only around recoveries (:meth:`FaultInjector.around_recovery`)
AROUND_ONLY = frozenset({"fence-restart", "recovery-race"})
#: kinds drawn by a schedule of their own (``ledgerstore.sim.readonly``, ``ledgerstore.sim.diskfaults``
#: for the faults aimed at the journal's steps, ``ledgerstore.sim.logs``) or only around recoveries,
#: not by :func:`draw_faults`
OWN_SCHEDULE = frozenset({"read-only", "journal", "client-restart", "storage", "wipe"}) | AROUND_ONLY
#: the directed scenarios (``ledgerstore sim --scenario``): every recovery meets that fault
SCENARIOS = ("fence-restart", "lost-answer", "recovery-race", "client-restart",
             # a crash inside a checkpoint, a compaction (three steps) or a GC pass (ledgerstore.sim.diskfaults)
             "crash-in-checkpoint", "crash-in-compaction-copied", "crash-in-compaction-indexed",
             "crash-in-compaction-before-delete", "crash-in-gc")
#: the frames a writer's adds travel in (what a stop-at-add fault waits for)
ADD_OPS = frozenset({Op.ADD, Op.ADD_BATCH})
#: a held link or a stop timed at an add lasts less than the writer's add timeout (10 s): the
#: held add still completes, as in a pause that ends before the client gives up
STOP_AT_ADD = (0.5, 9.0)
#: fault kinds that can hit a ledger's bookies around its recovery ("failover": a bookie of the
#: fragment crashes and the writer stops at its first add to a bookie outside the fragment, i.e.
#: just as it moves to a new ensemble; drawn when "crash" and "stop-at-add" are)
AROUND_RECOVERY = ("lossy-link", "partition", "crash", "pause-writer", "slow-bookie", "hold-link",
                   "stop-at-add", "stop-at-add", "failover", "failover", "fence-restart", "lost-answer",
                   "recovery-race")
#: faults drawn around recoveries are numbered from here (for shrinking)
AROUND_BASE = 10_000


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault: at ``at`` seconds, ``kind`` on ``target`` for ``hold`` seconds."""

    at: float
    kind: str
    target: tuple[str, ...]
    hold: float
    params: tuple[float, ...] = ()


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
    if kind == "lost-answer":
        # the next writes of a client (a create, an ensemble change, a fence or a close by CAS)
        # are applied, but their answers lost: it retries a write that already happened
        return Fault(t, kind, (rng.choice(("writer", "recoverer")),), 0.0, (float(rng.randint(1, 2)),))
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


class FaultInjector:
    """Applies the faults of one run to its world, and heals them all at the end."""

    def __init__(self, world: World, kinds: tuple[str, ...], skip: frozenset[int], stats: dict[str, Any],
                 violation: Callable[[str, str], None]) -> None:
        self.world = world
        self.loop = world.loop
        self.kinds = kinds
        #: indexes of drawn faults left out (shrinking); -1 is the run-wide bad network
        self.skip = skip
        #: the run's statistics (``around``: how many faults were drawn around recoveries)
        self.stats = stats
        stats["around"] = 0
        self.violation = violation
        #: set while the writer process runs (cleared while it is paused)
        self.awake = asyncio.Event()
        self.max_down = 2
        self.around_rng = world.rng_for("around-recovery")
        #: set once :meth:`heal` ran: no fault starts after it
        self.healed = False
        #: bookies crashed for good: restarted only after the final recoveries
        self.lost: set[str] = set()
        #: bookies wiped mid-run (``ledgerstore.sim.wipes``): none is lost for good after one
        self.wiped: set[str] = set()
        #: the directed scenario: every recovery meets this fault (None: drawn at random)
        self.scenario: str | None = None
        #: starts a second recovery of a ledger, and marks it for auto-recovery (the workload's)
        self.on_race: Callable[[int], None] | None = None
        #: paused processes -> the timer that wakes them
        self._wakes: dict[str, asyncio.TimerHandle] = {}
        #: awaited at each recovery before the faults around it are drawn, with the ledger's
        #: current fragment and id (the mid-run wipe's hook; it draws from its own generator)
        self.before_recovery: Callable[[list[str], int], Awaitable[None]] | None = None

    async def around_recovery(self, ensemble: list[str], ledger_id: int) -> None:
        """Faults cluster where protocols race: most recoveries meet a fault on a bookie of
        the ledger's current fragment ``ensemble`` (or on a link to it, or a writer pause),
        starting from a second before the recovery to half a second into it."""
        if self.before_recovery is not None:
            await self.before_recovery(ensemble, ledger_id)
        rng = self.around_rng
        failover = "crash" in self.kinds and "stop-at-add" in self.kinds
        kinds = [k for k in AROUND_RECOVERY if k in self.kinds or (k == "failover" and failover)]
        if self.scenario is not None:
            kinds = [self.scenario] if self.scenario in AROUND_RECOVERY else []
        if not kinds or (rng.random() >= 0.8 and self.scenario is None) or self.healed:
            return
        bookies = ensemble
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
        elif kind == "fence-restart":
            # the writer stops now, before the recovery fences; once the ledger is closed every
            # fenced bookie crashes and restarts in turn (after a checkpoint, or with the fence
            # only in its journal), then the writer wakes and adds again
            offset = 0.0
            faults = [Fault(at, kind, (str(ledger_id), *bookies), rng.uniform(0.2, 3.0),
                            (float(rng.random() < 0.5),))]
        elif kind == "recovery-race":
            # a second recoverer and an auto-recovery worker go for the same ledger
            faults = [Fault(at, kind, (str(ledger_id),), 0.0)]
        elif kind == "lost-answer":  # the recoverer's fence or close by CAS applies, unanswered
            faults = [dataclasses.replace(draw_fault(rng, kind, at, ["recoverer"], bookies), target=("recoverer",))]
        else:
            faults = [draw_fault(rng, kind, at, ["writer", "recoverer"], bookies)]
        index = AROUND_BASE + self.stats["around"]
        self.stats["around"] += 1
        if index not in self.skip:  # left out (shrinking), its timing stays: only the fault goes
            for fault in faults:
                self.world.trace("fault.around-recovery", f"L{ledger_id} {fault}")
                self.loop.call_later(max(0.0, offset), self.apply, fault)
        if offset < 0:
            await asyncio.sleep(-offset)

    async def inject(self, faults: list[Fault]) -> None:
        """Apply each of ``faults`` at its time."""
        for f in faults:
            await asyncio.sleep(max(0.0, f.at - self.loop.time()))
            self.apply(f)

    def apply(self, f: Fault) -> None:
        """Start fault ``f`` now (and schedule its end); nothing once the world is healed."""
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
            self.pause("writer", f.hold)
        elif f.kind == "stop-at-add":
            client, *bookies = f.target
            for b in bookies:
                net.on_send(client, b, ADD_OPS, functools.partial(self._stop_at_add, f, b))
        elif f.kind == "metadata-fail":
            w.meta.fail_writes(f.target[0], int(f.params[0]))
        elif f.kind == "lost-answer":
            w.meta.lose_answers(f.target[0], int(f.params[0]))
        elif f.kind == "fence-restart":
            self.pause("writer", 3600.0)  # woken once the bookies are back
            self.loop.create_task(self._fence_restart(f))
        elif f.kind == "recovery-race":
            if self.on_race is not None:
                self.on_race(int(f.target[0]))
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
            if f.params and f.params[0] and not self.wiped:
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
            self.pause(client, f.hold)
            return
        if (client, bookie) not in net.held_links:
            net.hold_link(client, bookie)
            self.loop.call_later(f.hold, net.release_link, client, bookie)
        if drop:
            for other in ("writer", "recoverer"):
                if other != client:
                    net.set_faults(other, bookie, LinkFaults(drop=drop))
                    self.loop.call_later(f.hold, net.clear_faults, other, bookie)

    async def _fence_restart(self, f: Fault) -> None:
        """Once ledger ``f.target[0]`` is closed: crash and restart each of its bookies in turn
        (each after a checkpoint when ``f.params[0]``), then wake the writer."""
        w = self.world
        lid = int(f.target[0])
        while not self.healed:
            md = w.meta.ledger(lid)
            if md is not None and md.is_closed:
                break
            await asyncio.sleep(0.1)
        for name in f.target[1:]:
            node = w.bookie(name)
            down = sum(not x.running for x in w.bookies)
            if self.healed or node.bookie is None or name in self.lost or down >= self.max_down:
                continue
            if f.params[0]:
                node.bookie.checkpoint()
            w.trace("fault.fence-restart", f"L{lid} {name} {'after' if f.params[0] else 'before'} a checkpoint")
            node.crash()
            await asyncio.sleep(f.hold)
            await self.restart(name)
        if not self.healed:
            self.wake_now("writer")

    def pause(self, node: str, hold: float) -> None:
        """Pause the process ``node`` for ``hold`` seconds (nothing it sends or is sent moves)."""
        net = self.world.net
        if node in net.held:
            return
        net.hold(node)
        if node == "writer":
            self.awake.clear()
        self._wakes[node] = self.loop.call_later(hold, self._wake, node)

    def wake_now(self, node: str) -> None:
        """Wake the paused process ``node`` before its time."""
        timer = self._wakes.get(node)
        if timer is not None and node in self.world.net.held:
            timer.cancel()
            self._wake(node)

    def _wake(self, node: str) -> None:
        self._wakes.pop(node, None)
        self.world.net.release(node)
        if node == "writer":
            self.awake.set()

    def _schedule_restart(self, name: str) -> None:
        self.loop.create_task(self.restart(name))

    async def restart(self, name: str) -> None:
        """Start the bookie ``name`` again if it is down (a failure to start is a violation)."""
        b = self.world.bookie(name)
        if not b.running:
            try:
                await b.start()
            except LedgerStoreError as exc:
                self.violation(f"{name} did not restart: {exc}", invariants.LIVENESS)

    async def heal(self) -> None:
        """End every fault: the cluster is healthy and quiet for the final checks."""
        w = self.world
        self.healed = True
        w.net.heal()
        w.meta.failing.clear()
        w.meta.unanswered.clear()
        for node in list(w.net.held):
            w.net.release(node)
        self.awake.set()
        for b in w.bookies:
            if b.name not in self.lost:
                await self.restart(b.name)
        await self.started()

    async def replace_lost(self) -> None:
        """The operator brings the lost machines back (same disks, same ids)."""
        for name in sorted(self.lost):
            await self.restart(name)
        self.lost.clear()
        await self.started()

    async def started(self) -> None:
        """Wait until no bookie is still starting."""
        while any(b.starting for b in self.world.bookies):
            await asyncio.sleep(0.1)
