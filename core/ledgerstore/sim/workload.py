"""The ledger workload of a run: a writer appends to ledger after ledger (pipelined) and, at a
random time, a recoverer opens the ledger with recovery (fence, recover the tail, close) while
the writer may still be writing or paused."""

from __future__ import annotations

import asyncio
import functools
import random

from ledgerstore.client.client import Client
from ledgerstore.errors import LedgerStoreError
from ledgerstore.recovery.markers import UnderReplicationManager
from ledgerstore.sim import invariants
from ledgerstore.sim.auditor import EPOCH
from ledgerstore.sim.faults import FaultInjector
from ledgerstore.sim.invariants import PASSWORD, Ledger
from ledgerstore.sim.readonly import ReadOnlySpells
from ledgerstore.sim.world import World


class LedgerWorkload:
    """The writer and the recoverer of one run, and the ledgers they made."""

    def __init__(self, world: World, duration: float, faults: FaultInjector, read_only: ReadOnlySpells,
                 violation: invariants.Report) -> None:
        self.world = world
        self.loop = world.loop
        self.duration = duration
        self.faults = faults
        self.read_only = read_only
        self.violation = violation
        self.ledgers: list[Ledger] = []
        #: the process tailing each ledger as it is written (None: no tailing reader)
        self.tailer: Client | None = None
        self.tail_rng = world.rng_for("tailer")
        faults.on_race = self.race
        #: at most this many ledgers, of at most this many adds each before its recovery begins
        #: and as many again after (None: as drawn; shrinking)
        self.ledgers_max: int | None = None
        self.entries_max: int | None = None
        #: the second recoverer (started at the first race)
        self.racer: Client | None = None

    # --- the writer ------------------------------------------------------------------------------

    def _acked(self, fut: asyncio.Future[int], led: Ledger, payload: bytes) -> None:
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
        broken = invariants.acks_in_order(led.ledger_id, led.order, eid)
        if broken is not None:
            self.violation(broken, invariants.ACKS_IN_ORDER)
        led.order.append(eid)
        led.acked[eid] = payload

    async def write(self, client: Client, rng: random.Random, until: float) -> Ledger | None:
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
        led = Ledger(lh.ledger_id, handle=lh)
        lh.send_observer = invariants.PiggybackedLac(self.violation, led)
        self.ledgers.append(led)
        if self.tailer is not None:
            self.loop.create_task(self.tail(self.tailer, led, until))
        window = rng.choice((1, 1, 1, 2, 4, 16))  # 1: a writer that waits for each ack (sync API)
        mean_gap = rng.choice((0.005, 0.02, 0.1, 0.3))
        # a deep pipeline appends in bursts (a batch handed over at once): every entry of a burst
        # carries the LAC of when it went out, so the bookies' LAC lags what the writer saw acked
        burst = rng.choice((1, 4, 8)) if window == 16 else 1
        self.world.trace("writer.created", f"L{lh.ledger_id} E/Qw/Qa {ens}/{qw}/{qa} window {window} "
                         f"burst {burst} gap {mean_gap}")
        i = 0
        while self.loop.time() < until and led.failed is None:
            await self.faults.awake.wait()
            while led.outstanding + burst > window and led.failed is None:
                await asyncio.sleep(0.01)
            for _ in range(burst):
                if led.failed is not None or (self.entries_max is not None and i >= led.cap(self.entries_max)):
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
                led.futures.append(fut)
                fut.add_done_callback(functools.partial(self._acked, led=led, payload=payload))
            await asyncio.sleep(rng.expovariate(1 / mean_gap))
        return led

    async def rounds(self, writer: Client, recoverer: Client) -> None:
        """Ledger after ledger; each may be recovered by the recoverer while it is being written."""
        rng = self.world.rng_for("rounds")
        k = rng.randint(2, 6)
        length = self.duration / k
        for r in range(k if self.ledgers_max is None else min(k, self.ledgers_max)):
            end = (r + 1) * length
            at = rng.uniform(self.loop.time(), end) if rng.random() < 0.8 else None
            ledger = self.loop.create_task(self.write(writer, rng, end))
            if at is not None:
                self.loop.create_task(self._recover_when_created(recoverer, ledger, at))
            await ledger
            await asyncio.sleep(max(0.0, end - self.loop.time()))

    async def _recover_when_created(self, client: Client, ledger: asyncio.Task[Ledger | None], at: float) -> None:
        count = len(self.ledgers)
        await asyncio.sleep(max(0.0, at - self.loop.time()))
        while len(self.ledgers) == count:  # not created yet
            if ledger.done():
                return
            await asyncio.sleep(0.1)
        led = self.ledgers[count]
        led.recovering = True
        await self.faults.around_recovery(led.last_ensemble(), led.ledger_id)
        self.read_only.around(led.last_ensemble())
        while led.recovered is None and self.loop.time() < self.duration:
            if not await self.recover(client, led):
                await asyncio.sleep(2.0)

    # --- the tailing reader ----------------------------------------------------------------------

    async def tail(self, client: Client, led: Ledger, until: float) -> None:
        """Follow ``led`` as a plain reader (no recovery): long-poll the LAC past what was read,
        then read up to it, until ``until`` or the ledger is closed. What it reads is checked
        against the final ledger (:data:`~ledgerstore.sim.invariants.TAIL_READS_COMMITTED`)."""
        rng = self.tail_rng
        try:
            rh = await client.open_ledger(led.ledger_id, PASSWORD, recovery=False)
        except LedgerStoreError as exc:
            self.world.trace("tailer.failed", f"L{led.ledger_id} {type(exc).__name__}")
            return
        known = -1
        while self.loop.time() < until and not self.faults.healed:
            try:
                lac = await rh.wait_for_lac(known, timeout=rng.choice((0.5, 2.0, 5.0)))
                if lac <= known:
                    continue
                entries = await rh.read(known + 1, lac)
            except LedgerStoreError as exc:
                self.world.trace("tailer.failed", f"L{led.ledger_id} {type(exc).__name__}")
                await asyncio.sleep(1.0)
                continue
            past = [e.entry_id for e in entries if e.entry_id > lac]
            if past:
                self.violation(f"ledger {led.ledger_id}: a tailing reader given LAC {lac} read entries {past[:5]}",
                               invariants.TAIL_READS_COMMITTED)
            led.tailed.extend((e.entry_id, e.payload, lac) for e in entries)
            known = lac
            if rh.metadata.is_closed:
                return

    # --- recovery --------------------------------------------------------------------------------

    async def recover(self, client: Client, led: Ledger) -> bool:
        """One attempt to open ``led`` with recovery (fence, recover the tail, close)."""
        try:
            rh = await asyncio.wait_for(client.open_ledger(led.ledger_id, PASSWORD, recovery=True), 120)
        except (LedgerStoreError, TimeoutError) as exc:
            self.world.trace("recovery.failed", f"L{led.ledger_id} {type(exc).__name__}")
            return False
        led.recovered = rh.metadata
        self.world.trace("recovery.closed", f"L{led.ledger_id} last entry {rh.metadata.last_entry_id}")
        return True

    def race(self, ledger_id: int) -> None:
        """A second recoverer opens the ledger ``ledger_id`` with recovery while the first one
        does, and the ledger is marked under-replicated, so an auto-recovery worker goes for it
        at the same time."""
        self.loop.create_task(self._race(ledger_id))

    async def _race(self, ledger_id: int) -> None:
        led = next(x for x in self.ledgers if x.ledger_id == ledger_id)
        client = self.racer or await self.world.client("recoverer-2").start()
        self.racer = client
        if client.store is not None:  # a started client has its store
            markers = UnderReplicationManager(client.store, clock=lambda: EPOCH + self.loop.time())
            try:
                await markers.mark(ledger_id, [led.handle.md.current_ensemble[0]])
            except LedgerStoreError as exc:
                self.world.trace("race.mark_failed", f"L{ledger_id} {type(exc).__name__}")
        self.world.trace("race.recover", f"L{ledger_id} by recoverer-2")
        await self.recover(client, led)

    async def recover_at_the_end(self, recoverer: Client, led: Ledger) -> None:
        """Recover ``led`` if no one did (ten tries); with bookies still lost, it must succeed when
        :func:`~ledgerstore.sim.invariants.must_recover` says so."""
        for _ in range(10):
            if led.recovered is not None or await self.recover(recoverer, led):
                return
            await asyncio.sleep(2.0)
        try:
            md = await recoverer.ledger_metadata(led.ledger_id)
        except LedgerStoreError:
            return
        why = invariants.must_recover(self.world, md, self.faults.lost, self.read_only.read_only())
        if why is not None:
            self.violation(f"ledger {led.ledger_id} could not be recovered with {why}", invariants.LIVENESS)
