"""The replicas check (BookKeeper's ``auditorReplicasCheck``): ask every registered bookie which
ledgers it actually holds, and mark every closed ledger one of whose bookies lacks its share.

The auditor's other checks reason about registrations: a bookie that is registered is assumed
to hold its data. This one asks the bookies themselves (``LIST_LEDGERS``: each ledger with the
last entry stored), so it catches what no registration shows: a bookie formatted and restarted
under its old id before anyone noticed, directories emptied under a running bookie, a copy cut
short. For every fragment of a closed ledger that names a bookie, the bookie must hold the
ledger up to the last entry of that fragment whose write set includes it.

A bookie whose registration says it has ledgers in limbo (it lost data and is repairing itself
from the other replicas) is left to that repair: its shortfalls are not marked while its limbo
count is above zero and keeps falling (:mod:`ledgerstore.recovery.limbo_patience`), so the
replication workers do not copy its fragments elsewhere and swap it out while it fills itself
up. Each check logs which bookies it left so, and checks them again once they report zero.

What it cannot see: the answer carries the last entry of each ledger, not every entry, so a
hole below a bookie's last entry of a ledger goes unnoticed. Open ledgers are left to their
writers (and to recovery when they are closed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ledgerstore.api import BookieInfo, MetadataStore
from ledgerstore.client.bookie_client import BookieClient
from ledgerstore.client.channel import ChannelPool
from ledgerstore.errors import LedgerStoreError, NoSuchLedgerError
from ledgerstore.meta.bookies import BookieRegistry
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.recovery.limbo_patience import LimboPatience
from ledgerstore.recovery.markers import NOT_HELD, UnderReplicationManager

log = logging.getLogger(__name__)

#: a bookie found short is asked again after this long before its ledger is marked: the last
#: adds of a just-closed ledger may still be on their way to its slowest bookie
RECHECK_DELAY_S = 1.0
#: ledgers asked for per request
PAGE = 16384


def needed_last_entry(md: LedgerMetadata, bookie_id: str) -> int | None:
    """The highest entry of the closed ledger ``md`` that ``bookie_id`` must hold (over every
    fragment naming it), or None when it need hold none."""
    need = None
    e_size = md.ensemble_size
    for first, last, ensemble in md.fragment_ranges():
        if bookie_id not in ensemble:
            continue
        index = ensemble.index(bookie_id)
        for e in range(last, max(first, last - e_size + 1) - 1, -1):
            if index in md.write_set(e):
                need = e if need is None else max(need, e)
                break
    return need


class ReplicasCheck:
    """One replicas check over the whole cluster: ``await run()``."""

    def __init__(self, store: MetadataStore, pool: ChannelPool, timeout_s: float = 30.0,
                 recheck_delay_s: float = RECHECK_DELAY_S, limbo: LimboPatience | None = None) -> None:
        """``limbo``: which bookies in limbo are left to their own repair (kept across checks by
        the auditor); None checks every bookie alike."""
        self.store = store
        self.limbo = limbo
        self.pool = pool
        self.bookie_client = BookieClient(pool)
        self.timeout_s = timeout_s
        self.recheck_delay_s = recheck_delay_s
        self.markers = UnderReplicationManager(store)
        self.ledgers = LedgerManager(store)
        self.registry = BookieRegistry(store)

    async def holdings(self, bookie_id: str, first: int = 0, most: int | None = None) -> dict[int, int] | None:
        """``{ledger id: last entry stored}`` of ``bookie_id`` from ledger ``first`` on (at most
        ``most`` ledgers), or None if it could not say (unreachable, or too old to know the request)."""
        out: dict[int, int] = {}
        while True:
            page = PAGE if most is None else min(PAGE, most - len(out))
            try:
                items = await self.bookie_client.list_ledgers(bookie_id, first, page, self.timeout_s)
            except LedgerStoreError as exc:
                log.warning("replicas check: bookie %s could not say what it holds (%s); skipped", bookie_id, exc)
                return None
            out.update(items)
            if len(items) < page or (most is not None and len(out) >= most):
                return out
            first = items[-1][0] + 1

    async def run(self) -> dict[str, Any]:
        """Check every closed ledger against what its bookies hold; mark those short of data.
        Returns what was done (bookies asked, skipped, ledgers checked and marked)."""
        t0 = time.monotonic()
        infos = await self.registry.all()
        repairing = self._repairing(infos)
        bookies = sorted(b.bookie_id for b in infos if b.bookie_id not in repairing)
        for b, count in sorted(repairing.items()):
            log.info("replicas check: bookie %s is repairing %d ledgers in limbo itself: its shortfalls are left "
                     "to it (checked again once it reports none)", b, count)
        answers = await asyncio.gather(*(self.holdings(b) for b in bookies))
        held = {b: h for b, h in zip(bookies, answers, strict=True) if h is not None}
        suspects: dict[int, set[str]] = {}
        checked = 0
        async for lid, md in self.ledgers.read_many(self.ledgers.list()):
            if md is None or not md.is_closed:
                continue
            checked += 1
            for b in md.bookies() & held.keys():
                need = needed_last_entry(md, b)
                if need is not None and held[b].get(lid, -2) < need:
                    suspects.setdefault(lid, set()).add(b)
        marked = await self._confirm_and_mark(suspects) if suspects else {}
        result = {"bookies_checked": sorted(held), "bookies_skipped": sorted(set(bookies) - held.keys()),
                  "bookies_repairing": dict(sorted(repairing.items())), "ledgers_checked": checked,
                  "ledgers_marked": sorted(marked), "seconds": round(time.monotonic() - t0, 3)}
        if marked:
            shown = sorted(marked.items())[:20]
            log.warning("replicas check: %d ledgers lack data on their bookies and are marked under-replicated: %s%s",
                        len(marked), ", ".join(f"{lid} ({'/'.join(sorted(bs))})" for lid, bs in shown),
                        ", ..." if len(marked) > len(shown) else "")
        else:
            log.info("replicas check: every closed ledger is held by its bookies (%d ledgers, %d bookies)%s",
                     checked, len(held), f"; {len(repairing)} left to repair their limbo ledgers" if repairing else "")
        return result

    def _repairing(self, infos: list[BookieInfo]) -> dict[str, int]:
        """The bookies left to their own repair now, with their limbo counts."""
        return self.limbo.left_to_repair(infos) if self.limbo is not None else {}

    async def _confirm_and_mark(self, suspects: dict[int, set[str]]) -> dict[int, set[str]]:
        """Ask each suspect bookie again about each suspect ledger; mark what is still short
        (not of a bookie that went into limbo meanwhile: it was restarted without its data)."""
        await asyncio.sleep(self.recheck_delay_s)
        repairing = self._repairing(await self.registry.all())
        marked: dict[int, set[str]] = {}
        incarnations: dict[str, str | None] = {}
        for lid, bookies in sorted(suspects.items()):
            try:
                md = await self.ledgers.read(lid)
            except NoSuchLedgerError:
                continue
            short = set()
            for b in sorted(bookies & md.bookies() - repairing.keys()):
                need = needed_last_entry(md, b)
                again = await self.holdings(b, lid, 1)
                if need is None or again is None or again.get(lid, -2) >= need:
                    continue
                if b not in incarnations:
                    incarnations[b] = await self.markers.incarnation(b)
                    await self.markers.note_loss(b, incarnations[b], NOT_HELD)
                log.info("replicas check: bookie %s holds ledger %d up to entry %s, its fragments need %d",
                            b, lid, again.get(lid, "none (no such ledger)"), need)
                short.add(b)
            if short and await self.markers.mark(lid, short, {b: incarnations[b] for b in short}):
                marked[lid] = short
        return marked
