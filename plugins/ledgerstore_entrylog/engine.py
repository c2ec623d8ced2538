"""``EntryLogStorage``: BookKeeper's interleaved ledger storage.

Entries of all ledgers are appended to entry logs (one active log per ledger directory); each
ledger has an index file mapping entry ids to log locations, whose pages live in a bounded ledger
cache. ``flush()`` is the checkpoint; GC deletes logs that hold no live ledger; compaction copies
the live entries of sparse logs forward. ``docs/storage-entrylog.md`` describes the files.

This module is the facade: it parses the options, composes the parts
(:class:`~ledgerstore_entrylog.parts.EngineParts`, which also opens them and gathers their
statistics) and implements
:class:`~ledgerstore.api.StorageEngine` by delegating to them. The parts: the shared state and its
lock :mod:`~ledgerstore_entrylog.state` (whose docstring holds the locking and crash-safety
argument, written there only), the entry logs :mod:`~ledgerstore_entrylog.logs` (one file is
:mod:`~ledgerstore_entrylog.entrylog`), the index pages and their cache
:mod:`~ledgerstore_entrylog.ledger_cache`, adds :mod:`~ledgerstore_entrylog.writer`, reads
:mod:`~ledgerstore_entrylog.reads`, the checkpoint and write-back
:mod:`~ledgerstore_entrylog.writeback`, GC and compaction :mod:`~ledgerstore_entrylog.compactor`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import (
    MAX_DURATION_S,
    OS_STORAGE_FILES,
    StorageEngine,
    StorageFiles,
    StorageStats,
    option,
)
from ledgerstore.errors import ConfigError
from ledgerstore_entrylog.compactor import Pace
from ledgerstore_entrylog.parts import EngineParts

__all__ = ["EntryLogStorage"]

_MiB = 1024 * 1024
# BookKeeper's entry logger buffers 64 KiB: the buffer goes to the file in one pwrite on the add
# path (the bookie's event loop), and a 4 MiB one held the loop for 10-45 ms every few seconds at
# 10,000 adds/s (docs/performance.md, "Latency")
_WRITE_BUFFER_SIZE = 256 * 1024
# each background fdatasync is short (a few ms), so a journal fsync queued behind it on the same
# disk waits little
_FLUSH_ENTRYLOG_BYTES = 1 * _MiB
# a compaction reads at most this many bytes of entry log per second: three bookies compacting
# at once unthrottled held a 10,000 entries/s writer's p99 at 12x its solo p99 on 2 cores; at
# this rate a 1 GiB log takes 32 s (docs/performance.md, "Disk that comes back")
_COMPACTION_RATE_BY_BYTES = 32.0 * _MiB
# GC deletes an entry log by truncating it in steps at most this fast: a 1 GiB log unlinked at
# once stalled every fsync on its file system for 60 ms (the blocks it freed are discarded, on a
# file system mounted with ``discard``, in the commit the journals' fsyncs wait for)
_DELETE_RATE_BY_BYTES = 256.0 * _MiB


class EntryLogStorage(StorageEngine):
    """Interleaved entry logs + per-ledger index files + a bounded ledger cache; its options
    (all optional, with their defaults and bounds) are the fields of :class:`Options`."""

    name = "entrylog"
    supports_batch_add = True
    supports_compaction = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``storage_options`` table of the entrylog engine."""

        write_buffer_size: int = option(_WRITE_BUFFER_SIZE, "bytes buffered per active log before a write",
                                        minimum=1)
        entry_log_size_limit: int = option(1024 * _MiB, "roll to a new entry log past this many bytes "
                                           "(offsets in index slots are 32-bit)", minimum=4096, maximum=1 << 32)
        page_size: int = option(8192, "index page size in bytes (a multiple of 8)", minimum=64)
        page_limit_bytes: int = option(256 * _MiB, "bytes of index pages the ledger cache holds (pages are "
                                       "allocated as ledgers use them; 256 MiB holds the tail pages of "
                                       "32,768 ledgers written at once)", minimum=1)
        max_open_index_files: int = option(1024, "index files kept open for the ledger cache's page "
                                           "writes and loads (BookKeeper's openFileLimit)", minimum=1)
        minor_compaction_threshold: float = option(0.2, "gc() compacts logs with less than this live fraction",
                                                   minimum=0, maximum=1)
        major_compaction_threshold: float = option(0.8, "live fraction below which a major compaction "
                                                   "rewrites a log", minimum=0, maximum=1)
        compaction_rate_by_bytes: float = option(_COMPACTION_RATE_BY_BYTES, "entry-log bytes a compaction reads "
                                                 "per second, copied or not (BookKeeper's compactionRateByBytes "
                                                 "counts only the copies); inf: unthrottled", minimum=1)
        compaction_rate_by_entries: float = option(math.inf, "entry-log records a compaction reads per second "
                                                   "(BookKeeper's compactionRateByEntries); inf: unthrottled",
                                                   minimum=1)
        delete_rate_by_bytes: float = option(_DELETE_RATE_BY_BYTES, "entry-log bytes GC frees per second when "
                                             "it deletes a log (truncated in 16 MiB steps, each made durable); "
                                             "inf: each log unlinked at once", minimum=1)
        flush_interval: float = option(0.0, "seconds between background flushes (0: only when the bookie "
                                       "flushes)", minimum=0,
                                       maximum=MAX_DURATION_S)
        flush_entrylog_bytes: int = option(_FLUSH_ENTRYLOG_BYTES, "fdatasync an entry log each time this many "
                                           "bytes were written to it (0: only at checkpoints)", minimum=0)

        def __post_init__(self) -> None:
            if self.page_size % 8:
                raise ValueError(f"page_size={self.page_size} must be a multiple of 8")

    def __init__(self, ledger_dirs: Sequence[Path], options: EntryLogStorage.Options | None = None, /, *,
                 files: StorageFiles = OS_STORAGE_FILES,
                 schedule: Callable[[Callable[[], object]], object] | None = None, **values: Any) -> None:
        """``options``: the ``storage_options`` table as the host parsed it; an engine built in code
        may pass the table as keyword arguments instead (parsed by the same rules).

        The two seams, for a host that runs the engine in a world of its own (the simulation):
        ``files``, the file port every file operation goes through (the operating system's files
        by default); ``schedule``, given a job, runs it later on the host's loop: the write-back
        syncs then run as such jobs instead of on the engine's thread, and no background flush
        thread starts (the bookie's checkpoints flush)."""
        super().__init__(ledger_dirs, options, **values)
        opts: EntryLogStorage.Options = self.options
        if not self.ledger_dirs:
            raise ConfigError("entrylog storage needs at least one ledger directory")
        self.minor_compaction_threshold = opts.minor_compaction_threshold
        self.major_compaction_threshold = opts.major_compaction_threshold
        #: the composed parts (public on purpose: see :class:`~ledgerstore_entrylog.parts.EngineParts`)
        self.parts = EngineParts.build(
            list(self.ledger_dirs),
            page_size=opts.page_size,
            write_buffer_size=opts.write_buffer_size,
            log_size_limit=opts.entry_log_size_limit,
            sync_bytes=opts.flush_entrylog_bytes,
            max_pages=max(2, opts.page_limit_bytes // opts.page_size),
            max_open_files=opts.max_open_index_files,
            flush_interval=opts.flush_interval,
            files=files,
            schedule=schedule,
            compaction_pace=Pace(opts.compaction_rate_by_bytes, opts.compaction_rate_by_entries),
            delete_pace=Pace(opts.delete_rate_by_bytes),
        )
        # The add and read paths are bound to their parts once, so an add or a read costs no call
        # more than when the engine was one class; a subclass's override of one is kept.
        writer, reader = self.parts.writer, self.parts.reader
        for name, bound in (("add_entry", writer.add_entry), ("add_entries", writer.add_entries),
                            ("get_entry", reader.get_entry), ("get_entries", reader.get_entries)):
            if getattr(type(self), name) is getattr(EntryLogStorage, name):
                setattr(self, name, bound)


    # --- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Load entry logs (ledger maps, or a scan when a map is missing) and index headers;
        BookieIOError naming the file for a damaged log or index header
        (:meth:`EngineParts.open <ledgerstore_entrylog.parts.EngineParts.open>`)."""
        self.parts.open()

    def close(self) -> None:
        """Flush, write the ledger maps of the active logs and release every file. Idempotent."""
        self.parts.checkpointer.close()

    def flush(self) -> None:
        """Checkpoint: write and fsync the entry logs, then write and fsync every dirty index page
        and header. When it returns, everything added before the call is durable."""
        self.parts.checkpointer.flush()

    def gc(self) -> StorageStats:
        """Delete entry logs that hold no live ledger, then run a minor compaction (logs whose
        live fraction is below ``minor_compaction_threshold``)."""
        self.parts.compactor.gc(self.minor_compaction_threshold)
        return self.stats()

    def compact(self, threshold: float) -> StorageStats:
        """Compact every finished log whose live fraction is below ``threshold`` (the bookie
        passes the minor or the major threshold); logs with no live data are deleted."""
        self.parts.compactor.compact(threshold)
        return self.stats()

    # --- ledger state ----------------------------------------------------------------------------

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Record the master key; the same key again is a no-op, another key is refused with
        UnauthorizedAccessError."""
        self.parts.cache.set_master_key(ledger_id, master_key)

    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The master key, or None for an unknown ledger."""
        return self.parts.cache.get_master_key(ledger_id)

    def set_fenced(self, ledger_id: int) -> bool:
        """Fence the ledger (creating its record if needed); True if it was not fenced before."""
        return self.parts.cache.set_fenced(ledger_id)

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether the ledger is fenced (False for an unknown ledger)."""
        return self.parts.cache.is_fenced(ledger_id)

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether the ledger is stored here."""
        return self.parts.cache.has_ledger(ledger_id)

    def list_ledgers(self) -> Iterator[int]:
        """Ids of every stored ledger, ascending (a snapshot)."""
        return self.parts.cache.list_ledgers()

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored, -1 if none; NoSuchLedgerError for an unknown ledger."""
        return self.parts.cache.last_entry_id(ledger_id)

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's index file and cached pages; GC reclaims its log space later.
        Deleting an unknown ledger is a no-op."""
        self.parts.cache.delete_ledger(ledger_id)

    # --- entries (bound to the writer and the reader in __init__) ---------------------------------

    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Append the entry to the active log's buffer and point the ledger's index slot at it
        (:meth:`Writer.add_entry <ledgerstore_entrylog.writer.Writer.add_entry>`)."""
        self.parts.writer.add_entry(ledger_id, entry_id, data)

    def add_entries(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """Store a batch of one ledger's entries under one hold of the lock, exactly as
        :meth:`add_entry` for each (:meth:`Writer.add_entries <ledgerstore_entrylog.writer.Writer.add_entries>`)."""
        self.parts.writer.add_entries(ledger_id, entries)

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's data, verified against its record's CRC32C and ids."""
        return self.parts.reader.get_entry(ledger_id, entry_id)

    def get_entries(self, ledger_id: int, entry_ids: Sequence[int]) -> list[bytes | BaseException]:
        """The data of each entry, or the error :meth:`get_entry` would raise for it, in order
        (:meth:`Reader.get_entries <ledgerstore_entrylog.reads.Reader.get_entries>`)."""
        return self.parts.reader.get_entries(ledger_id, entry_ids)

    # --- statistics ------------------------------------------------------------------------------

    def stats(self) -> StorageStats:
        """Ledger count, bytes on disk (logs incl. buffered bytes, index files), counters
        (:meth:`EngineParts.stats <ledgerstore_entrylog.parts.EngineParts.stats>`)."""
        return self.parts.stats()
