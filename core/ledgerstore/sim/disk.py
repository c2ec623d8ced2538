"""Simulated disks: a journal and a storage engine that keep only what was synced at a crash.

A bookie's disks outlive its process. :class:`JournalDisk` holds the journal's files and how far
each was fsync'd; :class:`SimJournal` is the real :class:`~ledgerstore.bookie.journal.Journal`
(same records, same group commit, same replay rules) with its writer thread replaced by a group
commit on the event loop whose fsync takes a random virtual time. :class:`EngineDisk` holds what
the last ``flush()`` of :class:`SimStorageEngine` made durable. :meth:`JournalDisk.crash` drops
every byte written but not synced; a new engine opened on an :class:`EngineDisk` sees only its
last flush; the bookie's replay of the journal brings back the rest, as after a real crash.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import StorageEngine, StorageStats
from ledgerstore.bookie.journal import (
    ADD_BATCH,
    REC_BODY,
    REC_HEADER,
    Appended,
    C,
    Journal,
    LogMark,
    Record,
    _split_batch,
)
from ledgerstore.errors import (
    BookieDiskFullError,
    BookieIOError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore.proto.digest import ENTRY_HEADER


@dataclasses.dataclass
class JournalDisk:
    """The journal directory of one bookie: file id → bytes, and how much of each is synced."""

    files: dict[int, bytearray] = dataclasses.field(default_factory=dict)
    synced: dict[int, int] = dataclasses.field(default_factory=dict)
    mark: LogMark = LogMark(0, 0)

    def crash(self) -> int:
        """Lose what was written but not synced; returns the bytes lost."""
        lost = 0
        for fid, data in self.files.items():
            keep = self.synced.get(fid, 0)
            lost += len(data) - keep
            del data[keep:]
        return lost


class SimJournal(Journal[C]):
    """The bookie's journal on a :class:`JournalDisk`, committed by the event loop.

    Appends queue while a group is being synced; when the sync completes (after a virtual
    ``fsync_delay``) the group's completions are answered and the next group starts. Built by
    the bookie's ``journal_factory`` seam with the journal's usual arguments plus ``disk`` and
    ``rng``.
    """

    def __init__(self, directory: Path, on_durable: Callable[[list[C]], None], *, disk: JournalDisk,
                 rng: random.Random, fsync_delay: tuple[float, float] = (0.0005, 0.004), **options: Any) -> None:
        super().__init__(directory, on_durable, **options)
        self.disk = disk
        self.rng = rng
        self.fsync_delay = fsync_delay
        self._pending: list[tuple[Appended, C, int, float]] = []
        self._syncing: asyncio.TimerHandle | None = None
        self._crashed = False

    def replay(self, apply: Callable[[Record], None]) -> int:
        """Apply every synced record after the mark (what survived the last crash)."""
        mark = self.disk.mark
        n = 0
        for fid in sorted(self.disk.files):
            if fid < mark.file_id:
                continue
            data = bytes(self.disk.files[fid])
            off = mark.offset if fid == mark.file_id else 0
            for rec in _records(fid, data, off):
                apply(rec)
                n += 1
        self._file_id = max(self.disk.files, default=0)
        return n

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open a new journal file; no thread: groups are committed by ``loop``."""
        self._loop = loop
        self._roll()

    def _roll(self) -> None:
        self._file_id += 1
        self.disk.files[self._file_id] = bytearray()
        self.disk.synced[self._file_id] = 0
        self._offset = 0
        with self._lock:
            self._durable = LogMark(self._file_id, 0)

    def append(self, record: Appended, completion: C, records: int = 1, started: float = 0.0) -> None:
        """Queue ``record``; answered once the group holding it is synced."""
        if self.failed is not None:
            raise BookieIOError(f"journal is failed: {self.failed}")
        if self._crashed:
            return
        self._pending.append((record, completion, records, started))
        if self._syncing is None:
            self._commit()

    def queue_size(self) -> int:
        return len(self._pending)

    def _commit(self) -> None:
        assert self._loop is not None
        group, self._pending = self._pending, []
        data = self.disk.files[self._file_id]
        for rec, _, _, _ in group:
            for part in rec if isinstance(rec, tuple) else (rec,):
                data += part
        end = len(data)
        self._syncing = self._loop.call_later(self.rng.uniform(*self.fsync_delay), self._synced, group, end)

    def _synced(self, group: list[tuple[Appended, C, int, float]], end: int) -> None:
        self._syncing = None
        self.disk.synced[self._file_id] = end
        self.groups += 1
        self.records += sum(g[2] for g in group)
        with self._lock:
            self._durable = LogMark(self._file_id, end)
        self._answer([g[1] for g in group], [g[3] for g in group])
        if self._pending:
            self._commit()

    def checkpoint_done(self, mark: LogMark) -> None:
        """The engine holds everything up to ``mark``: older files go."""
        self.disk.mark = mark
        for fid in [f for f in self.disk.files if f < mark.file_id]:
            del self.disk.files[fid]
            self.disk.synced.pop(fid, None)

    def close(self) -> None:
        """A clean stop: what was written is synced (nobody is answered any more)."""
        if self._syncing is not None:
            self._syncing.cancel()
            self._syncing = None
        if not self._crashed:
            self.disk.synced[self._file_id] = len(self.disk.files[self._file_id])

    def crash(self) -> None:
        """The process died: nothing more is written, synced or answered."""
        self._crashed = True
        if self._syncing is not None:
            self._syncing.cancel()
            self._syncing = None
        self._pending.clear()


def _records(file_id: int, data: bytes, start: int) -> Iterator[Record]:
    view = memoryview(data)
    off = start
    where = Path(f"sim-journal-{file_id}")
    while off + REC_HEADER.size <= len(data):
        length, _ = REC_HEADER.unpack_from(data, off)
        end = off + REC_HEADER.size + length
        if end > len(data):
            break  # torn tail (cannot happen: a crash cuts at a synced boundary)
        body = view[off + REC_HEADER.size : end]
        rtype, lid, eid = REC_BODY.unpack_from(body)
        mark = LogMark(file_id, end)
        if rtype == ADD_BATCH:
            yield from _split_batch(where, off, lid, eid, body[REC_BODY.size :], mark)
        else:
            yield Record(rtype, lid, eid, bytes(body[REC_BODY.size :]), mark)
        off = end


@dataclasses.dataclass
class _Ledger:
    key: bytes | None = None
    fenced: bool = False
    entries: dict[int, bytes] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DiskFaults:
    """How a bookie's ledger disk misbehaves for a while: each write fails with probability
    ``write_error`` (ENOSPC when ``full``, else EIO), each read of an entry comes back with one
    bit flipped with probability ``flip`` (past the entry's header, so the bookie's own view of
    the ledger's LAC is intact: only the entry's digest can tell)."""

    write_error: float = 0.0
    full: bool = False
    flip: float = 0.0
    rng: random.Random = dataclasses.field(default_factory=lambda: random.Random(0))
    #: only this engine (one process of the bookie) meets the faults: a restarted bookie replays
    #: its journal on a disk that works (None: every engine on the disk)
    engine: object | None = None


@dataclasses.dataclass
class EngineDisk:
    """What the engine's last flush made durable, per ledger, and the disk's current faults."""

    ledgers: dict[int, _Ledger] = dataclasses.field(default_factory=dict)
    faults: DiskFaults = dataclasses.field(default_factory=DiskFaults)


class SimStorageEngine(StorageEngine):
    """An in-memory storage engine over an :class:`EngineDisk`: what ``flush()`` saved survives a
    crash, everything else is lost (the journal replays it)."""

    name = "sim"
    durable_sync = True

    def __init__(self, ledger_dirs: Sequence[Path], *, disk: EngineDisk, **options: Any) -> None:
        super().__init__(ledger_dirs, **options)
        self.disk = disk
        self.ledgers: dict[int, _Ledger] = {}
        self.written = 0
        #: reads answered with a flipped bit
        self.flipped = 0

    def open(self) -> None:
        self.ledgers = copy.deepcopy(self.disk.ledgers)

    def close(self) -> None:
        self.flush()

    def flush(self) -> None:
        self.disk.ledgers = copy.deepcopy(self.ledgers)

    def _ledger(self, ledger_id: int) -> _Ledger:
        return self.ledgers.setdefault(ledger_id, _Ledger())

    def _known(self, ledger_id: int) -> _Ledger:
        led = self.ledgers.get(ledger_id)
        if led is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie")
        return led

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        led = self._ledger(ledger_id)
        if led.key is not None and led.key != master_key:
            raise UnauthorizedAccessError(f"ledger {ledger_id}: another master key is stored")
        led.key = master_key

    def get_master_key(self, ledger_id: int) -> bytes | None:
        led = self.ledgers.get(ledger_id)
        return None if led is None else led.key

    def set_fenced(self, ledger_id: int) -> bool:
        led = self._ledger(ledger_id)
        was, led.fenced = led.fenced, True
        return not was

    def is_fenced(self, ledger_id: int) -> bool:
        led = self.ledgers.get(ledger_id)
        return led is not None and led.fenced

    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        f = self.disk.faults
        if f.write_error and f.engine in (None, self) and f.rng.random() < f.write_error:
            # what the bookie sees of the real engine: ENOSPC is retryable (the disk is full, the
            # bookie turns read-only), EIO fails this write
            if f.full:
                raise BookieDiskFullError(f"ledger {ledger_id} entry {entry_id}: no space left on device")
            raise BookieIOError(f"ledger {ledger_id} entry {entry_id}: input/output error")
        self._ledger(ledger_id).entries[entry_id] = bytes(data)
        self.written += 1

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        led = self._known(ledger_id)
        try:
            data = led.entries[entry_id]
        except KeyError:
            raise NoSuchEntryError(f"entry {entry_id} of ledger {ledger_id} is not stored here") from None
        f = self.disk.faults
        if f.flip and f.engine in (None, self) and len(data) > ENTRY_HEADER.size and f.rng.random() < f.flip:
            bit = f.rng.randrange(ENTRY_HEADER.size * 8, len(data) * 8)
            flipped = bytearray(data)
            flipped[bit // 8] ^= 1 << (bit % 8)
            self.flipped += 1
            return bytes(flipped)
        return data

    def last_entry_id(self, ledger_id: int) -> int:
        return max(self._known(ledger_id).entries, default=-1)

    def has_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self.ledgers

    def list_ledgers(self) -> Iterator[int]:
        return iter(sorted(self.ledgers))

    def delete_ledger(self, ledger_id: int) -> None:
        self.ledgers.pop(ledger_id, None)

    def stats(self) -> StorageStats:
        return StorageStats(ledgers=len(self.ledgers), entries_written=self.written)
