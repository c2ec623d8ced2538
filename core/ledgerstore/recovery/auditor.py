"""The auditor: notices lost bookies and marks the ledgers they held as under-replicated.

It watches the bookie registrations (writable and read-only). A bookie known to the cluster (it
has a cookie, or some ledger's metadata names it) that stays unregistered for longer than the
lost-bookie recovery delay is *lost*: every ledger with a fragment on it gets a marker. A
bookie being decommissioned counts as lost at once. A periodic full check of every ledger (and
the shell's ``triggeraudit``) catches whatever events were missed. Marking is idempotent, so two
auditors briefly running side by side do no harm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ledgerstore.api import Notification, Subscription
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import LedgerStoreError, NoSuchLedgerError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import BookieRegistry
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.recovery.markers import (
    AUDIT_TRIGGER,
    DECOMMISSION,
    ENABLE,
    LOST_BOOKIE_DELAY,
    UnderReplicationManager,
)

log = logging.getLogger(__name__)


class Auditor:
    """Runs (``await run()``) while this process is the elected auditor; cancel it to stop."""

    def __init__(self, store: Any, settings: AutoRecoveryConfig) -> None:
        self.store = store
        self.settings = settings
        self.markers = UnderReplicationManager(store)
        self.ledgers = LedgerManager(store)
        self.registry = BookieRegistry(store)
        #: bookie id -> monotonic time it was first seen gone
        self.lost_since: dict[str, float] = {}
        self._scanned: set[str] = set()
        self._referenced: set[str] = set()
        self._kick = asyncio.Event()
        self._full_requested = True  # a new auditor checks everything once: events may have been missed
        self.stats = {"full_checks": 0, "ledgers_checked": 0, "ledgers_marked": 0}

    def _on_event(self, _n: Notification) -> None:
        self._kick.set()

    def _on_trigger(self, _n: Notification) -> None:
        self._full_requested = True
        self._kick.set()

    async def run(self) -> None:
        subs: list[Subscription] = []
        try:
            for prefix in (layout.AVAILABLE, ENABLE, DECOMMISSION, LOST_BOOKIE_DELAY):
                subs.append(await self.store.watch(prefix, self._on_event))
            subs.append(await self.store.watch(AUDIT_TRIGGER, self._on_trigger))
            last_full = time.monotonic()
            while True:
                try:
                    delay = await self._delay()
                    tick = min(1.0, max(0.1, delay / 4))
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._kick.wait(), tick)
                    self._kick.clear()
                    if not await self.markers.is_enabled():
                        continue
                    if time.monotonic() - last_full >= self.settings.audit_interval_s:
                        self._full_requested = True
                    full = self._full_requested
                    self._full_requested = False
                    await self.check(delay, full)
                    if full:
                        last_full = time.monotonic()
                except LedgerStoreError as exc:
                    log.warning("auditor: %s (retrying)", exc)
                    await asyncio.sleep(1.0)
        finally:
            for s in subs:
                s.cancel()

    async def _delay(self) -> float:
        override = await self.markers.lost_bookie_delay()
        return self.settings.lost_bookie_recovery_delay_s if override is None else override

    async def check(self, delay: float, full: bool) -> int:
        """One pass: update which bookies are lost and mark the ledgers of those now due.
        Returns how many ledgers were newly marked."""
        registered = {b.bookie_id for b in await self.registry.all()}
        known = set(await self.store.children(layout.COOKIES)) | self._referenced
        now = time.monotonic()
        for b in known - registered:
            if b not in self.lost_since:
                log.info("auditor: bookie %s is gone; its ledgers are marked after %.1fs unless it returns", b, delay)
                self.lost_since[b] = now
        for b in list(self.lost_since):
            if b in registered:
                log.info("auditor: bookie %s is back", b)
                del self.lost_since[b]
                self._scanned.discard(b)
        decommissioning = await self.markers.decommissioning()
        self._scanned &= set(self.lost_since) | decommissioning
        due = {b for b, t in self.lost_since.items() if now - t >= delay} | decommissioning
        targets = due if full else due - self._scanned
        if not targets and not full:
            return 0
        marked = await self._scan(targets, full)
        self._scanned |= targets
        return marked

    async def _scan(self, targets: set[str], full: bool) -> int:
        marked = 0
        referenced: set[str] = set()
        async for lid in self.ledgers.list():
            try:
                md = await self.ledgers.read(lid)
            except NoSuchLedgerError:
                continue
            self.stats["ledgers_checked"] += 1
            refs = md.bookies()
            referenced |= refs
            bad = refs & targets
            if bad and await self.markers.mark(lid, bad):
                marked += 1
        if full:
            self.stats["full_checks"] += 1
            self._referenced = referenced
        self.stats["ledgers_marked"] += marked
        if marked:
            log.info("auditor: marked %d ledgers under-replicated (bookies %s)", marked, sorted(targets))
        return marked
