"""The producer table of a log's leader: for each producer, the highest sequence stored in the log
and the position holding it, and what is still in flight (pure in-memory state; no IO).

The table is a function of the log: every sequenced entry carries its producer and sequence
(:mod:`.entry`), so a new leader rebuilds it by reading the ledgers it recovers, starting from the
snapshot of the table that the close of a ledger wrote into that ledger's metadata
(:func:`encode_snapshot`, :mod:`.rebuild`). Memory is a few hundred bytes per producer
(``docs/logs.md`` quotes the figure for 100,000 producers); ``producer_ttl_s`` bounds it.

Snapshot (the ledger's ``custom["log.producers"]``, JSON)::

    {"v": 1, "through": "17:41",                      # every entry up to here is reflected
     "producers": {"orders-7": [1041, 17, 40, 1763800000000], ...}}   # seq, ledger, entry, last append (ms)
"""

from __future__ import annotations

import asyncio
import json
import time

from ledgerstore.client.log.entry import check_producer_id, producer_header
from ledgerstore.errors import LogError
from ledgerstore.meta.logs import Position

#: the ledger metadata ``custom`` key of the table snapshot a ledger's close writes
SNAPSHOT_KEY = "log.producers"
#: the snapshot format
SNAPSHOT_VERSION = 1
#: a snapshot larger than this is not written (metadata stores cap a value: ZooKeeper at 1 MiB);
#: the next leader then reads the ledger's entries instead. At about 40 bytes per producer this
#: is some 20,000 producers.
SNAPSHOT_MAX_BYTES = 768 * 1024



_ABSENT = object()


class Producer:
    """One producer's state. ``seq`` is -1 while nothing of it is stored."""

    __slots__ = ("entry_id", "firsts", "header", "ledger_id", "pending", "producer_id", "sent", "seq", "touched")

    def __init__(self, producer_id: str, header: bytes) -> None:
        self.producer_id = producer_id
        #: the precomputed start of its entries' header (flags, id length, id)
        self.header = header
        #: the highest sequence stored in the log (acknowledged, or read back by a new leader)
        self.seq = -1
        self.ledger_id = -1
        self.entry_id = -1
        #: the highest sequence handed to the ledger (stored or in flight)
        self.sent = -1
        #: wall-clock seconds when it last had nothing in flight after appending (for
        #: ``producer_ttl_s``): read once when its in-flight appends drain, not once per append,
        #: as only a producer with nothing in flight can expire (:meth:`ProducerTable.expire`)
        self.touched = 0.0
        #: in-flight appends: the caller's future of each by its last sequence, oldest first; None
        #: while there are none (most producers are idle). A dict, not a deque of records: an
        #: append then allocates no object the garbage collector tracks, with thousands in flight
        self.pending: dict[int, asyncio.Future[Position]] | None = None
        #: the first sequence of each in-flight append of more than one entry, by its last; None
        #: while there are none
        self.firsts: dict[int, int] | None = None

    @property
    def last_seq(self) -> int | None:
        """The highest sequence stored, None if none."""
        return None if self.seq < 0 else self.seq

    @property
    def position(self) -> Position:
        """Where :attr:`seq` is stored."""
        return Position(self.ledger_id, self.entry_id)

    def stored(self, seq: int, ledger_id: int, entry_id: int) -> None:
        """``seq`` is stored at ``(ledger_id, entry_id)`` (kept if it is the highest)."""
        if seq > self.seq:
            self.seq = seq
            self.ledger_id = ledger_id
            self.entry_id = entry_id
        if seq > self.sent:
            self.sent = seq

    def in_flight(self, seq: int) -> tuple[asyncio.Future[Position], int] | None:
        """The future of the in-flight append holding ``seq`` and how many entries before that
        future's position ``seq`` sits (None: not in flight)."""
        pending = self.pending
        if not pending:
            return None
        fut = pending.get(seq)
        if fut is not None:
            return fut, 0
        for last, first in (self.firsts or {}).items():
            if first <= seq <= last:
                return pending[last], last - seq
        return None

    def sent_one(self, last: int, fut: asyncio.Future[Position], first: int | None = None) -> None:
        """The append of ``first..last`` (``last`` alone when ``first`` is None) is handed to the
        ledger, resolving ``fut``."""
        self.sent = last
        if self.pending is None:
            self.pending = {last: fut}
        else:
            self.pending[last] = fut
        if first is not None and first != last:
            if self.firsts is None:
                self.firsts = {last: first}
            else:
                self.firsts[last] = first

    def settled(self, last: int) -> None:
        """The in-flight append ending at ``last`` is resolved."""
        pending = self.pending
        if pending and pending.pop(last, _ABSENT) is not _ABSENT:
            firsts = self.firsts
            if firsts is not None and firsts.pop(last, None) is not None and not firsts:
                self.firsts = None
            if not pending:
                self.pending = None
                self.touched = time.time()


class ProducerTable:
    """Every producer a log's leader knows of, by id."""

    def __init__(self) -> None:
        self.producers: dict[str, Producer] = {}

    def __len__(self) -> int:
        return len(self.producers)

    def get(self, producer_id: str) -> Producer | None:
        """The producer, if known."""
        return self.producers.get(producer_id)

    def add(self, producer_id: str) -> Producer:
        """The producer, added (its id checked) if new."""
        p = self.producers.get(producer_id)
        if p is None:
            p = self.producers[producer_id] = Producer(producer_id, producer_header(producer_id))
        return p

    def last_seq_of(self, producer_id: str) -> int | None:
        """The highest sequence of ``producer_id`` stored in the log (None if none)."""
        p = self.producers.get(check_producer_id(producer_id))
        return None if p is None else p.last_seq

    def expire(self, ttl_s: float | None, now: float | None = None) -> int:
        """Forget producers idle (nothing appended, nothing in flight) for more than ``ttl_s``;
        returns how many were forgotten."""
        if ttl_s is None:
            return 0
        cutoff = (time.time() if now is None else now) - ttl_s
        idle = [k for k, p in self.producers.items() if p.touched < cutoff and p.pending is None]
        for k in idle:
            del self.producers[k]
        return len(idle)

    # --- snapshots ---------------------------------------------------------------------------------

    def encode_snapshot(self, through: Position) -> str | None:
        """The table as a snapshot reflecting every entry up to ``through`` (None if it would
        exceed :data:`SNAPSHOT_MAX_BYTES`). A producer with appends in flight is active now: its
        ``touched`` is only updated when they drain, so the snapshot gives it the current time."""
        now = time.time()
        rows = {k: [p.seq, p.ledger_id, p.entry_id, int((p.touched if p.pending is None else now) * 1000)]
                for k, p in self.producers.items() if p.seq >= 0}
        text = json.dumps({"v": SNAPSHOT_VERSION, "through": str(through), "producers": rows},
                          separators=(",", ":"), ensure_ascii=False)
        return text if len(text) <= SNAPSHOT_MAX_BYTES else None

    def load_snapshot(self, text: str) -> Position:
        """Merge a snapshot into the table; returns the position it reflects entries up to."""
        try:
            d = json.loads(text)
            if d.get("v") != SNAPSHOT_VERSION:
                raise LogError(f"producer snapshot version {d.get('v')!r} is not supported (expected {SNAPSHOT_VERSION})")
            through = Position.parse(d["through"])
            for pid, (seq, ledger_id, entry_id, touched_ms) in d["producers"].items():
                p = self.add(pid)
                p.stored(int(seq), int(ledger_id), int(entry_id))
                p.touched = max(p.touched, int(touched_ms) / 1000)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LogError(f"corrupt producer snapshot in ledger metadata: {exc!r}") from exc
        return through


__all__ = ["SNAPSHOT_KEY", "SNAPSHOT_MAX_BYTES", "Producer", "ProducerTable"]
