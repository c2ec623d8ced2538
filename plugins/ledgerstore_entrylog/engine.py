"""``EntryLogStorage``: BookKeeper's interleaved ledger storage.

Entries of all ledgers are appended to entry logs (one active log per ledger directory); each
ledger has an index file mapping entry ids to log locations, whose pages live in a bounded ledger
cache. ``flush()`` is the checkpoint: entry logs are written and fsynced first, then index pages
and headers are written and fsynced, so a durable index never points at data that is not durable.
GC deletes logs that hold no live ledger; compaction copies the live entries of sparse logs
forward. ``docs/storage-entrylog.md`` describes the files and the crash-safety argument.

Locking: ``_lock`` guards every piece of mutable state and is held only for short steps (one add,
one read, one batch of a flush or compaction). ``_flush_mutex`` serialises the long multi-step
operations (flush, gc, compaction, close) with each other; only they close or delete entry log
files, which is why they may fsync or scan a log without holding ``_lock``.

Write-back: with ``flush_entrylog_bytes`` > 0 a background thread fdatasyncs an entry log every
time that many bytes have been written to it, so dirty pages never pile up between checkpoints
into a write-back burst that stalls the journal's fdatasync. It holds neither lock while syncing:
under ``_lock`` it checks that the log is still open and opens its own descriptor for the file,
so it can never sync a closed or reused descriptor, and a GC or compaction never waits for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from crc32c import crc32c

from ledgerstore.api import StorageEngine, StorageStats, option
from ledgerstore.errors import (
    BookieIOError,
    ConfigError,
    InvalidArgumentError,
    LedgerStoreError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore_entrylog.entrylog import WINDOW_TAIL, EntryLog, LogScanner, ScannedRecord
from ledgerstore_entrylog.format import (
    INDEX_HEADER_SIZE,
    LOG_HEADER_SIZE,
    MAX_MASTER_KEY,
    RECORD_HEADER_SIZE,
    RECORD_IDS,
    RECORD_LEN_CRC,
    decode_ledger_map,
    encode_index_header,
    encode_ledger_map,
    index_path,
    parse_log_file_name,
)
from ledgerstore_entrylog.index import (
    fsync_dir,
    fsync_file,
    read_header,
    read_last_pages,
    read_page,
    write_index,
)

__all__ = ["EntryLogStorage"]

log = logging.getLogger(__name__)

_MiB = 1024 * 1024
_DEFAULTS: dict[str, Any] = {
    "write_buffer_size": 4 * _MiB,
    "entry_log_size_limit": 1024 * _MiB,
    "page_size": 8192,
    "page_limit_bytes": 64 * _MiB,
    "minor_compaction_threshold": 0.2,
    "major_compaction_threshold": 0.8,
    "flush_interval": 0.0,
    "flush_entrylog_bytes": 4 * _MiB,
}
_MAX_ID = (1 << 63) - 1
_OFFSET_MASK = 0xFFFFFFFF
# Compaction copies records in batches of about this many bytes per hold of the lock.
_COMPACT_BATCH_BYTES = 1 * _MiB
_FLUSH_LEDGER_CHUNK = 64
_INDEX_UPDATE_CHUNK = 2048
# get_entries releases the lock after reading about this many bytes.
_READ_BATCH_BYTES = 1 * _MiB
# get_entries reads records of one log with one pread while each starts at most _WINDOW_GAP
# bytes after the one before it and at most _WINDOW_BYTES after the first.
_WINDOW_BYTES = 1 * _MiB
_WINDOW_GAP = 64 * 1024
# Ids get_entries looks up per step: the first step's, then at most this many.
_FIRST_BLOCK = 256
_MAX_BLOCK = 2048


class _Page:
    """One cached index page: ``slots[i]`` is location+1 of entry ``page_no * slots_per_page + i``."""

    __slots__ = ("ledger_id", "page_no", "slots", "dirty")

    def __init__(self, ledger_id: int, page_no: int, slots: array) -> None:
        self.ledger_id = ledger_id
        self.page_no = page_no
        self.slots = slots
        self.dirty = False


class _Ledger:
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
        self.pages: dict[int, _Page] = {}
        # The page the add path wrote last: sequential adds reuse it without an LRU lookup.
        self.cur_no = -1
        self.cur_page: _Page | None = None
        self.header_dirty = True
        self.file_exists = False
        self.file_pages = 0


class EntryLogStorage(StorageEngine):
    """Interleaved entry logs + per-ledger index files + a bounded ledger cache.

    Options (all optional): ``write_buffer_size`` (bytes buffered per active log before a write,
    4 MiB), ``entry_log_size_limit`` (roll size, 1 GiB, at most 4 GiB), ``page_size`` (index page
    size, 8 KiB, a multiple of 8), ``page_limit_bytes`` (ledger cache bound, 64 MiB),
    ``minor_compaction_threshold`` (used by :meth:`gc`, 0.2), ``major_compaction_threshold``
    (0.8, for the bookie's major compaction runs through :meth:`compact`), ``flush_interval``
    (seconds between background flushes, 0 = only when the bookie calls :meth:`flush`),
    ``flush_entrylog_bytes`` (a background thread fdatasyncs an entry log each time this many
    bytes have been written to it since its last sync, 4 MiB; 0 = only the checkpoint syncs).
    """

    name = "entrylog"
    supports_batch_add = True
    supports_compaction = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``storage_options`` table of the entrylog engine."""

        write_buffer_size: int = option(_DEFAULTS["write_buffer_size"], "bytes buffered per active log "
                                        "before a write", minimum=1)
        entry_log_size_limit: int = option(_DEFAULTS["entry_log_size_limit"], "roll to a new entry log past "
                                           "this many bytes", minimum=4096, maximum=1 << 32)
        page_size: int = option(_DEFAULTS["page_size"], "index page size in bytes (a multiple of 8)", minimum=64)
        page_limit_bytes: int = option(_DEFAULTS["page_limit_bytes"], "bytes of index pages the ledger cache "
                                       "holds", minimum=1)
        minor_compaction_threshold: float = option(_DEFAULTS["minor_compaction_threshold"], "gc() compacts logs "
                                                   "with less than this live fraction", minimum=0, maximum=1)
        major_compaction_threshold: float = option(_DEFAULTS["major_compaction_threshold"], "live fraction "
                                                   "below which a major compaction rewrites a log",
                                                   minimum=0, maximum=1)
        flush_interval: float = option(_DEFAULTS["flush_interval"], "seconds between background flushes "
                                       "(0: only when the bookie flushes)", minimum=0)
        flush_entrylog_bytes: int = option(_DEFAULTS["flush_entrylog_bytes"], "fdatasync an entry log each time "
                                           "this many bytes were written to it (0: only at checkpoints)", minimum=0)

    def __init__(self, ledger_dirs: Sequence[Path], **options: Any) -> None:
        super().__init__(ledger_dirs, **options)
        unknown = sorted(set(options) - set(_DEFAULTS))
        if unknown:
            raise ConfigError(
                f"entrylog storage: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(_DEFAULTS))}"
            )
        if not self.ledger_dirs:
            raise ConfigError("entrylog storage needs at least one ledger directory")
        opts = {**_DEFAULTS, **options}
        self._wbs = _positive_int(opts, "write_buffer_size")
        self._log_limit = _positive_int(opts, "entry_log_size_limit")
        if self._log_limit > (1 << 32) or self._log_limit < 4096:
            raise ConfigError(
                f"entrylog storage: entry_log_size_limit={self._log_limit} must be between 4096 and 4 GiB "
                "(offsets in index slots are 32-bit)"
            )
        self._page_size = _positive_int(opts, "page_size")
        if self._page_size % 8 or self._page_size < 64:
            raise ConfigError(f"entrylog storage: page_size={self._page_size} must be a multiple of 8, >= 64")
        page_limit = _positive_int(opts, "page_limit_bytes")
        self._max_pages = max(2, page_limit // self._page_size)
        self.minor_compaction_threshold = float(opts["minor_compaction_threshold"])
        self.major_compaction_threshold = float(opts["major_compaction_threshold"])
        self._flush_interval = float(opts["flush_interval"])
        self._sync_bytes = _non_negative_int(opts, "flush_entrylog_bytes")
        self._spp = self._page_size // 8
        self._zero_page = bytes(self._page_size)

        self._lock = threading.Lock()
        self._flush_mutex = threading.Lock()
        self._currents = [d / "current" for d in self.ledger_dirs]
        self._ledgers: dict[int, _Ledger] = {}
        self._logs: dict[int, EntryLog] = {}
        self._active: list[EntryLog | None] = [None] * len(self._currents)
        self._next_log_id = 0
        self._lru: OrderedDict[tuple[int, int], _Page] = OrderedDict()
        self._dirty_ledgers: set[int] = set()
        self._unsynced_index: set[Path] = set()
        self._dirs_to_sync: set[Path] = set()
        self._maps_to_sync: set[Path] = set()
        self._opened = False
        self._closed = False
        self._flush_failure = ""
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        # Write-back: logs past the threshold, by id, waiting for the syncer thread.
        self._sync_queue: dict[int, EntryLog] = {}
        self._sync_wake = threading.Event()
        self._syncer: threading.Thread | None = None
        self._background_syncs = 0
        self._background_sync_bytes = 0
        # statistics
        self._entries_written = 0
        self._gc_runs = 0
        self._bytes_reclaimed = 0
        self._compactions = 0
        self._bytes_compacted = 0
        self._dirty_evictions = 0

    # --- lifecycle ------------------------------------------------------------------------------

    def open(self) -> None:
        """Load entry logs (ledger maps, or a scan when a map is missing) and index headers;
        BookieIOError naming the file for a damaged log or index header."""
        with self._flush_mutex, self._lock:
            if self._opened:
                return
            try:
                self._load_logs()
                self._load_indexes()
            except BaseException:
                for lg in self._logs.values():
                    lg.close()
                self._logs.clear()
                self._ledgers.clear()
                raise
            self._opened = True
        if self._flush_interval > 0:
            self._flusher = threading.Thread(target=self._flush_loop, name="entrylog-flush", daemon=True)
            self._flusher.start()
        if self._sync_bytes > 0:
            self._syncer = threading.Thread(target=self._sync_loop, name="entrylog-writeback", daemon=True)
            self._syncer.start()

    def _load_logs(self) -> None:
        seen: dict[int, Path] = {}
        for dir_idx, current in enumerate(self._currents):
            try:
                (current / "index").mkdir(parents=True, exist_ok=True)
                names = os.listdir(current)
            except OSError as exc:
                raise BookieIOError(f"ledger directory {current} is not usable: {exc}") from exc
            for name in sorted(names):
                if name.endswith(".compacting"):
                    continue
                log_id = parse_log_file_name(name)
                if log_id is None:
                    continue
                path = current / name
                if log_id in seen:
                    raise BookieIOError(f"entry log id {log_id:08x} exists twice: {seen[log_id]} and {path}")
                seen[log_id] = path
                lg = EntryLog.open_existing(log_id, dir_idx, path)
                self._logs[log_id] = lg
                self._load_ledger_map(lg)
            for name in names:
                if name.endswith(".lmap") and parse_log_file_name(name[: -len(".lmap")] + ".log") not in self._logs:
                    _unlink(current / name)  # left by a crash while its log was being deleted
                elif name.endswith(".compacting"):
                    log_id = parse_log_file_name(name[: -len(".compacting")] + ".log")
                    if log_id is not None and log_id in self._logs:
                        # An interrupted compaction: some index slots may already point at the
                        # copies. Compacting the log again settles it either way.
                        self._logs[log_id].must_compact = True
                    else:
                        _unlink(current / name)
        self._next_log_id = max(self._logs, default=-1) + 1

    def _load_ledger_map(self, lg: EntryLog) -> None:
        map_path = lg.path.with_suffix(".lmap")
        decoded = None
        try:
            decoded = decode_ledger_map(map_path.read_bytes(), lg.log_id)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("ignoring unreadable ledger map %s (%s); scanning the log instead", map_path, exc)
        if decoded is not None:
            lg.total, lg.ledgers = decoded
            return
        if lg.written < LOG_HEADER_SIZE:
            return
        scanner = LogScanner(lg.fd, lg.written, lg.path)
        ledgers: dict[int, int] = {}
        total = 0
        for rec in scanner:
            n = rec.record_size
            ledgers[rec.ledger_id] = ledgers.get(rec.ledger_id, 0) + n
            total += n
        lg.ledgers, lg.total = ledgers, total
        if not scanner.clean:
            # What follows the damage cannot be attributed to ledgers, so GC could delete live
            # data: keep the log until an operator looks at it.
            lg.pinned = True
            log.error("%s; the log is kept and excluded from GC and compaction", scanner.error)

    def _load_indexes(self) -> None:
        for dir_idx, current in enumerate(self._currents):
            index_root = current / "index"
            for sub in sorted(os.listdir(index_root)):
                subdir = index_root / sub
                if not subdir.is_dir():
                    continue
                for name in sorted(os.listdir(subdir)):
                    if not name.endswith(".idx"):
                        continue
                    self._load_index(dir_idx, subdir / name)

    def _load_index(self, dir_idx: int, path: Path) -> None:
        header, size = read_header(path)
        if path.name != f"{header.ledger_id:016x}.idx":
            raise BookieIOError(f"index file {path}: header names ledger {header.ledger_id}")
        if header.page_size != self._page_size:
            raise BookieIOError(
                f"index file {path} uses page_size={header.page_size} but the engine is configured with "
                f"page_size={self._page_size}; configure page_size={header.page_size}"
            )
        other = self._ledgers.get(header.ledger_id)
        if other is not None:
            raise BookieIOError(f"ledger {header.ledger_id} has two index files: {other.path} and {path}")
        led = _Ledger(header.ledger_id, dir_idx, path)
        led.master_key = header.master_key
        led.fenced = header.fenced
        led.header_dirty = False
        led.file_exists = True
        led.file_pages = max(0, (size - INDEX_HEADER_SIZE + self._page_size - 1) // self._page_size)
        led.last = self._last_valid_entry(path, size)
        self._ledgers[header.ledger_id] = led

    def _last_valid_entry(self, path: Path, size: int) -> int:
        """The highest entry whose slot points inside an existing log. Slots beyond that were
        written (by a cache eviction) for entries whose log data a machine crash lost; the
        journal replays those entries, so they must not count as stored."""
        for page_no, slots in read_last_pages(path, size, self._page_size):
            for i in range(len(slots) - 1, -1, -1):
                v = slots[i]
                if v:
                    v -= 1
                    lg = self._logs.get(v >> 32)
                    if lg is not None and (v & _OFFSET_MASK) + RECORD_HEADER_SIZE <= lg.written:
                        return page_no * self._spp + i
        return -1

    def close(self) -> None:
        """Flush, write the ledger maps of the active logs and release every file. Idempotent."""
        self._stop.set()
        self._sync_wake.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        if self._syncer is not None:
            self._syncer.join()
        with self._flush_mutex:
            if self._closed or not self._opened:
                self._closed = True
                return
            try:
                self._flush_locked()
                with self._lock:
                    for i, lg in enumerate(self._active):
                        if lg is not None:
                            lg.finish()
                            self._write_ledger_map(lg)
                            self._active[i] = None
                    logs = [lg for lg in self._logs.values() if lg.unsynced]
                    maps, self._maps_to_sync = self._maps_to_sync, set()
                    dirs, self._dirs_to_sync = self._dirs_to_sync, set()
                for lg in logs:
                    lg.fsync()
                for p in maps:
                    fsync_file(p)
                for d in dirs:
                    fsync_dir(d)
            finally:
                with self._lock:
                    self._closed = True
                    for lg in self._logs.values():
                        lg.close()

    def _check_open(self) -> None:
        if self._closed or not self._opened:
            raise BookieIOError(
                f"entrylog storage over {', '.join(map(str, self.ledger_dirs))} is "
                + ("closed" if self._closed else "not open; call open() first")
            )

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_interval):
            try:
                self.flush()
            except BookieIOError:
                if self._closed:
                    return
                log.exception("background flush of the entrylog storage failed; stopping background flushes")
                return

    def _note_written(self, lg: EntryLog) -> None:
        """Queue ``lg`` for a background sync once enough of it has been written. Lock held."""
        if not self._sync_bytes or lg.written - lg.synced_to < self._sync_bytes:
            return
        if lg.log_id not in self._sync_queue:
            self._sync_queue[lg.log_id] = lg
            self._sync_wake.set()

    def _sync_loop(self) -> None:
        """Write-back thread: fdatasync the logs :meth:`_note_written` queued."""
        while True:
            self._sync_wake.wait()
            self._sync_wake.clear()
            if self._stop.is_set():
                return
            jobs: list[tuple[EntryLog, int, int]] = []
            try:
                with self._lock:
                    queued, self._sync_queue = self._sync_queue, {}
                    for lg in queued.values():
                        # GC and compaction take a log out of _logs under this lock before they
                        # close and delete it, and close() closes logs under it: a log still in
                        # _logs here is open and its file exists until the lock is released. A
                        # descriptor of our own cannot be closed or reused under the sync, and
                        # an error the sync meets is still reported to the checkpoint's fsync
                        # through the log's descriptor (errors are tracked per open file).
                        if self._closed or self._logs.get(lg.log_id) is not lg or lg.fd < 0:
                            continue
                        try:
                            fd = os.open(lg.path, os.O_RDONLY | os.O_CLOEXEC)
                        except OSError as exc:
                            # Nothing is lost: the checkpoint still syncs the log.
                            log.warning("write-back skips entry log %s: %s", lg.path, exc)
                            continue
                        jobs.append((lg, fd, lg.written - lg.synced_to))
                        lg.synced_to = lg.written
                for lg, fd, nbytes in jobs:
                    try:
                        os.fdatasync(fd)
                    except OSError as exc:
                        if self._closed:
                            return
                        # What reached the disk is unknown: refuse checkpoints as a failed flush does.
                        msg = f"background fdatasync of entry log {lg.path} failed: {exc}"
                        self._flush_failure = self._flush_failure or msg
                        log.error("%s; write-back stopped and the next flush() will fail", msg)
                        return
                    with self._lock:
                        self._background_syncs += 1
                        self._background_sync_bytes += nbytes
            finally:
                for _, fd, _ in jobs:
                    os.close(fd)

    # --- ledger state ----------------------------------------------------------------------------

    def _get_or_create(self, ledger_id: int) -> _Ledger:
        led = self._ledgers.get(ledger_id)
        if led is None:
            if not 0 <= ledger_id <= _MAX_ID:
                raise InvalidArgumentError(f"ledger id {ledger_id} is outside 0..2**63-1")
            dir_idx = ledger_id % len(self._currents)
            led = _Ledger(ledger_id, dir_idx, index_path(self._currents[dir_idx], ledger_id))
            self._ledgers[ledger_id] = led
            self._dirty_ledgers.add(ledger_id)
        return led

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Record the master key; the same key again is a no-op, another key is refused with
        UnauthorizedAccessError."""
        if len(master_key) > MAX_MASTER_KEY:
            raise InvalidArgumentError(f"master key of {len(master_key)} bytes; the limit is {MAX_MASTER_KEY}")
        with self._lock:
            self._check_open()
            led = self._get_or_create(ledger_id)
            if led.master_key is None:
                led.master_key = bytes(master_key)
                led.header_dirty = True
                self._dirty_ledgers.add(ledger_id)
            elif led.master_key != master_key:
                raise UnauthorizedAccessError(
                    f"ledger {ledger_id} already has another master key on this bookie; "
                    "the client's password does not match the one the ledger was created with"
                )

    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The master key, or None for an unknown ledger."""
        with self._lock:
            self._check_open()
            led = self._ledgers.get(ledger_id)
            return led.master_key if led is not None else None

    def set_fenced(self, ledger_id: int) -> bool:
        """Fence the ledger (creating its record if needed); True if it was not fenced before."""
        with self._lock:
            self._check_open()
            led = self._get_or_create(ledger_id)
            if led.fenced:
                return False
            led.fenced = True
            led.header_dirty = True
            self._dirty_ledgers.add(ledger_id)
            return True

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether the ledger is fenced (False for an unknown ledger)."""
        with self._lock:
            self._check_open()
            led = self._ledgers.get(ledger_id)
            return led is not None and led.fenced

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether the ledger is stored here."""
        with self._lock:
            self._check_open()
            return ledger_id in self._ledgers

    def list_ledgers(self) -> Iterator[int]:
        """Ids of every stored ledger, ascending (a snapshot)."""
        with self._lock:
            self._check_open()
            ids = sorted(self._ledgers)
        return iter(ids)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored, -1 if none; NoSuchLedgerError for an unknown ledger."""
        with self._lock:
            self._check_open()
            led = self._ledgers.get(ledger_id)
            if led is None:
                raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie")
            return led.last

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's index file and cached pages; GC reclaims its log space later.
        Deleting an unknown ledger is a no-op."""
        with self._lock:
            self._check_open()
            led = self._ledgers.pop(ledger_id, None)
            if led is None:
                return
            for page_no in led.pages:
                del self._lru[(ledger_id, page_no)]
            led.pages.clear()
            led.cur_no, led.cur_page = -1, None
            self._dirty_ledgers.discard(ledger_id)
            self._unsynced_index.discard(led.path)
            if led.file_exists:
                _unlink(led.path)
                # GC fsyncs this directory before deleting any log, so a deleted ledger can
                # never come back after a crash pointing at a log that is gone.
                self._dirs_to_sync.add(led.path.parent)

    # --- add / read ------------------------------------------------------------------------------

    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Append the entry to the active log's buffer and point the ledger's index slot at it.
        Re-adding an entry stores a new copy and moves the slot to it."""
        if not 0 <= entry_id <= _MAX_ID or not 0 <= ledger_id <= _MAX_ID:
            raise InvalidArgumentError(f"entry ({ledger_id}, {entry_id}) is outside 0..2**63-1")
        ids = RECORD_IDS.pack(ledger_id, entry_id)
        crc = crc32c(data, crc32c(ids))
        with self._lock:
            if self._closed or not self._opened:
                self._check_open()
            led = self._ledgers.get(ledger_id)
            if led is None:
                led = self._get_or_create(ledger_id)
            loc = self._append(led.dir_idx, ledger_id, ids, data, crc)
            self._set_slot(led, entry_id, loc + 1)
            if entry_id > led.last:
                led.last = entry_id
            self._entries_written += 1

    def _append(self, dir_idx: int, ledger_id: int, ids: bytes, data: Any, crc: int) -> int:
        """Buffer one record in the directory's active log; returns its location. Lock held."""
        lg = self._active[dir_idx]
        n = len(data)
        rec = RECORD_HEADER_SIZE + n
        if lg is None:
            lg = self._roll(dir_idx)
        else:
            size = lg.written + len(lg.buf)  # type: ignore[arg-type]
            if size + rec > self._log_limit and size > LOG_HEADER_SIZE:
                lg = self._roll(dir_idx)
        buf = lg.buf
        assert buf is not None
        off = lg.written + len(buf)
        buf += RECORD_LEN_CRC.pack(n, crc)
        buf += ids
        buf += data
        if len(buf) >= self._wbs:
            lg.write_out()
            self._note_written(lg)
        m = lg.ledgers
        m[ledger_id] = m.get(ledger_id, 0) + rec
        lg.total += rec
        return (lg.log_id << 32) | off

    def _roll(self, dir_idx: int) -> EntryLog:
        """Finish the directory's active log (if any) and start a new one. Lock held."""
        old = self._active[dir_idx]
        if old is not None:
            old.finish()
            self._note_written(old)
            self._write_ledger_map(old)
        log_id = self._next_log_id
        if log_id > _OFFSET_MASK:
            raise BookieIOError("entry log ids are exhausted (2**32 logs); the ledger directories need a reset")
        lg = EntryLog.create(log_id, dir_idx, self._currents[dir_idx])
        self._next_log_id = log_id + 1
        self._logs[log_id] = lg
        self._active[dir_idx] = lg
        self._dirs_to_sync.add(self._currents[dir_idx])
        return lg

    def _write_ledger_map(self, lg: EntryLog) -> None:
        """Write the ledger map beside a finished log (fsynced by the next flush). Lock held."""
        path = lg.path.with_suffix(".lmap")
        try:
            with open(path, "wb") as f:
                f.write(encode_ledger_map(lg.log_id, lg.total, lg.ledgers))
        except OSError as exc:
            # The map only saves a scan at open; without it nothing is lost.
            log.warning("could not write ledger map %s: %s", path, exc)
            return
        self._maps_to_sync.add(path)
        self._dirs_to_sync.add(path.parent)

    def _set_slot(self, led: _Ledger, entry_id: int, value: int) -> None:
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

    def _slot(self, led: _Ledger, entry_id: int) -> int:
        page_no, slot = divmod(entry_id, self._spp)
        page = led.cur_page if led.cur_no == page_no else self._page(led, page_no)
        assert page is not None
        return page.slots[slot]

    def _page(self, led: _Ledger, page_no: int) -> _Page:
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
        page = _Page(led.ledger_id, page_no, slots)
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

    def _write_ledger_pages(self, led: _Ledger, pages: list[tuple[int, array]], keep_open: bool) -> int:
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

    def add_entries(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """Append the entries to the active log's buffer and point their index slots at them,
        holding the lock once for the whole batch. Records, rolls, buffer writes and index slots
        are exactly those of :meth:`add_entry` called for each entry in order. Every id is checked
        before anything is stored, so an out-of-range id stores nothing of the batch."""
        if not entries:
            return
        if not 0 <= ledger_id <= _MAX_ID:
            raise InvalidArgumentError(f"entry ({ledger_id}, {entries[0][0]}) is outside 0..2**63-1")
        pack_ids = RECORD_IDS.pack
        pack_head = RECORD_LEN_CRC.pack
        # Checksums and record headers are computed before taking the lock, as add_entry does.
        records: list[tuple[int, bytes, Any, int]] = []
        for entry_id, data in entries:
            if not 0 <= entry_id <= _MAX_ID:
                raise InvalidArgumentError(f"entry ({ledger_id}, {entry_id}) is outside 0..2**63-1")
            ids = pack_ids(ledger_id, entry_id)
            n = len(data)
            head = pack_head(n, crc32c(data, crc32c(ids))) + ids
            records.append((entry_id, head, data, RECORD_HEADER_SIZE + n))
        limit = self._log_limit
        wbs = self._wbs
        spp = self._spp
        set_slot = self._set_slot
        with self._lock:
            if self._closed or not self._opened:
                self._check_open()
            led = self._ledgers.get(ledger_id)
            if led is None:
                led = self._get_or_create(ledger_id)
            dir_idx = led.dir_idx
            lg = self._active[dir_idx]
            if lg is None:
                lg = self._roll(dir_idx)
            base = lg.log_id << 32
            # size: bytes in lg, buffered ones included (write_out moves bytes from the buffer
            # to ``written`` without changing the sum); segment: size when this batch began
            # appending to lg, so size - segment is what lg's ledger map has yet to count.
            size = segment = lg.size
            last = led.last
            stored = 0
            # The index page the previous entry went to. While entries stay on it, its slots
            # are set directly: set_slot already made it dirty and cached it, and nothing can
            # clean or evict it before the lock is released, except our own set_slot calls.
            cur_no = -1
            slots = None
            try:
                for entry_id, head, data, rec in records:
                    if size + rec > limit and size > LOG_HEADER_SIZE:
                        # The finished log's ledger map is written by _roll: count its bytes first.
                        if size > segment:
                            _account(lg, ledger_id, size - segment)
                            segment = size  # nothing more to count if _roll fails
                        lg = self._roll(dir_idx)
                        base = lg.log_id << 32
                        size = segment = lg.size
                    # Re-read each time: write_out(), here or by a cache eviction in set_slot,
                    # replaces the buffer object.
                    buf = lg.buf
                    assert buf is not None
                    buf += head
                    buf += data
                    if len(buf) >= wbs:
                        lg.write_out()
                        self._note_written(lg)
                    # Record first, slot second: an eviction inside set_slot writes the log
                    # buffer out before the page, so the index never points past the log's data.
                    page_no, slot = divmod(entry_id, spp)
                    if page_no == cur_no:
                        slots[slot] = (base | size) + 1  # type: ignore[index]
                    else:
                        set_slot(led, entry_id, (base | size) + 1)
                        cur_no = page_no
                        slots = led.cur_page.slots  # type: ignore[union-attr]
                    size += rec
                    if entry_id > last:
                        last = entry_id
                    stored += 1
            finally:
                if size > segment:
                    _account(lg, ledger_id, size - segment)
                led.last = last
                self._entries_written += stored

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's data, verified against its record's CRC32C and ids."""
        with self._lock:
            self._check_open()
            led = self._ledgers.get(ledger_id)
            if led is None:
                raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie")
            return self._read_locked(led, entry_id)

    def get_entries(self, ledger_id: int, entry_ids: Sequence[int]) -> list[bytes | BaseException]:
        """The data of each entry, or the error :meth:`get_entry` would raise for it, in the order
        of ``entry_ids``. Under the lock the ids of a block are looked up in the index, then their
        records are read in log and offset order with one ``pread`` per window of nearby records
        (:meth:`EntryLog.read_window`). The lock is released after about every MiB read so adds
        are not held up behind a large batch of reads; ids not read by then are looked up again
        under the next hold, as compaction may have moved their records meanwhile."""
        count = len(entry_ids)
        results: list[Any] = [None] * count
        i = 0  # entry_ids[i:] are not looked up yet
        carry: list[int] = []  # positions looked up under an earlier hold but not read
        seen_bytes = seen_entries = 0
        while i < count or carry:
            with self._lock:
                try:
                    self._check_open()
                    led = self._ledgers.get(ledger_id)
                    if led is None:
                        raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie")
                except LedgerStoreError as exc:
                    failure = exc
                else:
                    budget = _READ_BATCH_BYTES
                    while budget > 0 and (i < count or carry):
                        block: Sequence[int]
                        if carry:
                            block, carry = carry, []
                        else:
                            # As many ids as the rest of the budget is likely to cover, so few
                            # have to be looked up again after the lock is released.
                            avg = seen_bytes // seen_entries + RECORD_HEADER_SIZE if seen_entries else 0
                            want = budget // avg + 1 if avg else _FIRST_BLOCK
                            end = min(count, i + max(1, min(want, _MAX_BLOCK)))
                            block = range(i, end)
                            i = end
                        got, done, carry = self._read_block_locked(led, entry_ids, block, results, budget)
                        budget -= got
                        seen_bytes += got
                        seen_entries += done
                    continue
            # Every remaining id fails the same way; each gets its own instance, as separate
            # get_entry calls would.
            rest = sorted(carry) + list(range(i, count))
            results[rest[0]] = failure
            for pos in rest[1:]:
                results[pos] = type(failure)(str(failure))
            break
        return results

    def _read_block_locked(
        self, led: _Ledger, entry_ids: Sequence[int], block: Sequence[int], results: list[Any], budget: int
    ) -> tuple[int, int, list[int]]:
        """Look up and read the entries at positions ``block`` of ``entry_ids`` into ``results``;
        stops before a window once ``budget`` bytes were read. Returns the bytes read, the number
        of entries read and the positions left unread. Lock held."""
        ledger_id = led.ledger_id
        last = led.last
        spp = self._spp
        page_of = self._page
        cur_no = -1
        slots: Any = None
        # (location, entry id, position): sorting groups them by log and orders them by offset
        locs: list[tuple[int, int, int]] = []
        for pos in block:
            entry_id = entry_ids[pos]
            if entry_id < 0 or entry_id > last:
                results[pos] = NoSuchEntryError(
                    f"entry {entry_id} of ledger {ledger_id} is not stored here (last entry {last})"
                )
                continue
            page_no, slot = divmod(entry_id, spp)
            if page_no != cur_no:
                try:
                    # An evicted page keeps its slots: they stay right while the lock is held.
                    slots = page_of(led, page_no).slots
                except (LedgerStoreError, OSError) as exc:
                    results[pos] = exc
                    continue
                cur_no = page_no
            v = slots[slot]
            if not v:
                results[pos] = NoSuchEntryError(f"entry {entry_id} of ledger {ledger_id} is not stored here")
                continue
            locs.append((v - 1, entry_id, pos))
        locs.sort()
        logs = self._logs
        got = done = 0
        k, n = 0, len(locs)
        while k < n:
            if got >= budget:
                return got, done, sorted(pos for _, _, pos in locs[k:])
            loc, entry_id, pos = locs[k]
            log_id = loc >> 32
            offset = loc & _OFFSET_MASK
            lg = logs.get(log_id)
            written = lg.written if lg is not None else 0
            # The window: following records of the same log, each within _WINDOW_GAP of the one
            # before it and starting within _WINDOW_BYTES of the first. Decided only now, after
            # every page load above (an eviction can move the write buffer to the file).
            j = k + 1
            if lg is not None and offset < written:
                # Locations of one log compare like offsets; the limit also stops at the log's
                # end and at the next log.
                limit = ((log_id << 32) | min(written, offset + _WINDOW_BYTES)) - 1
                prev = loc
                while j < n:
                    nxt = locs[j][0]
                    if nxt > limit or nxt - prev > _WINDOW_GAP:
                        break
                    prev = nxt
                    j += 1
            if j - k > 1:
                length = min((prev & _OFFSET_MASK) + WINDOW_TAIL, written) - offset
                got += lg.read_window(offset, length, ledger_id, locs[k:j], results)  # type: ignore[union-attr]
                done += j - k
            elif lg is None:
                results[pos] = BookieIOError(
                    f"index file {led.path}: entry {entry_id} of ledger {ledger_id} points at entry log "
                    f"{log_id:08x}, which does not exist"
                )
            else:
                # A lone record, or one still in the write buffer: read_record costs no more.
                try:
                    data = lg.read_record(offset, ledger_id, entry_id)
                except (LedgerStoreError, OSError) as exc:
                    results[pos] = exc
                else:
                    results[pos] = data
                    got += len(data)
                    done += 1
            k = j
        return got, done, []

    def _read_locked(self, led: _Ledger, entry_id: int) -> bytes:
        """The verified data of one entry of ``led``. Lock held."""
        ledger_id = led.ledger_id
        if entry_id < 0 or entry_id > led.last:
            raise NoSuchEntryError(
                f"entry {entry_id} of ledger {ledger_id} is not stored here (last entry {led.last})"
            )
        v = self._slot(led, entry_id)
        if not v:
            raise NoSuchEntryError(f"entry {entry_id} of ledger {ledger_id} is not stored here")
        v -= 1
        lg = self._logs.get(v >> 32)
        if lg is None:
            raise BookieIOError(
                f"index file {led.path}: entry {entry_id} of ledger {ledger_id} points at entry log "
                f"{v >> 32:08x}, which does not exist"
            )
        return lg.read_record(v & _OFFSET_MASK, ledger_id, entry_id)

    # --- checkpoint ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Checkpoint: write and fsync the entry logs, then write and fsync every dirty index page
        and header. When it returns, everything added before the call is durable."""
        with self._flush_mutex:
            with self._lock:
                self._check_open()
            if self._flush_failure:
                raise BookieIOError(
                    f"an earlier flush failed ({self._flush_failure}); what is durable is unknown: "
                    "restart the bookie so the journal is replayed"
                )
            try:
                self._flush_locked()
            except BookieIOError as exc:
                self._flush_failure = str(exc)
                raise

    def _flush_locked(self) -> None:
        """The checkpoint itself; the caller holds ``_flush_mutex``."""
        # 1. Entry logs: every record added so far reaches the disk before any index does.
        with self._lock:
            for lg in self._active:
                if lg is not None:
                    lg.write_out()
            logs = [(lg, lg.written) for lg in self._logs.values() if lg.unsynced]
            for lg, written in logs:
                lg.synced_to = max(lg.synced_to, written)
            todo = sorted(self._dirty_ledgers)
            self._dirty_ledgers = set()
            maps, self._maps_to_sync = self._maps_to_sync, set()
            dirs, self._dirs_to_sync = self._dirs_to_sync, set()
        for lg, _ in logs:
            lg.fsync()
        for p in maps:
            fsync_file(p)
        for d in dirs:
            fsync_dir(d)
        with self._lock:
            for lg, written in logs:
                if lg.written == written:
                    lg.unsynced = False
        # 2. Index pages and headers, a chunk of ledgers per hold of the lock; the fsyncs run
        # without it so adds and reads go on meanwhile.
        for start in range(0, len(todo), _FLUSH_LEDGER_CHUNK):
            opened: list[tuple[int, Path]] = []
            try:
                with self._lock:
                    # Pages may have gained slots since step 1: keep their records ahead of them.
                    for lg in self._active:
                        if lg is not None:
                            lg.write_out()
                    for ledger_id in todo[start : start + _FLUSH_LEDGER_CHUNK]:
                        led = self._ledgers.get(ledger_id)
                        if led is None:
                            continue
                        dirty = [pg for pg in led.pages.values() if pg.dirty]
                        if not dirty and led.file_exists and not led.header_dirty:
                            continue
                        fd = self._write_ledger_pages(led, [(pg.page_no, pg.slots) for pg in dirty], keep_open=True)
                        opened.append((fd, led.path))
                        for pg in dirty:
                            pg.dirty = False
                for fd, path in opened:
                    try:
                        os.fsync(fd)
                    except OSError as exc:
                        raise BookieIOError(f"fsync of index file {path} failed: {exc}") from exc
            finally:
                for fd, _ in opened:
                    os.close(fd)
        # 3. Index files written by cache evictions, and directories of created/deleted files.
        with self._lock:
            paths, self._unsynced_index = self._unsynced_index, set()
            dirs, self._dirs_to_sync = self._dirs_to_sync, set()
        for p in paths:
            fsync_file(p)
        for d in dirs:
            fsync_dir(d)

    # --- GC and compaction ----------------------------------------------------------------------

    def gc(self) -> StorageStats:
        """Delete entry logs that hold no live ledger, then run a minor compaction (logs whose
        live fraction is below ``minor_compaction_threshold``)."""
        with self._flush_mutex:
            with self._lock:
                self._check_open()
                self._gc_runs += 1
            self._delete_dead_logs()
            self._compact_locked(self.minor_compaction_threshold)
        return self.stats()

    def compact(self, threshold: float) -> StorageStats:
        """Compact every finished log whose live fraction is below ``threshold`` (the bookie
        passes the minor or the major threshold); logs with no live data are deleted."""
        with self._flush_mutex:
            with self._lock:
                self._check_open()
            self._compact_locked(threshold)
        return self.stats()

    def _delete_dead_logs(self) -> None:
        with self._lock:
            ledgers = self._ledgers
            dead = [
                lg
                for lg in self._logs.values()
                if lg.buf is None and not lg.pinned and not any(lid in ledgers for lid in lg.ledgers)
            ]
            for lg in dead:
                del self._logs[lg.log_id]
            # Index deletions must be durable before the logs they pointed into disappear.
            dirs, self._dirs_to_sync = self._dirs_to_sync, set()
        for d in dirs:
            fsync_dir(d)
        for lg in dead:
            self._remove_log(lg)

    def _remove_log(self, lg: EntryLog) -> None:
        """Close and delete a log no index points into any more. ``_flush_mutex`` held."""
        size = lg.written
        lg.close()
        # Map first, intent last: a crash in between leaves a log without a map (rescanned at
        # open) or an intent that makes the next compaction finish the job.
        _unlink(lg.path.with_suffix(".lmap"))
        _unlink(lg.path)
        _unlink(lg.path.with_suffix(".compacting"))
        fsync_dir(lg.path.parent)
        with self._lock:
            self._maps_to_sync.discard(lg.path.with_suffix(".lmap"))
            self._bytes_reclaimed += size

    def _compact_locked(self, threshold: float) -> None:
        with self._lock:
            candidates: list[tuple[float, EntryLog]] = []
            for lg in self._logs.values():
                if lg.buf is not None or lg.pinned:
                    continue
                if lg.must_compact:
                    candidates.append((-1.0, lg))
                    continue
                if threshold <= 0 or lg.total <= 0:
                    continue
                live = sum(n for lid, n in lg.ledgers.items() if lid in self._ledgers)
                fraction = live / lg.total
                if fraction < threshold:
                    candidates.append((fraction, lg))
        candidates.sort(key=lambda c: c[0])
        for _, lg in candidates:
            self._compact_log(lg)

    def _compact_log(self, lg: EntryLog) -> None:
        """Copy the live entries of ``lg`` into the active log, make the copies durable, point the
        index at them, make the index durable, and only then delete ``lg``."""
        intent = lg.path.with_suffix(".compacting")
        if not lg.must_compact:
            # Marks the log for re-compaction at the next open should a crash interrupt us
            # after some index slots already point at the copies.
            try:
                with open(intent, "wb") as f:
                    os.fsync(f.fileno())
            except OSError as exc:
                raise BookieIOError(f"cannot create compaction intent {intent}: {exc}") from exc
            fsync_dir(intent.parent)
        moved: list[tuple[int, int, int, int]] = []
        scanner = LogScanner(lg.fd, lg.written, lg.path)
        batch: list[ScannedRecord] = []
        batch_bytes = 0
        for rec in scanner:
            batch.append(rec)
            batch_bytes += rec.record_size
            if batch_bytes >= _COMPACT_BATCH_BYTES:
                self._copy_live(lg, batch, moved)
                batch, batch_bytes = [], 0
        if batch:
            self._copy_live(lg, batch, moved)
        if not scanner.clean:
            # Copies made so far are unreferenced garbage; the log stays.
            with self._lock:
                lg.pinned = True
            _unlink(intent)
            log.error("%s; compaction skipped, the log is kept and excluded from GC", scanner.error)
            return
        self._flush_locked()  # the copies are durable ...
        for start in range(0, len(moved), _INDEX_UPDATE_CHUNK):
            with self._lock:
                for ledger_id, entry_id, old, new in moved[start : start + _INDEX_UPDATE_CHUNK]:
                    led = self._ledgers.get(ledger_id)
                    # Skip entries deleted or re-added since they were copied.
                    if led is not None and self._slot(led, entry_id) == old:
                        self._set_slot(led, entry_id, new)
        self._flush_locked()  # ... before the index points at them, and that before the delete.
        with self._lock:
            self._logs.pop(lg.log_id, None)
            self._compactions += 1
        self._remove_log(lg)

    def _copy_live(self, lg: EntryLog, batch: list[ScannedRecord], moved: list[tuple[int, int, int, int]]) -> None:
        """Append the records of ``batch`` that the index still points at to the active logs."""
        base = lg.log_id << 32
        copied = 0
        with self._lock:
            for rec in batch:
                led = self._ledgers.get(rec.ledger_id)
                if led is None:
                    continue
                old = (base | rec.offset) + 1
                if self._slot(led, rec.entry_id) != old:
                    continue
                ids = RECORD_IDS.pack(rec.ledger_id, rec.entry_id)
                new = self._append(led.dir_idx, rec.ledger_id, ids, rec.data, rec.crc) + 1
                moved.append((rec.ledger_id, rec.entry_id, old, new))
                copied += rec.record_size
            self._bytes_compacted += copied

    # --- statistics ------------------------------------------------------------------------------

    def stats(self) -> StorageStats:
        """Ledger count, bytes on disk (logs incl. buffered bytes, index files), counters."""
        with self._lock:
            log_bytes = sum(lg.size for lg in self._logs.values())
            index_bytes = sum(
                INDEX_HEADER_SIZE + led.file_pages * self._page_size
                for led in self._ledgers.values()
                if led.file_exists
            )
            dirty = sum(1 for p in self._lru.values() if p.dirty)
            return StorageStats(
                ledgers=len(self._ledgers),
                bytes_on_disk=log_bytes + index_bytes,
                entries_written=self._entries_written,
                gc_runs=self._gc_runs,
                bytes_reclaimed=self._bytes_reclaimed,
                extra={
                    "entry_logs": len(self._logs),
                    "entry_log_bytes": log_bytes,
                    "index_bytes": index_bytes,
                    "cache_pages": len(self._lru),
                    "cache_dirty_pages": dirty,
                    "cache_limit_pages": self._max_pages,
                    "dirty_evictions": self._dirty_evictions,
                    "compactions": self._compactions,
                    "bytes_compacted": self._bytes_compacted,
                    "pinned_logs": sum(1 for lg in self._logs.values() if lg.pinned),
                    "background_syncs": self._background_syncs,
                    "background_sync_bytes": self._background_sync_bytes,
                },
            )


def _account(lg: EntryLog, ledger_id: int, nbytes: int) -> None:
    """Count ``nbytes`` of records of ``ledger_id`` in the log's ledger map. Lock held."""
    m = lg.ledgers
    m[ledger_id] = m.get(ledger_id, 0) + nbytes
    lg.total += nbytes


def _positive_int(opts: dict[str, Any], key: str) -> int:
    value = opts[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"entrylog storage: option {key}={value!r} must be a positive integer")
    return value


def _non_negative_int(opts: dict[str, Any], key: str) -> int:
    value = opts[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"entrylog storage: option {key}={value!r} must be a non-negative integer (0: off)")
    return value


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise BookieIOError(f"cannot delete {path}: {exc}") from exc
