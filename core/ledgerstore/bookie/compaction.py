"""Compaction switches and statistics of one bookie: what the admin API's ``gc_details``,
``gc/suspend_compaction`` and ``gc/resume_compaction`` read and set (BookKeeper's
``GarbageCollectorThread`` suspend flags and ``GarbageCollectionStatus``).

Suspension works like BookKeeper's: a suspended major compaction is skipped even when forced or
due, and the collection falls through to a minor one if that is allowed; deleted ledgers are
still collected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any


@dataclasses.dataclass
class CompactionControl:
    """Owned by the bookie; its garbage collector consults and updates it."""

    suspend_major: bool = False
    suspend_minor: bool = False
    major_count: int = 0
    minor_count: int = 0
    #: ledgers garbage collection deleted from the engine since start (DELETED_LEDGER_COUNT)
    deleted_ledgers: int = 0
    #: wall-clock milliseconds when the last major / minor compaction finished (0: never)
    last_major_ms: int = 0
    last_minor_ms: int = 0
    #: "major" or "minor" while a compaction runs
    running: str | None = None

    def allows(self, kind: str) -> bool:
        """Whether a ``kind`` ("major" or "minor") compaction may run now."""
        return not (self.suspend_major if kind == "major" else self.suspend_minor)

    @contextlib.contextmanager
    def compacting(self, kind: str) -> Iterator[None]:
        """Around one compaction: marks it running, then counts it once it finished."""
        self.running = kind
        try:
            yield
        finally:
            self.running = None
        now = int(time.time() * 1000)
        if kind == "major":
            self.major_count += 1
            self.last_major_ms = now
        else:
            self.minor_count += 1
            self.last_minor_ms = now

    def details(self, force_running: bool) -> dict[str, Any]:
        """One ``gc_details`` row, in BookKeeper's field names."""
        return {
            "forceCompacting": force_running,
            "majorCompacting": self.running == "major",
            "minorCompacting": self.running == "minor",
            "lastMajorCompactionTime": self.last_major_ms,
            "lastMinorCompactionTime": self.last_minor_ms,
            "majorCompactionCounter": self.major_count,
            "minorCompactionCounter": self.minor_count,
        }
