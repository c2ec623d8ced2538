"""The ledger cache of the entrylog engine (BookKeeper's ``IndexInMemoryPageManager``): each
ledger's index pages, in memory up to ``page_limit_bytes`` and evicted least recently used first; a
dirty page evicted is written to its index file (after the log data it points at).

A mixin of :class:`~ledgerstore_entrylog.engine.EntryLogStorage`: its methods run under the
engine's ``_lock`` and use the engine's state.
"""

from __future__ import annotations

from array import array
from pathlib import Path

from ledgerstore.errors import BookieIOError, InvalidArgumentError
from ledgerstore_entrylog.format import MAX_ID, encode_index_header, index_path
from ledgerstore_entrylog.index import read_page, write_index


class IndexPage:
    """One cached index page: ``slots[i]`` is location+1 of entry ``page_no * slots_per_page + i``."""

    __slots__ = ("ledger_id", "page_no", "slots", "dirty")

    def __init__(self, ledger_id: int, page_no: int, slots: array) -> None:
        self.ledger_id = ledger_id
        self.page_no = page_no
        self.slots = slots
        self.dirty = False


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


class LedgerCache:
    """Index pages and per-ledger state of the engine."""

    def _get_or_create(self, ledger_id: int) -> CachedLedger:
        led = self._ledgers.get(ledger_id)
        if led is None:
            if not 0 <= ledger_id <= MAX_ID:
                raise InvalidArgumentError(f"ledger id {ledger_id} is outside 0..2**63-1")
            dir_idx = ledger_id % len(self._currents)
            led = CachedLedger(ledger_id, dir_idx, index_path(self._currents[dir_idx], ledger_id))
            self._ledgers[ledger_id] = led
            self._dirty_ledgers.add(ledger_id)
        return led

    def _set_slot(self, led: CachedLedger, entry_id: int, value: int) -> None:
        page_no, slot = divmod(entry_id, self._spp)
        if led.cur_no == page_no:
            page = led.cur_page
            assert page is not None
        else:
            page = self._page(led, page_no)
            led.cur_no, led.cur_page = page_no, page
        page.slots[slot] = value
        if not page.dirty:
            page.dirty = True
            self._dirty_ledgers.add(led.ledger_id)

    def _slot(self, led: CachedLedger, entry_id: int) -> int:
        page_no, slot = divmod(entry_id, self._spp)
        page = led.cur_page if led.cur_no == page_no else self._page(led, page_no)
        assert page is not None
        return page.slots[slot]

    def _page(self, led: CachedLedger, page_no: int) -> IndexPage:
        """The cached page, loading it (and evicting the least recently used) if needed. Lock held."""
        page = led.pages.get(page_no)
        if page is not None:
            self._lru.move_to_end((led.ledger_id, page_no))
            return page
        while len(self._lru) >= self._max_pages:
            self._evict_one()
        if led.file_exists and page_no < led.file_pages:
            slots = read_page(led.path, page_no, self._page_size)
        else:
            slots = array("Q", self._zero_page)
        page = IndexPage(led.ledger_id, page_no, slots)
        led.pages[page_no] = page
        self._lru[(led.ledger_id, page_no)] = page
        return page

    def _evict_one(self) -> None:
        (ledger_id, page_no), page = self._lru.popitem(last=False)
        led = self._ledgers[ledger_id]
        del led.pages[page_no]
        if led.cur_no == page_no:
            led.cur_no, led.cur_page = -1, None
        if page.dirty:
            # The page may point into the log's write buffer: hand that to the OS first, so an
            # index on disk never points past its log's data if only the process dies.
            active = self._active[led.dir_idx]
            if active is not None:
                active.write_out()
                self._note_written(active)
            self._write_ledger_pages(led, [(page_no, page.slots)], keep_open=False)
            page.dirty = False
            self._dirty_evictions += 1

    def _write_ledger_pages(self, led: CachedLedger, pages: list[tuple[int, array]], keep_open: bool) -> int:
        """Write pages (and the header when new or changed) to the index file. Lock held."""
        header = None
        if not led.file_exists or led.header_dirty:
            header = encode_index_header(led.ledger_id, self._page_size, led.fenced, led.master_key)
        if not led.file_exists:
            subdir = led.path.parent
            try:
                subdir.mkdir()
                self._dirs_to_sync.add(subdir.parent)
            except FileExistsError:
                pass
            except OSError as exc:
                raise BookieIOError(f"cannot create index directory {subdir}: {exc}") from exc
            self._dirs_to_sync.add(subdir)
        fd = write_index(led.path, header, pages, self._page_size, keep_open)
        led.file_exists = True
        led.header_dirty = False
        for page_no, _ in pages:
            if page_no >= led.file_pages:
                led.file_pages = page_no + 1
        if not keep_open:
            self._unsynced_index.add(led.path)
        return fd
