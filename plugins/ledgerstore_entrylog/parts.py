"""The parts an entrylog engine is composed of, and the one place that builds them, each given what
it needs (:mod:`~ledgerstore_entrylog.state` maps them and holds the locking argument)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ledgerstore.api import OS_STORAGE_FILES, StorageFiles, StorageStats
from ledgerstore_entrylog.compactor import Compactor, Pace
from ledgerstore_entrylog.format import INDEX_HEADER_SIZE
from ledgerstore_entrylog.ledger_cache import LedgerCache
from ledgerstore_entrylog.logs import EntryLogs
from ledgerstore_entrylog.reads import Reader
from ledgerstore_entrylog.state import EngineState
from ledgerstore_entrylog.writeback import Checkpointer
from ledgerstore_entrylog.writer import Writer

__all__ = ["EngineParts"]


@dataclasses.dataclass(frozen=True)
class EngineParts:
    """The objects an :class:`EntryLogStorage` is composed of, public so that tests and tools can
    observe or instrument them (for example count the work done per hold of ``state.lock``)."""

    state: EngineState
    logs: EntryLogs
    cache: LedgerCache
    writer: Writer
    reader: Reader
    checkpointer: Checkpointer
    compactor: Compactor

    @classmethod
    def build(cls, ledger_dirs: list[Path], *, page_size: int, write_buffer_size: int, log_size_limit: int,
              sync_bytes: int, max_pages: int, flush_interval: float, max_open_files: int = 1024, files: StorageFiles = OS_STORAGE_FILES,
              schedule: Callable[[Callable[[], object]], object] | None = None,
              compaction_pace: Pace | None = None, delete_pace: Pace | None = None) -> EngineParts:
        """Compose the parts over one new state, each given what it needs (``files`` and
        ``schedule``: :class:`~ledgerstore_entrylog.state.EngineState`)."""
        state = EngineState(ledger_dirs, page_size=page_size, write_buffer_size=write_buffer_size,
                            log_size_limit=log_size_limit, sync_bytes=sync_bytes, files=files, schedule=schedule)
        logs = EntryLogs(state)
        cache = LedgerCache(state, logs, max_pages, max_open_files)
        checkpointer = Checkpointer(state, logs, cache, flush_interval)
        return cls(state, logs, cache, Writer(state, logs, cache), Reader(state, cache), checkpointer,
                   Compactor(state, logs, cache, checkpointer, compaction_pace, delete_pace))

    def open(self) -> None:
        """Load the entry logs (ledger maps, or a scan when a map is missing) and the index
        headers, then start the write-back thread. Idempotent. On a damaged log or index header
        (BookieIOError naming the file) every file opened so far is released again."""
        st = self.state
        with st.flush_mutex, st.lock:
            if st.opened:
                return
            try:
                self.logs.load()
                self.cache.load()
            except BaseException:
                self.logs.close_all()
                st.logs.clear()
                st.ledgers.clear()
                raise
            st.opened = True
        self.checkpointer.start()

    def stats(self) -> StorageStats:
        """Ledger count, bytes on disk (logs incl. buffered bytes, index files) and the counters,
        read under one hold of ``state.lock`` so the figures agree with each other."""
        st = self.state
        c = st.counters
        with st.lock:
            log_bytes = sum(lg.size for lg in st.logs.values())
            index_bytes = sum(
                INDEX_HEADER_SIZE + led.file_pages * st.page_size for led in st.ledgers.values() if led.file_exists
            )
            pages, dirty = self.cache.page_counts()
            return StorageStats(
                ledgers=len(st.ledgers),
                bytes_on_disk=log_bytes + index_bytes,
                entries_written=c.entries_written,
                gc_runs=c.gc_runs,
                bytes_reclaimed=c.bytes_reclaimed,
                extra={
                    "entry_logs": len(st.logs),
                    "entry_log_bytes": log_bytes,
                    "index_bytes": index_bytes,
                    "cache_pages": pages,
                    "cache_dirty_pages": dirty,
                    "cache_limit_pages": self.cache.max_pages,
                    "dirty_evictions": c.dirty_evictions,
                    "compactions": c.compactions,
                    "bytes_compacted": c.bytes_compacted,
                    "pinned_logs": sum(1 for lg in st.logs.values() if lg.pinned),
                    "background_syncs": c.background_syncs,
                    "background_sync_bytes": c.background_sync_bytes,
                },
            )
