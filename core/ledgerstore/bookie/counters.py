"""The bookie's request figures, exported as metrics (``metrics.py``): counted by the request
processor, the ledger rules and the metadata look-ups, per request or per batch, never per entry."""

from __future__ import annotations

from collections import defaultdict

from ledgerstore.latency import LatencyHistogram


class BookieCounters:
    """Figures exported as metrics."""

    def __init__(self) -> None:
        self.add_requests = 0
        self.add_bytes = 0
        self.read_requests = 0
        #: bytes of entries answered to reads (BookKeeper's READ_BYTES), counted per request
        self.read_bytes = 0
        self.bad_requests = 0
        #: requests whose handler failed unexpectedly (answered IO_ERROR; the connection carries on)
        self.failed_requests = 0
        self.rejected_adds: dict[str, int] = defaultdict(int)
        #: long-poll LAC requests refused because a waiter limit was reached
        self.refused_long_polls = 0
        #: metadata look-ups of ledgers new to this bookie (one per ledger, before its first key)
        self.ledger_lookups = 0
        #: requests naming a ledger new to this bookie that the metadata store does not hold
        self.unknown_ledger_claims = 0
        #: read requests (READ, READ_MULTI) from arrival to answer (BookKeeper's READ_ENTRY_REQUEST)
        self.read_request_seconds = LatencyHistogram()
        #: engine.flush() of each checkpoint (the ledger storage flush), and the whole checkpoint
        self.flush_seconds = LatencyHistogram()
        self.checkpoint_seconds = LatencyHistogram()
