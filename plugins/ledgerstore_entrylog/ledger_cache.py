"""The ledger cache of the entrylog engine (BookKeeper's ``IndexInMemoryPageManager``): each
ledger's index pages, in memory up to ``page_limit_bytes`` and evicted least recently used first; a
dirty page evicted has the range of its slots that changed written to its index file (after the
log data it points at), through a bounded cache of open index files
(:mod:`~ledgerstore_entrylog.index_files`).

It also loads the index headers at open, and answers and changes the per-ledger state (master
key, fence, last entry, deletion) for the engine. The methods documented "lock held" run under the
engine lock (:mod:`~ledgerstore_entrylog.state`); the others take it.
"""

from __future__ import annotations

import logging
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from ledgerstore.api import StorageFile
from ledgerstore.errors import (
    BookieIOError,
    InvalidArgumentError,
    UnauthorizedAccessError,
    storage_write_error,
)
from ledgerstore_entrylog.format import (
    INDEX_HEADER_SIZE,
    MAX_ID,
    MAX_MASTER_KEY,
    OFFSET_MASK,
    RECORD_HEADER_SIZE,
    encode_index_header,
    index_path,
)
from ledgerstore_entrylog.index import (
    PageRange,
    read_header,
    read_last_pages,
    read_page_from,
    remove_file,
    write_index,
    write_ranges,
)
from ledgerstore_entrylog.index_files import IndexFileHandles
from ledgerstore_entrylog.logs import EntryLogs
from ledgerstore_entrylog.state import CachedLedger, EngineState, IndexPage

__all__ = ["CachedLedger", "IndexPage", "LedgerCache"]

log = logging.getLogger(__name__)


class LedgerCache:
    """Index pages and per-ledger state of the engine, holding at most ``max_pages`` pages and
    keeping at most ``max_open_files`` index files open."""

    def __init__(self, state: EngineState, logs: EntryLogs, max_pages: int, max_open_files: int = 1024) -> None:
        self._state = state
        self._logs = logs
        self._spp = state.slots_per_page
        self._page_size = state.page_size
        self._zero_page = bytes(state.page_size)
        #: the bound on cached pages
        self.max_pages = max_pages
        self._lru: OrderedDict[tuple[int, int], IndexPage] = OrderedDict()
        #: the index files evictions and page loads read and write through
        self.handles = IndexFileHandles(state.files, max_open_files)

    # --- open -------------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the header of every index file (the entry logs are loaded first: the last entry
        of a ledger is the last slot pointing inside an existing log). BookieIOError naming the
        file for a damaged header, a page size other than the configured one, or a ledger with
        two index files."""
        files = self._state.files
        for dir_idx, current in enumerate(self._state.currents):
            index_root = current / "index"
            for sub in sorted(files.listdir(index_root)):
                subdir = index_root / sub
                if not files.is_dir(subdir):
                    continue
                for name in sorted(files.listdir(subdir)):
                    if not name.endswith(".idx"):
                        continue
                    self._load_index(dir_idx, subdir / name)

    def _load_index(self, dir_idx: int, path: Path) -> None:
        files = self._state.files
        if files.size(path) == 0:
            # Created by a checkpoint that never wrote its header (a crash, or a full disk and
            # then a crash): no checkpoint covered it, so the journal still holds what it was for.
            log.warning("removing empty index file %s, left by a checkpoint that never finished", path)
            files.remove(path)
            return
        header, size = read_header(files, path)
        if path.name != f"{header.ledger_id:016x}.idx":
            raise BookieIOError(f"index file {path}: header names ledger {header.ledger_id}")
        if header.page_size != self._page_size:
            raise BookieIOError(
                f"index file {path} uses page_size={header.page_size} but the engine is configured with "
                f"page_size={self._page_size}; configure page_size={header.page_size}"
            )
        ledgers = self._state.ledgers
        other = ledgers.get(header.ledger_id)
        if other is not None:
            raise BookieIOError(f"ledger {header.ledger_id} has two index files: {other.path} and {path}")
        led = CachedLedger(header.ledger_id, dir_idx, path)
        led.master_key = header.master_key
        led.fenced = header.fenced
        led.header_dirty = False
        led.file_exists = True
        led.file_pages = max(0, (size - INDEX_HEADER_SIZE + self._page_size - 1) // self._page_size)
        led.last = self._last_valid_entry(path, size)
        ledgers[header.ledger_id] = led

    def _last_valid_entry(self, path: Path, size: int) -> int:
        """The highest entry whose slot points inside an existing log. Slots beyond that were
        written (by a cache eviction) for entries whose log data a machine crash lost; the
        journal replays those entries, so they must not count as stored."""
        logs = self._state.logs
        for page_no, slots in read_last_pages(self._state.files, path, size, self._page_size):
            for i in range(len(slots) - 1, -1, -1):
                v = slots[i]
                if v:
                    v -= 1
                    lg = logs.get(v >> 32)
                    if lg is not None and (v & OFFSET_MASK) + RECORD_HEADER_SIZE <= lg.written:
                        return page_no * self._spp + i
        return -1

    # --- ledger state (these take the lock) -----------------------------------------------------

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Record the master key; the same key again is a no-op, another key is refused with
        UnauthorizedAccessError."""
        if len(master_key) > MAX_MASTER_KEY:
            raise InvalidArgumentError(f"master key of {len(master_key)} bytes; the limit is {MAX_MASTER_KEY}")
        st = self._state
        with st.lock:
            st.check_open()
            led = self.get_or_create(ledger_id)
            if led.master_key is None:
                led.master_key = bytes(master_key)
                led.header_dirty = True
                st.dirty_ledgers.add(ledger_id)
            elif led.master_key != master_key:
                raise UnauthorizedAccessError(
                    f"ledger {ledger_id} already has another master key on this bookie; "
                    "the client's password does not match the one the ledger was created with"
                )

    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The master key, or None for an unknown ledger."""
        st = self._state
        with st.lock:
            st.check_open()
            led = st.ledgers.get(ledger_id)
            return led.master_key if led is not None else None

    def set_fenced(self, ledger_id: int) -> bool:
        """Fence the ledger (creating its record if needed); True if it was not fenced before."""
        st = self._state
        with st.lock:
            st.check_open()
            led = self.get_or_create(ledger_id)
            if led.fenced:
                return False
            led.fenced = True
            led.header_dirty = True
            st.dirty_ledgers.add(ledger_id)
            return True

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether the ledger is fenced (False for an unknown ledger)."""
        st = self._state
        with st.lock:
            st.check_open()
            led = st.ledgers.get(ledger_id)
            return led is not None and led.fenced

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether the ledger is stored here."""
        st = self._state
        with st.lock:
            st.check_open()
            return ledger_id in st.ledgers

    def list_ledgers(self) -> Iterator[int]:
        """Ids of every stored ledger, ascending (a snapshot)."""
        st = self._state
        with st.lock:
            st.check_open()
            ids = sorted(st.ledgers)
        return iter(ids)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored, -1 if none; NoSuchLedgerError for an unknown ledger."""
        st = self._state
        with st.lock:
            return st.ledger(ledger_id).last

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's index file and cached pages; GC reclaims its log space later.
        Deleting an unknown ledger is a no-op."""
        st = self._state
        with st.lock:
            st.check_open()
            led = st.ledgers.pop(ledger_id, None)
            if led is None:
                return
            for page_no in led.pages:
                del self._lru[(ledger_id, page_no)]
            led.pages.clear()
            led.cur_no, led.cur_page = -1, None
            st.dirty_ledgers.discard(ledger_id)
            st.unsynced_index.discard(led.path)
            self.handles.drop(led.path)
            if led.file_exists:
                remove_file(st.files, led.path)
                # GC fsyncs this directory before deleting any log, so a deleted ledger can
                # never come back after a crash pointing at a log that is gone.
                st.dirs_to_sync.add(led.path.parent)

    # --- pages (lock held) ------------------------------------------------------------------------

    def page_counts(self) -> tuple[int, int]:
        """Cached pages and, of those, dirty ones. Lock held."""
        return len(self._lru), sum(1 for p in self._lru.values() if p.dirty)

    def get_or_create(self, ledger_id: int) -> CachedLedger:
        """The ledger's state, created (dirty, in the directory ``ledger_id mod n``) if it is not
        stored yet; InvalidArgumentError for an id outside 0..2**63-1. Lock held."""
        st = self._state
        led = st.ledgers.get(ledger_id)
        if led is None:
            if not 0 <= ledger_id <= MAX_ID:
                raise InvalidArgumentError(f"ledger id {ledger_id} is outside 0..2**63-1")
            dir_idx = ledger_id % len(st.currents)
            led = CachedLedger(ledger_id, dir_idx, index_path(st.currents[dir_idx], ledger_id))
            st.ledgers[ledger_id] = led
            st.dirty_ledgers.add(ledger_id)
        return led

    def set_slot(self, led: CachedLedger, entry_id: int, value: int, span: tuple[int, int] | None = None) -> None:
        """Point the entry's index slot at ``value`` (location + 1) and mark its page dirty. The
        page becomes the ledger's current page. ``span``, the lowest and highest entry id of a
        batch whose other slots the caller then sets directly on this page, marks the slots of
        the batch on the page dirty as well, before anything can evict it. Lock held."""
        spp = self._spp
        page_no, slot = divmod(entry_id, spp)
        if led.cur_no == page_no:
            page = led.cur_page
            assert page is not None
        else:
            page = self.page(led, page_no)
            led.cur_no, led.cur_page = page_no, page
        page.slots[slot] = value
        first = last = slot
        if span is not None:
            base = page_no * spp
            first = min(slot, max(span[0] - base, 0))
            last = max(slot, min(span[1] - base, spp - 1))
        if page.mark(first, last):
            self._state.dirty_ledgers.add(led.ledger_id)

    def slot(self, led: CachedLedger, entry_id: int) -> int:
        """The entry's index slot: its location + 1, 0 when absent. Lock held."""
        page_no, slot = divmod(entry_id, self._spp)
        page = led.cur_page if led.cur_no == page_no else self.page(led, page_no)
        assert page is not None
        return page.slots[slot]

    def page(self, led: CachedLedger, page_no: int) -> IndexPage:
        """The cached page, loading it (and evicting the least recently used) if needed. Lock held."""
        page = led.pages.get(page_no)
        if page is not None:
            self._lru.move_to_end((led.ledger_id, page_no))
            return page
        while len(self._lru) >= self.max_pages:
            self._evict_one()
        if led.file_exists and page_no < led.file_pages:
            slots = self._read_page(led, page_no)
        else:
            slots = array("Q", self._zero_page)
        page = IndexPage(led.ledger_id, page_no, slots)
        led.pages[page_no] = page
        self._lru[(led.ledger_id, page_no)] = page
        return page

    def _read_page(self, led: CachedLedger, page_no: int) -> array[int]:
        try:
            f = self.handles.get(led.path, create=False)
        except FileNotFoundError:
            return array("Q", self._zero_page)
        except OSError as exc:
            raise BookieIOError(f"cannot open index file {led.path}: {exc}") from exc
        try:
            return read_page_from(f, led.path, page_no, self._page_size)
        except BookieIOError:
            self.handles.drop(led.path)
            raise

    def _evict_one(self) -> None:
        st = self._state
        (ledger_id, page_no), page = self._lru.popitem(last=False)
        led = st.ledgers[ledger_id]
        del led.pages[page_no]
        if led.cur_no == page_no:
            led.cur_no, led.cur_page = -1, None
        if page.dirty:
            try:
                # The page may point into the log's write buffer: hand that to the OS first, so
                # an index on disk never points past its log's data if only the process dies.
                self._logs.write_out_active(led.dir_idx)
                self.write_pages(led, [page], keep_open=False)
            except BaseException:
                # Not written (a full disk): the page stays cached and dirty, first in line, so
                # the slots of entries already acknowledged are not lost with it.
                led.pages[page_no] = page
                self._lru[(ledger_id, page_no)] = page
                self._lru.move_to_end((ledger_id, page_no), last=False)
                raise
            st.counters.dirty_evictions += 1

    def write_pages(self, led: CachedLedger, pages: list[IndexPage], keep_open: bool) -> StorageFile | None:
        """Write the dirty slot range of each page (and the header when new or changed) to the
        index file, without fsync, and mark the pages clean. With ``keep_open`` the file is
        opened for this write and returned for the caller to sync and close; otherwise it is
        written through the cache of open index files and remembered for the next checkpoint to
        sync. Lock held."""
        st = self._state
        header = None
        if not led.file_exists or led.header_dirty:
            header = encode_index_header(led.ledger_id, self._page_size, led.fenced, led.master_key)
        if not led.file_exists:
            subdir = led.path.parent
            try:
                st.files.mkdir(subdir)
                st.dirs_to_sync.add(subdir.parent)
            except FileExistsError:
                pass
            except OSError as exc:
                raise BookieIOError(f"cannot create index directory {subdir}: {exc}") from exc
            st.dirs_to_sync.add(subdir)
        ranges: list[PageRange] = [(pg.page_no, pg.slots, pg.first, pg.last) for pg in pages if pg.dirty]
        f = None
        if keep_open:
            f = write_index(st.files, led.path, header, ranges, self._page_size, keep_open=True)
        else:
            self._write_cached(led.path, header, ranges)
            st.unsynced_index.add(led.path)
        led.file_exists = True
        led.header_dirty = False
        for pg in pages:
            pg.clean()
            if pg.page_no >= led.file_pages:
                led.file_pages = pg.page_no + 1
        return f

    def _write_cached(self, path: Path, header: bytes | None, ranges: list[PageRange]) -> None:
        try:
            f = self.handles.get(path, create=True)
        except OSError as exc:
            raise storage_write_error(f"cannot open index file {path} for writing", exc) from exc
        try:
            write_ranges(f, path, header, ranges, self._page_size)
        except BaseException:
            # what the file holds now is unknown: the next write opens it afresh
            self.handles.drop(path)
            raise

    def close_files(self) -> None:
        """Close every index file the cache holds open (the engine is closing). Lock held."""
        self.handles.close_all()
