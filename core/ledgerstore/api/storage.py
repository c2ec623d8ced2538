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
from typing import Any, ClassVar

from ledgerstore.api.options import options_for
from ledgerstore.errors import LedgerStoreError


@dataclasses.dataclass(slots=True)
class StorageStats:
    """Figures an engine reports for metrics and the admin API."""

    ledgers: int = 0
    bytes_on_disk: int = 0
    entries_written: int = 0
    gc_runs: int = 0
    bytes_reclaimed: int = 0
    #: entries the engine holds now, where it can tell without reading its files (an estimate
    #: where the engine's own figure is one); None where it cannot
    entries: int | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class StorageEngine(abc.ABC):
    """Stores entries, the fenced flag and master key of each ledger.

    Errors: ``get_entry`` raises :class:`~ledgerstore.errors.NoSuchLedgerError` for an unknown
    ledger and :class:`~ledgerstore.errors.NoSuchEntryError` for a missing entry; a record whose
    checksum fails raises :class:`~ledgerstore.errors.BookieIOError` — never corrupt bytes.
    ``get_entries`` returns these errors per entry instead of raising them.
    """

    name: str = ""

    # --- capabilities: read by the bookie and the conformance suite instead of testing for
    # methods or engine names.

    #: :meth:`add_entries` / :meth:`get_entries` are overridden to do one lookup and one lock per
    #: batch (without it the defaults call :meth:`add_entry` / :meth:`get_entry` per entry)
    supports_batch_add: ClassVar[bool] = False
    #: :meth:`compact` rewrites partly-dead storage to reclaim space (without it ``compact`` does
    #: nothing and the bookie's minor and major compaction runs are skipped)
    supports_compaction: ClassVar[bool] = False
    #: what :meth:`flush` made durable survives a crash and a reopen of the same directories
    #: (an in-memory engine says False; the bookie then relies on the journal alone)
    durable_sync: ClassVar[bool] = True

    def __init__(self, ledger_dirs: Sequence[Path], options: Any = None, /, **values: Any) -> None:
        """``options``: the instance of the engine's ``Options`` dataclass the host parsed from the
        ``storage_options`` table (an engine built in code may pass the table as keyword arguments
        instead, parsed by the same rules: :func:`~ledgerstore.api.options.options_for`)."""
        self.ledger_dirs = [Path(d) for d in ledger_dirs]
        #: the engine's parsed options (its ``Options`` instance; a dict for an engine without one)
        self.options = options_for(type(self), options, values, f"storage plugin {self.name!r}")

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

    def add_entries(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """Store many ``(entry_id, data)`` pairs of one ledger: the same semantics and errors as
        calling :meth:`add_entry` for each pair in order (a later pair with the same entry id
        overwrites an earlier one). An empty sequence does nothing.

        On error (for example :class:`~ledgerstore.errors.InvalidArgumentError` for an entry id
        out of range, or :class:`~ledgerstore.errors.BookieIOError`) the entries before the
        failing one may or may not have been stored, and none after it; the caller treats the
        whole batch as failed (and the journal replays whatever it acknowledged).

        The default calls :meth:`add_entry` for each pair; engines override it to take their
        locks and look up the ledger once per batch rather than once per entry."""
        add = self.add_entry
        for entry_id, data in entries:
            add(ledger_id, entry_id, data)

    def get_entries(self, ledger_id: int, entry_ids: Sequence[int]) -> list[bytes | BaseException]:
        """One result per id of ``entry_ids``, in order: the entry's stored bytes, or the exception
        instance :meth:`get_entry` would have raised for it
        (:class:`~ledgerstore.errors.NoSuchLedgerError`,
        :class:`~ledgerstore.errors.NoSuchEntryError`,
        :class:`~ledgerstore.errors.BookieIOError`, ...). Per-entry failures are returned, never
        raised, so one missing or damaged entry does not fail the others.

        The default calls :meth:`get_entry` for each id, collecting every
        :class:`~ledgerstore.errors.LedgerStoreError` and :class:`OSError`; engines override it to
        take their locks and look up the ledger once per batch."""
        get = self.get_entry
        results: list[bytes | BaseException] = []
        for entry_id in entry_ids:
            try:
                results.append(get(ledger_id, entry_id))
            except (LedgerStoreError, OSError) as exc:
                results.append(exc)
        return results

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

    def compact(self, threshold: float) -> StorageStats:
        """Rewrite stored data whose live fraction is below ``threshold`` (0..1; the bookie passes
        its minor or major compaction threshold) so the space of deleted ledgers is reclaimed;
        every entry of a ledger not deleted stays readable. Returns stats.

        The default does nothing and returns :meth:`stats`: engines that compact override it and
        set :attr:`supports_compaction`."""
        return self.stats()

    @abc.abstractmethod
    def stats(self) -> StorageStats: ...
