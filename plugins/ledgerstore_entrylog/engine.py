"""``EntryLogStorage``: BookKeeper's interleaved ledger storage.

Entries of all ledgers are appended to entry logs (one active log per ledger directory); each
ledger has an index file mapping entry ids to log locations, whose pages live in a bounded ledger
cache. ``flush()`` is the checkpoint: entry logs are written and fsynced first, then index pages
and headers are written and fsynced, so a durable index never points at data that is not durable.
GC deletes logs that hold no live ledger; compaction copies the live entries of sparse logs
forward. ``docs/storage-entrylog.md`` describes the files and the crash-safety argument.

The engine is in parts: this module opens, closes and adds; the entry logs themselves are
:mod:`~ledgerstore_entrylog.entrylog`, the index pages and their cache
:mod:`~ledgerstore_entrylog.ledger_cache`, reads :mod:`~ledgerstore_entrylog.reads`, the checkpoint
and write-back :mod:`~ledgerstore_entrylog.writeback`, GC and compaction
:mod:`~ledgerstore_entrylog.compactor`. The parts are mixins over one state and one lock, so the
locking below holds across them unchanged.

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
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore_entrylog.compactor import Compaction
from ledgerstore_entrylog.entrylog import EntryLog, LogScanner
from ledgerstore_entrylog.format import (
    INDEX_HEADER_SIZE,
    LOG_HEADER_SIZE,
    MAX_ID,
    MAX_MASTER_KEY,
    OFFSET_MASK,
    RECORD_HEADER_SIZE,
    RECORD_IDS,
    RECORD_LEN_CRC,
    append_run,
    decode_ledger_map,
    encode_ledger_map,
    parse_log_file_name,
    record_heads,
)
from ledgerstore_entrylog.index import (
    fsync_dir,
    fsync_file,
    read_header,
    read_last_pages,
    remove_file,
)
from ledgerstore_entrylog.ledger_cache import CachedLedger, IndexPage, LedgerCache
from ledgerstore_entrylog.reads import Reads
from ledgerstore_entrylog.writeback import WriteBack

__all__ = ["EntryLogStorage"]

log = logging.getLogger(__name__)

_MiB = 1024 * 1024
_DEFAULTS: dict[str, Any] = {
    # BookKeeper's entry logger buffers 64 KiB: the buffer goes to the file in one pwrite on the
    # add path (the bookie's event loop), and a 4 MiB one held the loop for 10-45 ms every few
    # seconds at 10,000 adds/s (docs/performance.md, "Latency")
    "write_buffer_size": 256 * 1024,
    "entry_log_size_limit": 1024 * _MiB,
    "page_size": 8192,
    "page_limit_bytes": 64 * _MiB,
    "minor_compaction_threshold": 0.2,
    "major_compaction_threshold": 0.8,
    "flush_interval": 0.0,
    # each background fdatasync is short (a few ms), so a journal fsync queued behind it on the
    # same disk waits little
    "flush_entrylog_bytes": 1 * _MiB,
}


class EntryLogStorage(Reads, WriteBack, Compaction, LedgerCache, StorageEngine):
    """Interleaved entry logs + per-ledger index files + a bounded ledger cache.

    Options (all optional): ``write_buffer_size`` (bytes buffered per active log before a write,
    256 KiB), ``entry_log_size_limit`` (roll size, 1 GiB, at most 4 GiB), ``page_size`` (index page
    size, 8 KiB, a multiple of 8), ``page_limit_bytes`` (ledger cache bound, 64 MiB),
    ``minor_compaction_threshold`` (used by :meth:`gc`, 0.2), ``major_compaction_threshold``
    (0.8, for the bookie's major compaction runs through :meth:`compact`), ``flush_interval``
    (seconds between background flushes, 0 = only when the bookie calls :meth:`flush`),
    ``flush_entrylog_bytes`` (a background thread fdatasyncs an entry log each time this many
    bytes have been written to it since its last sync, 1 MiB; 0 = only the checkpoint syncs).
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
        self._ledgers: dict[int, CachedLedger] = {}
        self._logs: dict[int, EntryLog] = {}
        self._active: list[EntryLog | None] = [None] * len(self._currents)
        self._next_log_id = 0
        self._lru: OrderedDict[tuple[int, int], IndexPage] = OrderedDict()
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
                    remove_file(current / name)  # left by a crash while its log was being deleted
                elif name.endswith(".compacting"):
                    log_id = parse_log_file_name(name[: -len(".compacting")] + ".log")
                    if log_id is not None and log_id in self._logs:
                        # An interrupted compaction: some index slots may already point at the
                        # copies. Compacting the log again settles it either way.
                        self._logs[log_id].must_compact = True
                    else:
                        remove_file(current / name)
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
        if path.stat().st_size == 0:
            # Created by a checkpoint that never wrote its header (a crash, or a full disk and
            # then a crash): no checkpoint covered it, so the journal still holds what it was for.
            log.warning("removing empty index file %s, left by a checkpoint that never finished", path)
            path.unlink()
            return
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
        led = CachedLedger(header.ledger_id, dir_idx, path)
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
                    if lg is not None and (v & OFFSET_MASK) + RECORD_HEADER_SIZE <= lg.written:
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

    # --- ledger state ----------------------------------------------------------------------------

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
                remove_file(led.path)
                # GC fsyncs this directory before deleting any log, so a deleted ledger can
                # never come back after a crash pointing at a log that is gone.
                self._dirs_to_sync.add(led.path.parent)

    # --- adds ----------------------------------------------------------------------------------

    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Append the entry to the active log's buffer and point the ledger's index slot at it.
        Re-adding an entry stores a new copy and moves the slot to it."""
        if not 0 <= entry_id <= MAX_ID or not 0 <= ledger_id <= MAX_ID:
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
        if log_id > OFFSET_MASK:
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

    def add_entries(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """Append the entries to the active log's buffer and point their index slots at them,
        holding the lock once for the whole batch. Records, rolls, buffer writes and index slots
        are exactly those of :meth:`add_entry` called for each entry in order. Every id is checked
        before anything is stored, so an out-of-range id stores nothing of the batch."""
        if not entries:
            return
        if not 0 <= ledger_id <= MAX_ID:
            raise InvalidArgumentError(f"entry ({ledger_id}, {entries[0][0]}) is outside 0..2**63-1")
        # Checksums and record headers are computed before taking the lock, as add_entry does.
        records = record_heads(ledger_id, entries)
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
            # The index page the previous entry went to. While entries stay on it, its slots
            # are set directly: set_slot already made it dirty and cached it, and nothing can
            # clean or evict it before the lock is released, except our own set_slot calls.
            cur_no = -1
            slots = None
            fast = append_run()
            n = len(records)
            i = 0
            try:
                while i < n:
                    if fast is not None and slots is not None:
                        # the common case, compiled: same page, no roll, no buffer write
                        i, size, last = fast(records, i, lg.buf, size, limit, wbs, base, spp, cur_no, slots, last)
                        if i == n:
                            break
                    entry_id, head, data, rec = records[i]
                    if size + rec > limit and size > LOG_HEADER_SIZE:
                        # The finished log's ledger map is written by _roll: count its bytes first.
                        if size > segment:
                            lg.account(ledger_id, size - segment)
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
                    i += 1
            finally:
                if size > segment:
                    lg.account(ledger_id, size - segment)
                led.last = last
                self._entries_written += i

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

