"""The ``rocksdb`` storage engine: a bookie's ledgers in one RocksDB database (through rocksdict).

Durability: the bookie journal is the write-ahead log of every add, fence and master key, and it is
replayed into the engine after a crash. So by default the engine writes with RocksDB's own WAL
disabled (an add is a memtable insert, no syscall) and ``flush()`` flushes the memtables to SST
files and waits: RocksDB syncs each new SST file and the MANIFEST that names it before the flush
returns. With ``wal=True`` the WAL is written and ``flush()`` syncs it instead. Deleting a ledger is
not replayed by anyone, so a delete is always written through the WAL and synced before it returns.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rocksdict import (
    BlockBasedOptions,
    BottommostLevelCompaction,
    Cache,
    CompactOptions,
    DbClosedError,
    DBCompressionType,
    Rdict,
    WriteBatch,
    WriteOptions,
)
from rocksdict import Options as RocksOptions

from ledgerstore.api import StorageEngine, StorageStats
from ledgerstore.errors import (
    BookieIOError,
    ConfigError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore_rocksdb.config import RocksDBConfig
from ledgerstore_rocksdb.format import (
    GC_PREFIX,
    MAX_ENTRY_ID,
    STATE_PREFIX,
    LedgerState,
    decode_record,
    decode_state,
    deletion_runs,
    encode_entries,
    encode_record,
    encode_state,
    entry_key,
    entry_range,
    gc_key,
    ledger_key,
    split_entry_key,
    split_ledger_key,
)

__all__ = ["RocksDBStorage"]

log = logging.getLogger(__name__)

_EMPTY_STATE = LedgerState()


def _dir_size(path: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:  # RocksDB deletes obsolete files concurrently with this scan
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total


class RocksDBStorage(StorageEngine):
    """Ledger storage in RocksDB under ``ledger_dirs[0] / "rocksdb"``.

    Only the first ledger directory is used: one database means one memtable flush per checkpoint
    and one compaction scheduler; spreading ledgers over several databases would multiply both
    without using more than the 2-4 cores a bookie has for them. Put the directory on the fastest
    disk, apart from the journal's.

    Options are the fields of :class:`~ledgerstore_rocksdb.config.RocksDBConfig`.
    """

    name = "rocksdb"
    supports_batch_add = True
    supports_compaction = True
    Options = RocksDBConfig

    def __init__(self, ledger_dirs: Sequence[Path], options: RocksDBConfig | None = None, /,
                 **values: Any) -> None:
        """``options``: the ``storage_options`` table as the host parsed it; an engine built in code
        may pass the table as keyword arguments instead (parsed by the same rules)."""
        super().__init__(ledger_dirs, options, **values)
        if not self.ledger_dirs:
            raise ConfigError("the rocksdb storage engine needs at least one ledger directory")
        #: the parsed options (the same object as ``self.options``)
        self.config: RocksDBConfig = self.options
        self.path = self.ledger_dirs[0] / "rocksdb"
        self._db: Rdict | None = None
        self._write_opts = WriteOptions()
        # rocksdict's stub declares disable_wal a method; at run time it is a settable property.
        self._write_opts.disable_wal = not self.config.wal  # type: ignore[method-assign,assignment]
        self._sync_opts = WriteOptions()
        self._sync_opts.sync = True
        self._compression = self.config.compression
        # _lock guards the Python-side state below; RocksDB does its own locking.
        self._lock = threading.Lock()
        self._gc_lock = threading.Lock()
        self._ledgers: dict[int, LedgerState] = {}
        self._pending_gc: set[int] = set()
        self._entries_written = 0
        self._gc_runs = 0
        self._bytes_reclaimed = 0

    # --- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        """Open or create the database and load (verifying each checksum) every ledger's state."""
        with self._lock:
            if self._db is not None:
                return
            if len(self.ledger_dirs) > 1:
                log.info("rocksdb storage uses %s only; other ledger dirs are ignored", self.path)
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BookieIOError(
                    f"cannot create the rocksdb storage directory {self.path}: {exc}"
                ) from exc
            db = self._open_db()
            try:
                ledgers = {split_ledger_key(k): decode_state(k, v) for k, v in self._scan(db, STATE_PREFIX)}
                pending: set[int] = set()
                for k, v in self._scan(db, GC_PREFIX):
                    decode_record(k, v)
                    pending.add(split_ledger_key(k))
            except BaseException:
                db.close()
                raise
            self._ledgers, self._pending_gc, self._db = ledgers, pending, db
            log.info("rocksdb storage open at %s: %d ledgers", self.path, len(ledgers))

    def _open_db(self) -> Rdict:
        names = ["lz4", "none"] if self._compression == "auto" else [self._compression]
        for i, name in enumerate(names):
            try:
                db = Rdict(str(self.path), self._rocks_options(name))
            except Exception as exc:
                message = str(exc)
                about_compression = "compression" in message.lower()
                if i + 1 < len(names) and about_compression:
                    log.info("lz4 is not available in this RocksDB build (%s); storing uncompressed", message)
                    continue
                if about_compression:
                    raise ConfigError(
                        f"rocksdb storage option compression={name!r} is not supported by this RocksDB "
                        f"build: {message}; use compression='none' or 'auto'"
                    ) from exc
                raise BookieIOError(
                    f"cannot open the rocksdb storage at {self.path}: {message}; if another bookie "
                    "process holds its LOCK, stop it first"
                ) from exc
            self._compression = name
            return db
        raise AssertionError("unreachable: the last compression name either opens or raises")

    def _rocks_options(self, compression: str) -> RocksOptions:
        cfg = self.config
        opts = RocksOptions(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_max_background_jobs(cfg.max_background_jobs)
        opts.set_write_buffer_size(cfg.write_buffer_size)
        opts.set_max_write_buffer_number(cfg.max_write_buffer_number)
        opts.set_compression_type(getattr(DBCompressionType, compression)())
        # Spread the page-cache writeback of SST and WAL files instead of one large burst per
        # flush: a burst of dirty pages makes the journal's fdatasync wait behind it.
        opts.set_bytes_per_sync(cfg.bytes_per_sync)
        opts.set_wal_bytes_per_sync(cfg.wal_bytes_per_sync)
        opts.set_keep_log_file_num(5)
        table = BlockBasedOptions()
        if cfg.block_cache_size:
            table.set_block_cache(Cache(cfg.block_cache_size))
        else:
            table.disable_cache()
        if cfg.bloom_bits_per_key:
            table.set_bloom_filter(cfg.bloom_bits_per_key, False)
        opts.set_block_based_table_factory(table)
        return opts

    def close(self) -> None:
        """Flush the memtables, then close the database. Idempotent."""
        with self._gc_lock, self._lock:  # a running GC finishes first
            db, self._db = self._db, None
        if db is None:
            return
        try:
            db.flush(True)
        except Exception as exc:
            raise BookieIOError(
                f"flushing the rocksdb storage at {self.path} on close failed: {exc}"
            ) from exc
        finally:
            db.close()

    def _require_db(self) -> Rdict:
        db = self._db
        if db is None:
            raise BookieIOError(f"the rocksdb storage at {self.path} is not open: call open() first")
        return db

    @staticmethod
    def _scan(db: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        # Bounds are checked here, not with ReadOptions: rocksdict encodes iterate bounds in its
        # non-raw key encoding, which never matches raw keys.
        it = db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()

    # --- per-ledger state -----------------------------------------------------------------

    def _put_state(self, db: Rdict, ledger_id: int, state: LedgerState) -> None:
        """Write a state record; call with ``_lock`` held so records land in the order decided."""
        key = ledger_key(STATE_PREFIX, ledger_id)
        try:
            db.put(key, encode_state(key, state), self._write_opts)
        except Exception as exc:
            raise BookieIOError(f"writing the state of ledger {ledger_id} failed: {exc}") from exc
        self._ledgers[ledger_id] = state

    def set_master_key(self, ledger_id: int, master_key: bytes) -> None:
        """Record the ledger's master key. The same key again is a no-op; another key than the one
        recorded raises UnauthorizedAccessError (a ledger's key never changes)."""
        master_key = bytes(master_key)
        with self._lock:
            db = self._require_db()
            state = self._ledgers.get(ledger_id, _EMPTY_STATE)
            if state.master_key == master_key:
                return
            if state.master_key is not None:
                raise UnauthorizedAccessError(
                    f"ledger {ledger_id} already has another master key on this bookie; "
                    "the request's password does not match the ledger's"
                )
            self._put_state(db, ledger_id, state._replace(master_key=master_key))

    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The master key, or None when the ledger is unknown here (or was fenced before any key)."""
        state = self._ledgers.get(ledger_id)
        return None if state is None else state.master_key

    def set_fenced(self, ledger_id: int) -> bool:
        """Mark the ledger fenced (creating its state if unknown). True if it was not fenced."""
        with self._lock:
            db = self._require_db()
            state = self._ledgers.get(ledger_id, _EMPTY_STATE)
            if state.fenced and ledger_id in self._ledgers:
                return False
            self._put_state(db, ledger_id, state._replace(fenced=True))
            return True

    def is_fenced(self, ledger_id: int) -> bool:
        """Whether the ledger is fenced (False when unknown)."""
        state = self._ledgers.get(ledger_id)
        return state is not None and state.fenced

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether the engine holds state (a master key, fence or entries) for the ledger."""
        return ledger_id in self._ledgers

    def list_ledgers(self) -> Iterator[int]:
        """Ids of every ledger stored, ascending (a snapshot taken at the call)."""
        with self._lock:
            ids = sorted(self._ledgers)
        return iter(ids)

    # --- entries --------------------------------------------------------------------------

    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Store an entry (overwriting one with the same ids). A ledger not known yet is created
        without a master key, so every ledger with entries is listed."""
        db = self._db
        if db is None:
            db = self._require_db()
        key = entry_key(ledger_id, entry_id)
        value = encode_record(key, data)
        with self._lock:
            if ledger_id not in self._ledgers:
                self._put_state(db, ledger_id, _EMPTY_STATE)
            self._entries_written += 1
        try:
            db.put(key, value, self._write_opts)
        except Exception as exc:
            raise BookieIOError(f"writing ledger {ledger_id} entry {entry_id} failed: {exc}") from exc

    def add_entries(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """Store many entries of one ledger in one RocksDB write batch, with the same records and
        ledger bookkeeping as :meth:`add_entry` for each. Every id is checked before anything is
        written, so an invalid id stores nothing of the batch; the batch itself is atomic."""
        if not entries:
            return
        db = self._db
        if db is None:
            db = self._require_db()
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        for key, value in encode_entries(ledger_id, entries):
            put(key, value)
        with self._lock:
            if ledger_id not in self._ledgers:
                self._put_state(db, ledger_id, _EMPTY_STATE)
            self._entries_written += len(entries)
        try:
            db.write(batch, self._write_opts)
        except Exception as exc:
            raise BookieIOError(
                f"writing {len(entries)} entries of ledger {ledger_id} (entries {entries[0][0]} to "
                f"{entries[-1][0]}) failed: {exc}"
            ) from exc

    def get_entries(self, ledger_id: int, entry_ids: Sequence[int]) -> list[bytes | BaseException]:
        """The stored bytes of each entry (one RocksDB multi-get), or the error :meth:`get_entry`
        would raise for it."""
        count = len(entry_ids)
        if not count:
            return []
        db = self._db
        if db is None:
            try:
                db = self._require_db()
            except BookieIOError as exc:
                return [exc, *(BookieIOError(str(exc)) for _ in range(count - 1))]
        if ledger_id not in self._ledgers:
            message = f"ledger {ledger_id} is not stored on this bookie"
            return [NoSuchLedgerError(message) for _ in range(count)]
        results: list[bytes | BaseException] = [b""] * count
        keys: list[bytes] = []
        positions: list[int] = []
        for i, entry_id in enumerate(entry_ids):
            try:
                keys.append(entry_key(ledger_id, entry_id))
            except InvalidArgumentError as exc:
                results[i] = exc
                continue
            positions.append(i)
        try:
            # rocksdict's stub types multi-get keys as an invariant list of every key type.
            values: list[bytes | None] = db.get(keys)  # type: ignore[arg-type,assignment]
        except Exception as exc:
            for i in positions:
                results[i] = BookieIOError(f"reading ledger {ledger_id} entry {entry_ids[i]} failed: {exc}")
            return results
        for i, key, value in zip(positions, keys, values, strict=True):
            if value is None:
                results[i] = NoSuchEntryError(
                    f"ledger {ledger_id} has no entry {entry_ids[i]} on this bookie"
                )
                continue
            try:
                results[i] = decode_record(key, value)
            except BookieIOError as exc:
                results[i] = exc
        return results

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored bytes of an entry, verified against their checksum (BookieIOError if not)."""
        db = self._db
        if db is None:
            db = self._require_db()
        if ledger_id not in self._ledgers:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie")
        if not 0 <= entry_id <= MAX_ENTRY_ID:  # no such entry can be stored; refuse before building a key
            raise NoSuchEntryError(f"ledger {ledger_id} has no entry {entry_id}: entry ids are in [0, 2**64)")
        key = entry_key(ledger_id, entry_id)
        try:
            value = db.get(key)
        except Exception as exc:
            raise BookieIOError(f"reading ledger {ledger_id} entry {entry_id} failed: {exc}") from exc
        if value is None:
            raise NoSuchEntryError(f"ledger {ledger_id} has no entry {entry_id} on this bookie")
        return decode_record(key, value)

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored for the ledger (a reverse seek from the top of its key range),
        -1 if none."""
        db = self._require_db()
        if ledger_id not in self._ledgers:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie")
        it = db.iter()
        it.seek_for_prev(entry_key(ledger_id, MAX_ENTRY_ID))
        if not it.valid():
            return -1
        key = it.key()
        if key[:9] != entry_range(ledger_id)[0]:
            return -1
        return split_entry_key(key)[1]

    # --- deletion, flush, GC --------------------------------------------------------------

    def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger now (durably: nothing replays a delete) and leave a marker so the next
        ``gc()`` compacts its key range, even after a restart. Unknown ledgers are a no-op."""
        with self._lock:
            db = self._require_db()
            if ledger_id not in self._ledgers:
                return
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(*entry_range(ledger_id))
            batch.delete(ledger_key(STATE_PREFIX, ledger_id))
            marker = gc_key(ledger_id)
            batch.put(marker, encode_record(marker, b""))
            try:
                db.write(batch, self._sync_opts)
            except Exception as exc:
                raise BookieIOError(f"deleting ledger {ledger_id} failed: {exc}") from exc
            del self._ledgers[ledger_id]
            self._pending_gc.add(ledger_id)

    def flush(self) -> None:
        """Make everything added before the call durable: flush the memtables to synced SST files
        (default), or sync the WAL (``wal=True``)."""
        db = self._require_db()
        try:
            if self.config.wal:
                db.flush_wal(True)
            else:
                db.flush(True)
        except Exception as exc:
            raise BookieIOError(f"flushing the rocksdb storage at {self.path} failed: {exc}") from exc

    def compact(self, threshold: float) -> StorageStats:
        """RocksDB compacts on its own as it writes; what is left to reclaim is the key ranges of
        deleted ledgers, which :meth:`gc` compacts. ``threshold`` is not used: RocksDB does not
        keep a live fraction per file."""
        with self._lock:
            pending = bool(self._pending_gc)
        return self.gc() if pending else self.stats()

    def gc(self) -> StorageStats:
        """Compact the key ranges of ledgers deleted since the last GC, so their bytes leave the
        disk, and account the bytes reclaimed (directory size before minus after)."""
        with self._gc_lock:
            db = self._require_db()
            with self._lock:
                pending = sorted(self._pending_gc)
                live = sorted(self._ledgers)
            if not pending:
                with self._lock:
                    self._gc_runs += 1
                return self.stats()
            try:
                db.flush(True)  # so "before" counts the memtable's bytes too
                before = _dir_size(self.path)
                with self._lock:  # a ledger re-created since the snapshot keeps its new entries
                    batch = WriteBatch(raw_mode=True)
                    for ledger_id in pending:
                        if ledger_id not in self._ledgers:
                            # entries added while the delete ran would otherwise outlive it
                            batch.delete_range(*entry_range(ledger_id))
                        batch.delete(gc_key(ledger_id))
                    db.write(batch, self._write_opts)
                compact = CompactOptions()
                compact.set_bottommost_level_compaction(BottommostLevelCompaction.force_optimized())
                for first, last in deletion_runs(pending, live):
                    db.compact_range(entry_range(first)[0], entry_range(last)[1], compact)
                after = _dir_size(self.path)
            except Exception as exc:
                raise BookieIOError(f"GC of the rocksdb storage at {self.path} failed: {exc}") from exc
            with self._lock:
                self._pending_gc.difference_update(pending)
                self._gc_runs += 1
                self._bytes_reclaimed += max(0, before - after)
            log.info(
                "rocksdb storage GC: compacted %d deleted ledgers, %d -> %d bytes on disk",
                len(pending),
                before,
                after,
            )
        return self.stats()

    def stats(self) -> StorageStats:
        """Ledger count, size of the database directory, and counters since open."""
        db = self._db
        extra: dict[str, Any] = {
            "path": str(self.path),
            "compression": self._compression,
            "wal": self.config.wal,
        }
        keys: int | None = None
        if db is not None:
            try:
                extra["estimate_live_data_size"] = db.property_int_value("rocksdb.estimate-live-data-size")
                extra["l0_files"] = db.property_int_value("rocksdb.num-files-at-level0")
                keys = db.property_int_value("rocksdb.estimate-num-keys")
            except DbClosedError:  # closed by another thread meanwhile: report without them
                pass
        with self._lock:
            extra["pending_gc"] = len(self._pending_gc)
            return StorageStats(
                # RocksDB's estimate of its keys, less one state key per ledger and one per
                # pending deletion: the entries (BookKeeper's entries-count is this estimate too)
                entries=None if keys is None else max(0, keys - len(self._ledgers) - len(self._pending_gc)),
                ledgers=len(self._ledgers),
                bytes_on_disk=_dir_size(self.path),
                entries_written=self._entries_written,
                gc_runs=self._gc_runs,
                bytes_reclaimed=self._bytes_reclaimed,
                extra=extra,
            )

