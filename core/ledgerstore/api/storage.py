"""The StorageEngine interface: bookie-local ledger storage beneath the journal.

The bookie's journal (core) makes every add durable before it is acknowledged; the engine holds
the entries for reading and may buffer writes. ``flush()`` is the checkpoint contract: when it
returns, everything added before the call is durable in the engine, so the journal may discard the
records before its mark. After a crash the bookie replays the journal from the last mark into the
engine, so ``add_entry``, ``set_fenced`` and ``set_master_key`` must be idempotent.

Engines are called from the bookie's event-loop thread and from its checkpoint/GC threads; they
must be thread-safe.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(slots=True)
class StorageStats:
    """Figures an engine reports for metrics and the admin API."""

    ledgers: int = 0
    bytes_on_disk: int = 0
    entries_written: int = 0
    gc_runs: int = 0
    bytes_reclaimed: int = 0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class StorageEngine(abc.ABC):
    """Stores entries, the fenced flag and master key of each ledger.

    Errors: ``get_entry`` raises :class:`~ledgerstore.errors.NoSuchLedgerError` for an unknown
    ledger and :class:`~ledgerstore.errors.NoSuchEntryError` for a missing entry; a record whose
    checksum fails raises :class:`~ledgerstore.errors.BookieIOError` — never corrupt bytes.
    """

    name: str = ""

    def __init__(self, ledger_dirs: Sequence[Path], **options: Any) -> None:
        self.ledger_dirs = [Path(d) for d in ledger_dirs]
        self.options = options

    @abc.abstractmethod
    def open(self) -> None:
        """Open or create the on-disk state (verifying what it can)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release everything. Idempotent."""

    @abc.abstractmethod
    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Record the ledger's master key, creating the ledger if unknown. Idempotent for the same
        key; a *different* key for a known ledger raises
        :class:`~ledgerstore.errors.UnauthorizedAccessError` (as BookKeeper's storage does)."""

    @abc.abstractmethod
    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The master key, or ``None`` when the ledger is unknown here."""

    @abc.abstractmethod
    def set_fenced(self, ledger_id: int) -> bool:
        """Mark the ledger fenced (creating it if unknown). Returns True if it was not fenced before."""

    @abc.abstractmethod
    def is_fenced(self, ledger_id: int) -> bool: ...

    @abc.abstractmethod
    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Store ``data`` (the whole signed entry) under (ledger, entry), creating the ledger if
        unknown. Re-adding overwrites."""

    @abc.abstractmethod
    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """Return the stored bytes of an entry."""

    @abc.abstractmethod
    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored for the ledger, ``-1`` if none; NoSuchLedgerError if unknown."""

    @abc.abstractmethod
    def has_ledger(self, ledger_id: int) -> bool: ...

    @abc.abstractmethod
    def list_ledgers(self) -> Iterator[int]:
        """Ids of every ledger stored, ascending."""

    @abc.abstractmethod
    def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger; its space is reclaimed by the engine (now or by GC). Deleting an
        unknown ledger is a no-op. Like everything else, the deletion is durable after ``flush()``."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Make everything added before this call durable (the checkpoint contract)."""

    def gc(self) -> StorageStats:
        """Reclaim space of deleted ledgers now; returns stats. Engines without GC return stats()."""
        return self.stats()

    @abc.abstractmethod
    def stats(self) -> StorageStats: ...
