"""Whether the bookie takes writes (BookKeeper's ``StateManager``): serving or still starting,
registered or not, writable or read-only, and why; and :class:`BookieStatus`, the snapshot the
admin API and metrics read (``Bookie.status()``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

log = logging.getLogger(__name__)


class BookieState:
    """The bookie's state; the bookie updates it, the request processor and admin API read it."""

    def __init__(self, bookie_id: str, disk_usage_threshold: float, disk_usage_lwm: float) -> None:
        self.bookie_id = bookie_id
        self.disk_usage_threshold = disk_usage_threshold
        self.disk_usage_lwm = disk_usage_lwm
        #: False while starting (replaying the journal): requests are refused, not queued
        self.serving = False
        self.read_only = False
        #: read-only forced by an administrator
        self.forced_read_only = False
        #: set while the bookie's registration stands (cleared when the metadata session is lost)
        self.registered = asyncio.Event()
        #: drawn anew at each start (BOOKIE_INFO tells it): a client that sees the same number
        #: before and after some writes knows one process took them all, none lost to a restart
        self.instance = 0

    def update(self, used_fraction: float, lost: str | None) -> bool:
        """Turn read-only when forced, when the bookie lost its data, or when its disks pass the
        threshold; writable again below the low-water mark. Returns whether the state changed."""
        was = self.read_only
        if self.forced_read_only or lost is not None:
            self.read_only = True
        elif used_fraction >= self.disk_usage_threshold:
            self.read_only = True
        elif used_fraction < self.disk_usage_lwm:
            self.read_only = False
        if self.read_only != was:
            log.warning("bookie %s is now %s (%s)", self.bookie_id, "READ-ONLY" if self.read_only else "writable",
                        "it lost its data" if lost is not None else f"disk {used_fraction * 100:.1f}% used")
        return self.read_only != was


@dataclasses.dataclass(frozen=True, slots=True)
class BookieStatus:
    """What a bookie is doing at one moment (``Bookie.status()``): the admin API's state and
    readiness answers and the bookie's gauges are read from it."""

    #: serving requests: started (journal replayed) and not stopping
    serving: bool
    #: stop() has begun
    stopping: bool
    #: its registration stands in the metadata store
    registered: bool
    read_only: bool
    #: read-only was forced by an administrator
    forced_read_only: bool
    #: a journal write failed: adds are answered IO_ERROR
    journal_failed: bool
    #: recovery adds are taken (BookKeeper's "available for high-priority writes"): writable, or
    #: read-only with the ledger disks keeping the recovery-add reserve
    takes_recovery_adds: bool
    #: Unix time it began serving (0 before)
    started_at: float
    #: ledgers it holds a master key for
    ledgers: int
    #: long-poll LAC requests waiting
    lac_waiters: int
    #: adds and fences waiting for the metadata look-up of a ledger new to this bookie
    requests_awaiting_metadata: int
    #: ledgers in limbo: this bookie lost data it may have held of them and has not repaired them yet
    ledgers_in_limbo: int = 0
