"""The producer table and the log: rebuilding it when a new leader takes a log over, writing its
snapshot when a ledger is closed, and finding the entry that holds an old sequence.

Rebuilding (:func:`rebuild_table`) walks the log's ledgers from the newest back to the first one
whose metadata holds a snapshot (``custom["log.producers"]``, written by :func:`write_snapshot`
after a writer closed that ledger), loads it, and reads the entries after the position the
snapshot reflects: with every close writing one, that is only the ledgers the new leader just
recovered (those nobody closed). Ledgers without the format 2 marker (written by an older
release, or raw ledgers a Spark stream committed) hold no sequences and are stepped over. Used
by :mod:`.writer`; the table itself is :mod:`.producers`, the entry codec :mod:`.entry`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from ledgerstore.client.log.base import LogClient
from ledgerstore.client.log.entry import decode, is_sequenced_format
from ledgerstore.client.log.producers import SNAPSHOT_KEY, ProducerTable
from ledgerstore.client.read import ReadHandle
from ledgerstore.errors import BadVersionError, LedgerStoreError
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.meta.logs import LogMetadata, Position

log = logging.getLogger(__name__)

#: entries read per request while rebuilding or searching
READ_BATCH = 1000
#: compare-and-set attempts of a snapshot write before it is left out (the next leader then reads
#: the ledger's entries instead)
SNAPSHOT_ATTEMPTS = 5
#: old (producer, seq) -> position answers a leader keeps from its searches; beyond it they are dropped
FOUND_CACHE_MAX = 100_000

#: what a search opens a ledger with (the writer's own handle for its open ledger)
OpenLedger = Callable[[int], Awaitable[ReadHandle]]


async def sequenced_entries(rh: ReadHandle, first: int = 0) -> list[tuple[int, str, int]]:
    """``(entry id, producer id, seq)`` of the sequenced entries of ``rh`` from ``first`` to its
    last confirmed entry (``rh`` must hold format 2 entries)."""
    out: list[tuple[int, str, int]] = []
    last = rh.last_add_confirmed
    while first <= last:
        upto = min(last, first + READ_BATCH - 1)
        for e in await rh.read(first, upto):
            _, pid, seq = decode(e.payload)
            if pid is not None and seq is not None:
                out.append((e.entry_id, pid, seq))
        first = upto + 1
    return out


async def rebuild_table(client: LogClient, md: LogMetadata, password: bytes,
                        table: ProducerTable) -> Position | None:
    """Fill ``table`` from log ``md`` (whose ledgers are all closed: the new leader recovered
    them). Returns the position the table reflects every entry up to: the log's last entry
    (None: the log holds no entry)."""
    ids = md.ledger_ids
    through: Position | None = None
    metas: dict[int, LedgerMetadata] = {}
    start = 0  # index into ids of the first ledger to read
    for i in range(len(ids) - 1, -1, -1):
        lmd = metas[ids[i]] = await client.ledger_metadata(ids[i])
        snap = lmd.custom.get(SNAPSHOT_KEY) if is_sequenced_format(lmd.custom) else None
        if snap is not None:
            through = table.load_snapshot(snap)
            start = next((j for j, lid in enumerate(ids) if lid >= through.ledger_id), len(ids))
            break
    for lid in ids[start:]:
        lmd = metas[lid] if lid in metas else await client.ledger_metadata(lid)
        first = through.entry_id + 1 if through is not None and lid == through.ledger_id else 0
        last = lmd.last_entry_id
        if is_sequenced_format(lmd.custom):  # others (older releases, raw Spark stream ledgers) hold no sequences
            rh = await client.open_ledger(lid, password, recovery=False)
            last = rh.last_add_confirmed
            for eid, pid, seq in await sequenced_entries(rh, first):
                table.add(pid).stored(seq, lid, eid)
        if last >= first:
            through = Position(lid, last)
    return through


async def write_snapshot(client: LogClient, ledger_id: int, snapshot: str) -> bool:
    """Put ``snapshot`` into the closed ledger's metadata by compare-and-set. False (and a
    warning) if it could not: the next leader then reads that ledger's entries instead."""
    assert client.store is not None, "the client is not started"
    ledgers = LedgerManager(client.store)
    for _ in range(SNAPSHOT_ATTEMPTS):
        try:
            lmd = await ledgers.read(ledger_id)
            if not lmd.is_closed:
                return False
            lmd.custom = {**lmd.custom, SNAPSHOT_KEY: snapshot}
            await ledgers.write(lmd)
            return True
        except BadVersionError:
            continue
        except LedgerStoreError as exc:
            log.warning("ledger %d: the producer table snapshot was not written (%s); the next leader of its "
                        "log reads the ledger's entries instead", ledger_id, exc)
            return False
    return False


async def find_sequence(open_ledger: OpenLedger, ids: list[int], producer_id: str, seq: int,
                        found: dict[tuple[str, int], Position]) -> Position | None:
    """The position of ``producer_id``'s entry with ``seq``, searching the ledgers ``ids`` from
    the newest back (None: not in the log; it was skipped, or truncated away). Every entry of
    the producer read on the way is remembered in ``found`` (bounded by :data:`FOUND_CACHE_MAX`),
    so a producer resending a run of old sequences costs one search, not one per sequence."""
    for lid in reversed(ids):
        rh = await open_ledger(lid)
        if not is_sequenced_format(rh.md.custom):
            continue  # a ledger of raw entries (an older release, a Spark stream): no sequences
        hit: Position | None = None
        below = False
        entries = await sequenced_entries(rh)
        if len(found) + len(entries) > FOUND_CACHE_MAX:
            found.clear()
        for eid, pid, s in entries:
            if pid == producer_id:
                pos = Position(lid, eid)
                found[(pid, s)] = pos
                if s == seq:
                    hit = pos
                elif s < seq:
                    below = True
        if hit is not None:
            return hit
        if below:  # sequences increase along the log: it is not in an older ledger either
            return None
    return None


__all__ = ["find_sequence", "rebuild_table", "sequenced_entries", "write_snapshot"]
