"""The simulated storage engine: it keeps only what its last flush saved at a crash.

A bookie's disks outlive its process. The journal is the production
:class:`~ledgerstore.bookie.journal.Journal` on a :class:`~ledgerstore.sim.files.SimFileSystem`;
:class:`EngineDisk` holds what the last ``flush()`` of :class:`SimStorageEngine` made durable. A
new engine opened on an :class:`EngineDisk` sees only its last flush; the bookie's replay of the
journal brings back the rest, as after a real crash.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import StorageEngine, StorageStats
from ledgerstore.errors import (
    BookieDiskFullError,
    BookieIOError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore.proto.digest import ENTRY_HEADER


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
