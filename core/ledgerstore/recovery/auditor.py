"""The auditor: notices lost bookies and marks the ledgers they held as under-replicated.

It watches the bookie registrations (writable and read-only). A bookie known to the cluster (it
has a cookie, or some ledger's metadata names it) that stays unregistered for longer than the
lost-bookie recovery delay is *lost*: every ledger with a fragment on it gets a marker. A
bookie being decommissioned counts as lost at once. A periodic full check of every ledger (and
the shell's ``triggeraudit``) catches whatever events were missed. Marking is idempotent, so two
auditors briefly running side by side do no harm.

A bookie id is not proof of data. The auditor remembers the incarnation (cookie) of every bookie
it sees; a bookie that registers again as another incarnation was formatted and holds nothing of
its old ledgers, so they are all marked at once, whatever the delay. Before marking, the auditor
records what was lost of the bookie (:class:`~ledgerstore.recovery.markers.LossRecord`), which
is what lets a worker tell "the same bookie came back" from "a new bookie took the id". And every
``replicas_check_interval_s`` (or on ``triggeraudit --replicas``) it runs the replicas check
(:mod:`ledgerstore.recovery.replicas`): every bookie is asked which ledgers it really holds,
but a bookie repairing its limbo ledgers itself is left to that repair while it makes progress
(:mod:`ledgerstore.recovery.limbo_patience`, remembered here from one check to the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ledgerstore.api import Notification, Subscription
from ledgerstore.client.channel import ChannelPool
from ledgerstore.config import AutoRecoveryConfig, ClientConfig
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import BookieRegistry
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.recovery.limbo_patience import LimboPatience
from ledgerstore.recovery.markers import (
    AUDIT_TRIGGER,
    DECOMMISSION,
    ENABLE,
    GONE,
    LOST_BOOKIE_DELAY,
    REFORMATTED,
    UnderReplicationManager,
)
from ledgerstore.recovery.replicas import ReplicasCheck

log = logging.getLogger(__name__)


class Auditor:
    """Runs (``await run()``) while this process is the elected auditor; cancel it to stop."""

    def __init__(self, store: Any, settings: AutoRecoveryConfig, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        #: how long bookies have been gone and when the last full check ran (the simulation's seam)
        self.clock = clock
        self.markers = UnderReplicationManager(store, wall_clock)
        self.ledgers = LedgerManager(store)
        self.registry = BookieRegistry(store)
        #: bookie id -> monotonic time it was first seen gone
        self.lost_since: dict[str, float] = {}
        self._scanned: set[str] = set()
        self._referenced: set[str] = set()
        self._kick = asyncio.Event()
        self._full_requested = True  # a new auditor checks everything once: events may have been missed
        #: bookie id -> the incarnation it was last seen registered as (see bookie/cookie.py)
        self.incarnations: dict[str, str | None] = {}
        #: bookie id -> the incarnation it had when it was first seen gone
        self._lost_incarnation: dict[str, str | None] = {}
        self._cookies_changed = True
        #: the bookies registered at the last pass
        self._registered: set[str] = set()
        self._replicas_kick = asyncio.Event()
        self._pool: ChannelPool | None = None
        #: how long each bookie in limbo has gone without repairing a ledger (across replicas checks)
        self.limbo = LimboPatience(settings.limbo_patience_s, clock)
        self.stats: dict[str, Any] = {"full_checks": 0, "ledgers_checked": 0, "ledgers_marked": 0,
                                      "replicas_checks": 0, "last_replicas_check": None}

    def _on_event(self, _n: Notification) -> None:
        self._kick.set()

    def _on_trigger(self, _n: Notification) -> None:
        self._full_requested = True
        self._kick.set()
        asyncio.get_running_loop().create_task(self._read_trigger())

    async def _read_trigger(self) -> None:
        try:
            if (await self.markers.audit_trigger()).get("replicas"):
                self._replicas_kick.set()
        except LedgerStoreError as exc:
            log.warning("auditor: could not read the audit trigger: %s", exc)

    def _on_cookie(self, _n: Notification) -> None:
        self._cookies_changed = True
        self._kick.set()

    async def run(self) -> None:
        subs: list[Subscription] = []
        replicas = asyncio.get_running_loop().create_task(self._replicas_loop(), name="replicas-check")
        try:
            for prefix in (layout.AVAILABLE, ENABLE, DECOMMISSION, LOST_BOOKIE_DELAY):
                subs.append(await self.store.watch(prefix, self._on_event))
            subs.append(await self.store.watch(AUDIT_TRIGGER, self._on_trigger))
            subs.append(await self.store.watch(layout.COOKIES, self._on_cookie))
            last_full = self.clock()
            while True:
                try:
                    delay = await self._delay()
                    tick = min(1.0, max(0.1, delay / 4))
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._kick.wait(), tick)
                    self._kick.clear()
                    if not await self.markers.is_enabled():
                        continue
                    if self.clock() - last_full >= self.settings.audit_interval_s:
                        self._full_requested = True
                    full = self._full_requested
                    self._full_requested = False
                    await self.check(delay, full)
                    self.stats["under_replicated_ledgers"] = len(await self.markers.ledger_ids())  # metrics gauge
                    if full:
                        last_full = self.clock()
                except LedgerStoreError as exc:
                    log.warning("auditor: %s (retrying)", exc)
                    await asyncio.sleep(1.0)
        finally:
            for s in subs:
                s.cancel()
            replicas.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await replicas
            if self._pool is not None:
                await self._pool.close()

    async def _replicas_loop(self) -> None:
        """The periodic replicas check, and the ones asked for by ``triggeraudit --replicas``."""
        interval = self.settings.replicas_check_interval_s
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._replicas_kick.wait(), interval if interval > 0 else None)
            self._replicas_kick.clear()
            try:
                if await self.markers.is_enabled():
                    await self.replicas_check()
            except LedgerStoreError as exc:
                log.warning("auditor: replicas check failed: %s (retried at the next one)", exc)

    async def replicas_check(self) -> dict[str, Any]:
        """Ask every bookie which ledgers it holds and mark every closed ledger one of whose
        bookies lacks its share (see :mod:`ledgerstore.recovery.replicas`)."""
        if self._pool is None:
            self._pool = ChannelPool(self.registry.endpoint_of, dict(self.settings.client_transport),
                                     ClientConfig.max_frame_size)
        result = await ReplicasCheck(self.store, self._pool, limbo=self.limbo).run()
        self.stats["replicas_checks"] += 1
        self.stats["last_replicas_check"] = result
        self.stats["ledgers_marked"] += len(result["ledgers_marked"])
        self.stats["bookies_repairing"] = len(result["bookies_repairing"])  # metrics gauge
        return result

    async def _delay(self) -> float:
        override = await self.markers.lost_bookie_delay()
        return self.settings.lost_bookie_recovery_delay_s if override is None else override

    async def check(self, delay: float, full: bool) -> int:
        """One pass: update which bookies are lost and mark the ledgers of those now due, and
        at once those of a bookie back as another incarnation. Returns how many ledgers were
        newly marked."""
        registered = {b.bookie_id for b in await self.registry.all()}
        known = set(await self.store.children(layout.COOKIES)) | self._referenced
        now = self.clock()
        for b in sorted(known - registered):  # sorted: the order of awaits never follows a set's hash order
            if b not in self.lost_since:
                log.info("auditor: bookie %s is gone; its ledgers are marked after %.1fs unless it returns", b, delay)
                self.lost_since[b] = now
                self._lost_incarnation[b] = (self.incarnations[b] if b in self.incarnations
                                             else await self.markers.incarnation(b))
        reformatted = await self._incarnations(registered, full)
        for b in list(self.lost_since):
            if b in registered:
                del self.lost_since[b]
                self._scanned.discard(b)
                old = self._lost_incarnation.pop(b, None)
                if b not in reformatted and old != self.incarnations.get(b):
                    reformatted[b] = old
                if b not in reformatted:
                    log.info("auditor: bookie %s is back", b)
                    if (rec := await self.markers.loss(b)) is not None and rec.reason == GONE:
                        await self.markers.forget_loss(b)
        marked = 0
        if reformatted:
            for b, old in reformatted.items():
                log.warning("auditor: bookie %s is back as another incarnation (%r, was %r): it was formatted and "
                            "holds nothing of its old ledgers; marking every ledger that names it",
                            b, self.incarnations.get(b), old)
            marked += await self._scan(set(reformatted), False, reformatted, REFORMATTED)
        decommissioning = await self.markers.decommissioning()
        self._scanned &= set(self.lost_since) | decommissioning
        due = {b for b, t in self.lost_since.items() if now - t >= delay} | decommissioning
        targets = due if full else due - self._scanned
        if not targets and not full:
            return marked
        marked += await self._scan(targets, full, {b: self._lost_incarnation.get(b) for b in targets})
        self._scanned |= targets
        if full:
            await self._forget_settled_losses(registered)
        return marked

    async def _incarnations(self, registered: set[str], full: bool) -> dict[str, str | None]:
        """Learn the incarnation of every registered bookie (re-read all when a cookie changed);
        return those registered now as another incarnation than before, with the one before."""
        changed: dict[str, str | None] = {}
        reread = self._cookies_changed or full
        self._cookies_changed = False
        # a bookie writes its cookie before it registers: a pass woken by the cookie may run in
        # between, so the cookies of known bookies not registered yet are read too, and a
        # bookie's incarnation is also re-read on the first pass it is registered in
        arrived = registered - self._registered
        self._registered = registered
        for b in sorted(registered | (set(self.incarnations) if reread else set())):
            if b in self.incarnations and not reread and b not in arrived:
                continue
            now = await self.markers.incarnation(b)
            if now is None and b not in registered:
                continue  # gone with its cookie: nothing to learn until it comes back
            if b in self.incarnations and self.incarnations[b] != now:
                changed[b] = self.incarnations[b]
            self.incarnations[b] = now
        return changed

    async def _forget_settled_losses(self, registered: set[str]) -> None:
        """Drop the loss record of a bookie no marker names any more, once it is registered
        again or no ledger names it (a gone bookie's record stays while ledgers name it)."""
        named = {b for m in await self.markers.all() for b in m.missing}
        for b in await self.markers.lost_bookies():
            if b not in named and b not in self.lost_since and (b in registered or b not in self._referenced):
                await self.markers.forget_loss(b)

    async def _scan(self, targets: set[str], full: bool, lost: dict[str, str | None] | None = None,
                    reason: str = GONE) -> int:
        """Mark every ledger naming one of ``targets``, first recording (as ``reason``) which
        incarnation of each was lost (``lost``; a decommissioned bookie's is its current one)."""
        marked = 0
        referenced: set[str] = set()
        lost = {b: (lost or {}).get(b, self.incarnations.get(b)) for b in targets}
        for b in sorted(targets):
            await self.markers.note_loss(b, lost[b], reason)
        # reads overlap (a window of them in flight): a pass over 100,000 ledgers costs about
        # 100,000 / READ_WINDOW round trips, far inside a ZooKeeper session timeout
        async for lid, md in self.ledgers.read_many(self.ledgers.list()):
            if md is None:
                continue
            self.stats["ledgers_checked"] += 1
            refs = md.bookies()
            referenced |= refs
            bad = refs & targets
            if bad and await self.markers.mark(lid, bad, lost):
                marked += 1
        if full:
            self.stats["full_checks"] += 1
            self._referenced = referenced
        self.stats["ledgers_marked"] += marked
        if marked:
            log.info("auditor: marked %d ledgers under-replicated (bookies %s)", marked, sorted(targets))
        return marked
