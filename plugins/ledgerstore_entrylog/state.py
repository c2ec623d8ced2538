"""The state the parts of the entrylog engine share, and the lock that guards it.

The engine (:class:`~ledgerstore_entrylog.engine.EntryLogStorage`) is a facade over six objects,
each given this state and the other parts it needs when it is built:

* :class:`~ledgerstore_entrylog.logs.EntryLogs`: the entry log files, one active log per ledger
  directory, appends, rolls, ledger maps and the write-back queue;
* :class:`~ledgerstore_entrylog.ledger_cache.LedgerCache`: each ledger's header fields and index
  pages, in memory up to a bound, evicted least recently used first;
* :class:`~ledgerstore_entrylog.writer.Writer`: ``add_entry`` and ``add_entries``;
* :class:`~ledgerstore_entrylog.reads.Reader`: ``get_entry`` and ``get_entries``;
* :class:`~ledgerstore_entrylog.writeback.Checkpointer`: ``flush()`` (the checkpoint), the
  background flush and write-back threads, ``close()``;
* :class:`~ledgerstore_entrylog.compactor.Compactor`: GC and compaction.

Locking. ``EngineState.lock`` guards every piece of mutable state of every part (the fields below,
the ledger cache's pages, the entry logs' buffers, the write-back queue) and is held only for short
steps: one add or batch of adds, one read, one batch of a checkpoint or compaction. Code that
documents itself as "lock held" must be called with it. ``EngineState.flush_mutex`` serialises the
long multi-step operations (checkpoint, GC, compaction, close) with each other; only they close or
delete entry log files, which is why they may fsync or scan a log without holding ``lock``. The
write-back thread holds neither lock while it syncs: under ``lock`` it checks that the log is still
in ``logs`` (so open) and opens its own descriptor for the file, so it can never sync a closed or
reused descriptor, and GC or compaction never waits for it.

Crash safety. A checkpoint writes and fsyncs the entry logs first, then the dirty index pages and
headers, then the directories of files created or deleted, so a durable index never points at data
that is not durable. A dirty page evicted between checkpoints is written only after its
directory's log buffer reached the OS, so an index on disk never points past its log's data if
only the process dies (after a machine crash, open ignores slots beyond the logs' ends and the
journal replays those entries). A page written, by an eviction or a checkpoint, writes only its
dirty slot range: the slots outside it equal the file's, so the file ends up as if the whole page
were written. Evictions write through index files the ledger cache keeps open; the checkpoint
syncs every index file an eviction wrote by name (an fsync covers every descriptor's writes), so
it never uses a descriptor the cache may close meanwhile. GC fsyncs the directories of deleted index files before it deletes
a log they pointed into; compaction makes its copies durable, then the index pointing at them, and
only then deletes the old log, and a ``.compacting`` intent file makes an interrupted compaction
run again at the next open. ``docs/storage-entrylog.md`` gives the whole argument with the files.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ledgerstore.api import OS_STORAGE_FILES, StorageFiles
from ledgerstore.errors import BookieIOError, NoSuchLedgerError
from ledgerstore_entrylog.entrylog import EntryLog

__all__ = ["CachedLedger", "EngineCounters", "EngineState", "IndexPage"]


class IndexPage:
    """One cached index page: ``slots[i]`` is location+1 of entry ``page_no * slots_per_page + i``.

    A dirty page knows which of its slots changed since it was last written or read: slots
    ``first..last`` (inclusive) hold every change, and every slot outside them equals what the
    index file holds, so writing the page writes only those slots' bytes."""

    __slots__ = ("ledger_id", "page_no", "slots", "dirty", "first", "last")

    def __init__(self, ledger_id: int, page_no: int, slots: array[int]) -> None:
        self.ledger_id = ledger_id
        self.page_no = page_no
        self.slots = slots
        self.dirty = False
        #: the dirty slot range (inclusive), meaningful while ``dirty``
        self.first = 0
        self.last = -1

    def mark(self, first: int, last: int) -> bool:
        """Widen the dirty range to cover slots ``first..last``; True if the page was clean."""
        if not self.dirty:
            self.dirty, self.first, self.last = True, first, last
            return True
        if first < self.first:
            self.first = first
        if last > self.last:
            self.last = last
        return False

    def clean(self) -> None:
        """The page was written: the index file holds every slot."""
        self.dirty, self.first, self.last = False, 0, -1


class CachedLedger:
    """In-memory state of one ledger."""

    __slots__ = (
        "ledger_id",
        "dir_idx",
        "path",
        "master_key",
        "fenced",
        "last",
        "pages",
        "cur_no",
        "cur_page",
        "header_dirty",
        "file_exists",
        "file_pages",
    )

    def __init__(self, ledger_id: int, dir_idx: int, path: Path) -> None:
        self.ledger_id = ledger_id
        self.dir_idx = dir_idx
        self.path = path
        self.master_key: bytes | None = None
        self.fenced = False
        self.last = -1
        #: cached pages of this ledger, by page number (the same objects as in the LRU)
        self.pages: dict[int, IndexPage] = {}
        # The page the add path wrote last: sequential adds reuse it without an LRU lookup.
        self.cur_no = -1
        self.cur_page: IndexPage | None = None
        self.header_dirty = True
        self.file_exists = False
        self.file_pages = 0


class EngineCounters:
    """The counters ``stats()`` reports; written under ``EngineState.lock``."""

    __slots__ = (
        "entries_written",
        "gc_runs",
        "bytes_reclaimed",
        "compactions",
        "bytes_compacted",
        "dirty_evictions",
        "background_syncs",
        "background_sync_bytes",
    )

    def __init__(self) -> None:
        self.entries_written = 0
        self.gc_runs = 0
        self.bytes_reclaimed = 0
        self.compactions = 0
        self.bytes_compacted = 0
        self.dirty_evictions = 0
        self.background_syncs = 0
        self.background_sync_bytes = 0


class EngineState:
    """What the parts of one engine share: settings fixed at construction, the two locks, the
    ledgers and entry logs, the sets of files and directories a checkpoint must sync, the
    open/closed flags and the counters. Every mutable field is guarded by :attr:`lock`."""

    def __init__(self, ledger_dirs: list[Path], *, page_size: int, write_buffer_size: int,
                 log_size_limit: int, sync_bytes: int, files: StorageFiles = OS_STORAGE_FILES,
                 schedule: Callable[[Callable[[], object]], object] | None = None) -> None:
        self.ledger_dirs = ledger_dirs
        #: the file port every part does its file I/O through (the OS's files in production)
        self.files = files
        #: runs the background work (write-back syncs) as a job of the caller's loop instead of on
        #: the engine's own threads, when given (the simulation: runs stay a function of the seed)
        self.schedule = schedule
        #: ``<ledger dir>/current`` of each ledger directory, in configuration order
        self.currents = [d / "current" for d in ledger_dirs]
        self.page_size = page_size
        #: index slots per page
        self.slots_per_page = page_size // 8
        self.write_buffer_size = write_buffer_size
        self.log_size_limit = log_size_limit
        #: write-back threshold: bytes written to a log between background syncs (0: off)
        self.sync_bytes = sync_bytes
        #: guards every mutable field of every part; held for short steps only (module docstring).
        #: The parts look it up here at each use, so a test may swap in an instrumented lock
        #: (one counting the work done per hold) before the engine is used.
        self.lock = threading.Lock()
        #: serialises checkpoint, GC, compaction and close; only they close or delete entry logs
        self.flush_mutex = threading.Lock()
        #: set while a close waits for ``flush_mutex``: a throttled compaction holding it
        #: finishes its pass at full speed (:meth:`urgent_flush_mutex`)
        self.hurry = threading.Event()
        self._urgent_waiters = 0
        #: flush() calls waiting for ``flush_mutex``: a compaction holding it runs a checkpoint
        #: for them between two batches (``Checkpointer.flush``)
        self.flush_waiters = 0
        #: checkpoints numbered as they start, and the number of the last one that succeeded
        self.checkpoints_started = 0
        self.checkpoints_done = 0
        #: every ledger stored, by id
        self.ledgers: dict[int, CachedLedger] = {}
        #: every entry log file, by log id
        self.logs: dict[int, EntryLog] = {}
        #: the active (appendable) log of each ledger directory, None until the first add
        self.active: list[EntryLog | None] = [None] * len(self.currents)
        #: ledgers with dirty index pages or a dirty header: what the next checkpoint writes
        self.dirty_ledgers: set[int] = set()
        #: index files written by cache evictions since the last checkpoint (not fsynced)
        self.unsynced_index: set[Path] = set()
        #: directories in which files were created or deleted since the last checkpoint
        self.dirs_to_sync: set[Path] = set()
        #: ledger maps written since the last checkpoint
        self.maps_to_sync: set[Path] = set()
        self.opened = False
        self.closed = False
        #: the first checkpoint or write-back failure; once set every flush() fails
        self.flush_failure = ""
        self.counters = EngineCounters()

    @contextmanager
    def urgent_flush_mutex(self) -> Iterator[None]:
        """Hold ``flush_mutex`` for a close, which must not wait out a throttled compaction:
        while this waits, :attr:`hurry` is set and the compaction's pace stops sleeping.
        ``self.lock`` not held."""
        if not self.flush_mutex.acquire(blocking=False):
            with self.lock:
                self._urgent_waiters += 1
                self.hurry.set()
            try:
                self.flush_mutex.acquire()
            finally:
                with self.lock:
                    self._urgent_waiters -= 1
                    if self._urgent_waiters == 0:
                        self.hurry.clear()
        try:
            yield
        finally:
            self.flush_mutex.release()

    def check_open(self) -> None:
        """BookieIOError unless the engine is open and not yet closed."""
        if self.closed or not self.opened:
            raise BookieIOError(
                f"entrylog storage over {', '.join(map(str, self.ledger_dirs))} is "
                + ("closed" if self.closed else "not open; call open() first")
            )

    def ledger(self, ledger_id: int) -> CachedLedger:
        """The stored ledger; BookieIOError when the engine is not open, NoSuchLedgerError for a
        ledger not stored here. Lock held."""
        self.check_open()
        led = self.ledgers.get(ledger_id)
        if led is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie")
        return led
