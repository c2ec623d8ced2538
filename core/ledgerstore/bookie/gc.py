"""The bookie's garbage collector (BookKeeper's ``GarbageCollectorThread``): forgets ledgers whose
metadata is gone, lets the engine reclaim their space, and runs minor/major compaction through
:meth:`ledgerstore.api.StorageEngine.compact` when asked or when their interval has passed."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ledgerstore.api import MetadataStore, StorageEngine
from ledgerstore.bookie.compaction import CompactionControl
from ledgerstore.bookie.ledger_state import LedgerDescriptors
from ledgerstore.bookie.timers import jittered
from ledgerstore.config import BookieConfig
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.stalls import peaks

log = logging.getLogger(__name__)

#: the live fraction below which a log is rewritten, when forced while no threshold is configured
_DEFAULT_THRESHOLD = {"major": 0.8, "minor": 0.2}


class GarbageCollector:
    """One per bookie; :meth:`collect` runs one pass, :meth:`run` every ``gc_wait_time_ms``."""

    def __init__(self, config: BookieConfig, engine: StorageEngine, store: MetadataStore,
                 ledgers: LedgerDescriptors, compaction: CompactionControl) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.ledgers = ledgers
        self.compaction = compaction
        #: when the last compaction of each kind ran (the intervals count from start-up)
        self._last = dict.fromkeys(("major", "minor"), _now())

    async def collect(self, *, minor: bool = False, major: bool = False) -> dict[str, Any]:
        """One pass; returns what it did (the admin API's answer)."""
        engine = self.engine
        mgr = LedgerManager(self.store)
        t0 = time.monotonic()
        before = await asyncio.to_thread(engine.stats)
        local = await asyncio.to_thread(lambda: list(engine.list_ledgers()))
        # the metadata reads overlap (LedgerManager.read_many): a bookie holding 100,000 ledgers
        # checks them in about 100,000 / READ_WINDOW round trips
        deleted = await mgr.missing(local)
        for lid in deleted:
            await asyncio.to_thread(engine.delete_ledger, lid)
            self.ledgers.forget(lid)
        self.compaction.deleted_ledgers += len(deleted)
        after = await asyncio.to_thread(engine.gc)
        compacted = await self._compact(minor=minor, major=major)
        if compacted is not None:
            after = compacted[1]
        return {
            "deleted_ledgers": deleted,
            "bytes_on_disk_before": before.bytes_on_disk,
            "bytes_on_disk_after": after.bytes_on_disk,
            "reclaimed_bytes": max(0, before.bytes_on_disk - after.bytes_on_disk),
            "compaction": compacted[0] if compacted else None,
            "seconds": round(time.monotonic() - t0, 3),
        }

    async def _compact(self, *, minor: bool, major: bool) -> tuple[str, Any] | None:
        """A major compaction when forced or due (and not suspended), else a minor one likewise."""
        if not self.engine.supports_compaction:
            return None
        now = _now()
        cfg = self.config
        for kind, forced in (("major", major), ("minor", minor)):
            threshold = getattr(cfg, f"{kind}_compaction_threshold")
            interval = getattr(cfg, f"{kind}_compaction_interval_s")
            due = threshold > 0 and interval > 0 and now - self._last[kind] >= interval
            if not (self.compaction.allows(kind) and (forced or due)):
                continue
            with self.compaction.compacting(kind):
                stats = await asyncio.to_thread(self.engine.compact, threshold if threshold > 0 else _DEFAULT_THRESHOLD[kind])
            # a major compaction also did a minor one's work
            for done in ("major", "minor") if kind == "major" else ("minor",):
                self._last[done] = now
            return (kind, stats)
        return None

    async def run(self) -> None:
        """Collect every ``gc_wait_time_ms`` (give or take ``background_timer_jitter``) until
        cancelled."""
        for wait_s in jittered(self.config.gc_wait_time_ms / 1000.0, self.config.background_timer_jitter):
            await asyncio.sleep(wait_s)
            t0 = time.perf_counter()
            try:
                result = await self.collect()
                # metadata reads of every local ledger, then the engine's gc and compaction
                peaks.observe("ledger_gc", time.perf_counter() - t0)
                if result["deleted_ledgers"] or result["compaction"]:
                    log.info("gc: %s", result)
            except Exception:
                log.exception("garbage collection failed; will retry")


def _now() -> float:
    """The running loop's clock (``time.monotonic`` on asyncio's loops; the virtual clock in the
    simulation, so that a compaction falls due at the same point of every replay)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
