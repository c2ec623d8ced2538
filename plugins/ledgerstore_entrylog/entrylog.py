"""Entry log files: append-only files of (ledger, entry, data) records behind a write buffer.

One :class:`EntryLog` is one file. While it is a ledger directory's active log it owns a write
buffer; appends only touch that buffer, and the buffer reaches the file in one ``pwrite`` when it
is full, when the engine flushes, or before an index page that may point into it is written.
Reading a record verifies its checksum and its ledger and entry ids; :meth:`EntryLog.read_window`
reads many nearby records with one ``pread``. :class:`LogScanner` walks a
log record by record (ledger-map rebuild and compaction) and tells a torn tail from corruption.

Callers serialise access (the engine's lock); nothing here locks.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from crc32c import crc32c

from ledgerstore.api import StorageFile, StorageFiles
from ledgerstore.errors import BookieIOError, storage_write_error
from ledgerstore.stalls import peaks
from ledgerstore_entrylog.format import (
    LOG_HEADER_SIZE,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    cut_records,
    decode_log_header,
    encode_log_header,
    log_file_name,
    record_crc,
)
from ledgerstore_entrylog.index import pwrite_all

__all__ = ["CLOSED", "EntryLog", "LogScanner", "ScannedRecord"]

# First read of a record: header plus this much data, so small entries cost one pread.
_FIRST_READ = 4096
#: what a window read should reach past the start of its last record (see read_window)
WINDOW_TAIL = _FIRST_READ
_SCAN_CHUNK = 4 * 1024 * 1024


class _ClosedFile:
    """What a closed log's ``file`` is: every operation fails with EBADF, as on a closed descriptor."""

    __slots__ = ()

    def _fail(self, *args: object) -> Any:
        raise OSError(errno.EBADF, "the entry log is closed")

    pread = pwrite = sync = datasync = size = truncate = _fail

    def cold(self, offset: int) -> bool:
        return False

    def close(self) -> None:
        """Already closed."""


#: the file of a closed log
CLOSED: StorageFile = _ClosedFile()


class EntryLog:
    """One entry log file and, while active, its write buffer."""

    __slots__ = (
        "log_id",
        "dir_idx",
        "path",
        "file",
        "written",
        "buf",
        "ledgers",
        "total",
        "unsynced",
        "synced_to",
        "pinned",
        "must_compact",
        "map_end",
    )

    def __init__(self, log_id: int, dir_idx: int, path: Path, file: StorageFile, written: int) -> None:
        self.log_id = log_id
        self.dir_idx = dir_idx
        self.path = path
        #: the open file (through the engine's file port); :data:`CLOSED` once closed
        self.file = file
        #: bytes of the file that have reached the OS (the buffer continues from here)
        self.written = written
        #: write buffer; None once the log is no longer active
        self.buf: bytearray | None = None
        #: record bytes per ledger: what GC and compaction use to estimate live data
        self.ledgers: dict[int, int] = {}
        self.total = 0
        #: written since the last fsync
        self.unsynced = False
        #: file offset up to which a sync (background or checkpoint) has been started; the
        #: engine's write-back syncs the log once ``written - synced_to`` reaches its threshold
        self.synced_to = written
        #: the log could not be scanned cleanly: never deleted or compacted automatically
        self.pinned = False
        #: a compaction of this log was interrupted: compact it before anything else
        self.must_compact = False
        #: where the scan that built :attr:`ledgers` stopped, when that was before the end of the
        #: file (a torn tail, or a record length read with a flipped bit): ledgers past it are
        #: missing from the map, so GC and compaction look in the index before deleting the log.
        #: None: the map covers the whole log
        self.map_end: int | None = None

    @classmethod
    def create(cls, files: StorageFiles, log_id: int, dir_idx: int, current: Path) -> EntryLog:
        """Create a new, empty, active log; its header goes out with the first buffer write."""
        path = current / log_file_name(log_id)
        try:
            file = files.open(path, create=True, exclusive=True)
        except OSError as exc:
            raise storage_write_error(f"cannot create entry log {path}", exc) from exc
        log = cls(log_id, dir_idx, path, file, 0)
        log.buf = bytearray(encode_log_header(log_id))
        log.unsynced = True
        return log

    @classmethod
    def open_existing(cls, files: StorageFiles, log_id: int, dir_idx: int, path: Path) -> EntryLog:
        """Open a finished log for reading; BookieIOError if its header is damaged. A file shorter
        than a header is a log created just before a crash that never received data."""
        try:
            file = files.open(path)
        except OSError as exc:
            raise BookieIOError(f"cannot open entry log {path}: {exc}") from exc
        try:
            size = file.size()
            if size >= LOG_HEADER_SIZE:
                found = decode_log_header(file.pread(LOG_HEADER_SIZE, 0), path)
                if found != log_id:
                    raise BookieIOError(f"entry log {path}: header says log id {found}, name says {log_id}")
        except OSError as exc:
            file.close()
            raise BookieIOError(f"cannot read entry log {path}: {exc}") from exc
        except BaseException:
            file.close()
            raise
        return cls(log_id, dir_idx, path, file, size)

    @property
    def size(self) -> int:
        """Bytes in the log, buffered ones included."""
        buf = self.buf
        return self.written + (len(buf) if buf is not None else 0)

    def write_out(self) -> None:
        """Hand the write buffer to the OS (no fsync). On failure the buffer is kept whole and
        ``written`` unchanged, so a retry rewrites the same bytes at the same offset: a full disk
        (BookieDiskFullError) loses nothing."""
        buf = self.buf
        if not buf:
            return
        try:
            t0 = time.perf_counter()
            pwrite_all(self.file, buf, self.written)
            peaks.observe("entrylog_write", time.perf_counter() - t0)
        except OSError as exc:
            raise storage_write_error(f"write to entry log {self.path} at offset {self.written} failed", exc) from exc
        self.written += len(buf)
        self.buf = bytearray()
        self.unsynced = True

    def account(self, ledger_id: int, nbytes: int) -> None:
        """Count ``nbytes`` of records of ``ledger_id`` in the log's ledger map. Engine lock held."""
        m = self.ledgers
        m[ledger_id] = m.get(ledger_id, 0) + nbytes
        self.total += nbytes

    def finish(self) -> None:
        """Stop being active: write the buffer out and drop it."""
        self.write_out()
        self.buf = None

    def fsync(self) -> None:
        """Make everything written so far durable."""
        try:
            self.file.sync()
        except OSError as exc:
            raise BookieIOError(f"fsync of entry log {self.path} failed: {exc}") from exc

    def close(self) -> None:
        """Release the file."""
        self.file.close()
        self.file = CLOSED

    @property
    def is_open(self) -> bool:
        """Whether the log's file is still open (not closed by GC, compaction or close)."""
        return self.file is not CLOSED

    def _damaged(self, offset: int, ledger_id: int, entry_id: int, what: str) -> BookieIOError:
        return BookieIOError(
            f"entry log {self.path}: record at offset {offset} for ledger {ledger_id} entry {entry_id} "
            f"{what}; the entry must be read from another replica"
        )

    def read_record(self, offset: int, ledger_id: int, entry_id: int) -> bytes:
        """The data of the record at ``offset``, verified to be (ledger_id, entry_id) with a good
        checksum; BookieIOError naming file, offset, ledger and entry otherwise."""
        hs = RECORD_HEADER_SIZE
        if offset >= self.written:
            buf = self.buf
            rel = offset - self.written
            if buf is None or rel + hs > len(buf):
                raise self._damaged(offset, ledger_id, entry_id, "is beyond the end of the log")
            length, crc, rlid, reid = RECORD_HEADER.unpack_from(buf, rel)
            if rel + hs + length > len(buf):
                raise self._damaged(offset, ledger_id, entry_id, "is truncated")
            ids = bytes(buf[rel + 8 : rel + hs])
            data = bytes(buf[rel + hs : rel + hs + length])
        else:
            try:
                raw = self.file.pread(_FIRST_READ, offset)
                if len(raw) < hs:
                    raise self._damaged(offset, ledger_id, entry_id, "is truncated (header cut off)")
                length, crc, rlid, reid = RECORD_HEADER.unpack_from(raw)
                if hs + length <= len(raw):
                    data = raw[hs : hs + length]
                else:
                    rest = hs + length - len(raw)
                    more = self.file.pread(rest, offset + len(raw))
                    if len(more) != rest:
                        raise self._damaged(offset, ledger_id, entry_id, f"is truncated (length {length})")
                    data = raw[hs:] + more
            except OSError as exc:
                raise self._damaged(offset, ledger_id, entry_id, f"could not be read: {exc}") from exc
            ids = raw[8:hs]
        if rlid != ledger_id or reid != entry_id:
            raise self._damaged(offset, ledger_id, entry_id, f"holds ledger {rlid} entry {reid} instead")
        if record_crc(ids, data) != crc:
            raise self._damaged(offset, ledger_id, entry_id, "fails its CRC32C check")
        return data

    def read_window(
        self,
        start: int,
        length: int,
        ledger_id: int,
        wanted: Sequence[tuple[int, int, int]],
        results: list[Any],
    ) -> int:
        """Read ``length`` bytes from ``start`` with one ``pread`` and cut records out of them.

        ``wanted`` holds ``(location, entry_id, position)`` triples whose low 32 bits of
        ``location`` are record offsets inside the file part of the log (below ``written``), in
        ascending order and not before ``start``. ``results[position]`` receives what
        :meth:`read_record` would return or raise for that record: the verified data or the
        BookieIOError. A record the window does not hold entirely (a large one at its end, or one
        past where a truncated file stops) is read by :meth:`read_record` itself, so the outcome
        is exactly that of reading each record on its own. Returns the bytes of data returned."""
        try:
            raw = self.file.pread(length, start)
        except OSError:
            # Each record's own read then reports the failure with its file, offset and ids.
            raw = b""
        fast = cut_records()
        if fast is not None and type(raw) is bytes:
            nbytes, rest = fast(raw, start, ledger_id, wanted, results)
            for loc, entry_id, pos, what in rest:
                offset = loc & 0xFFFFFFFF
                if what is not None:
                    results[pos] = self._damaged(offset, ledger_id, entry_id, what)
                else:
                    nbytes += self._read_alone(offset, ledger_id, entry_id, results, pos)
            return nbytes
        view = memoryview(raw)
        avail = len(raw)
        hs = RECORD_HEADER_SIZE
        unpack = RECORD_HEADER.unpack_from
        nbytes = 0
        try:
            for loc, entry_id, pos in wanted:
                offset = loc & 0xFFFFFFFF
                rel = offset - start
                if rel + hs <= avail:
                    dlen, crc, rlid, reid = unpack(raw, rel)
                    end = rel + hs + dlen
                    if end <= avail:
                        if rlid != ledger_id or reid != entry_id:
                            results[pos] = self._damaged(
                                offset, ledger_id, entry_id, f"holds ledger {rlid} entry {reid} instead"
                            )
                        # ids and data are adjacent: one CRC pass equals record_crc(ids, data)
                        elif crc32c(view[rel + 8 : end]) != crc:
                            results[pos] = self._damaged(
                                offset, ledger_id, entry_id, "fails its CRC32C check"
                            )
                        else:
                            results[pos] = raw[rel + hs : end]
                            nbytes += dlen
                        continue
                nbytes += self._read_alone(offset, ledger_id, entry_id, results, pos)
        finally:
            view.release()
        return nbytes

    def _read_alone(self, offset: int, ledger_id: int, entry_id: int, results: list[Any], pos: int) -> int:
        """``results[pos]`` = :meth:`read_record` of a record a window did not hold entirely (or
        its BookieIOError); returns the bytes of data read."""
        try:
            data = self.read_record(offset, ledger_id, entry_id)
        except BookieIOError as exc:
            results[pos] = exc
            return 0
        results[pos] = data
        return len(data)


class ScannedRecord:
    """One record met by :class:`LogScanner`."""

    __slots__ = ("offset", "ledger_id", "entry_id", "crc", "data")

    def __init__(self, offset: int, ledger_id: int, entry_id: int, crc: int, data: memoryview) -> None:
        self.offset = offset
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.crc = crc
        self.data = data

    @property
    def record_size(self) -> int:
        return RECORD_HEADER_SIZE + len(self.data)


class LogScanner:
    """Iterate over the records of a finished log file, reading it in large chunks.

    After iteration, ``clean`` says whether the whole file was accounted for: either every byte
    belonged to a good record, or what followed the last good record is a torn tail (a record cut
    off by the end of the file, or zeros up to the end of the file), which is what a crash leaves.
    A bad record followed by more data is corruption: ``clean`` is False and ``error`` says where.
    """

    def __init__(self, file: StorageFile, size: int, path: Path, chunk: int = _SCAN_CHUNK) -> None:
        self.file = file
        self.size = size
        self.path = path
        self.chunk_size = chunk
        self.end = LOG_HEADER_SIZE
        self.clean = True
        self.error = ""
        self._chunk = b""
        self._chunk_off = 0

    def _get(self, pos: int, n: int) -> memoryview:
        off = self._chunk_off
        if pos < off or pos + n > off + len(self._chunk):
            want = min(max(n, self.chunk_size), self.size - pos)
            try:
                self._chunk = self.file.pread(want, pos)
            except OSError as exc:
                raise BookieIOError(f"entry log {self.path}: read at offset {pos} failed: {exc}") from exc
            self._chunk_off = off = pos
            if len(self._chunk) < n:
                raise BookieIOError(f"entry log {self.path}: file shrank while being scanned at offset {pos}")
        return memoryview(self._chunk)[pos - off : pos - off + n]

    def _zeros_to_end(self, pos: int) -> bool:
        while pos < self.size:
            n = min(self.chunk_size, self.size - pos)
            if self._get(pos, n).tobytes().count(0) != n:
                return False
            pos += n
        return True

    def _stop(self, pos: int, torn: bool, what: str) -> None:
        self.end = pos
        if not torn:
            self.clean = False
            self.error = f"entry log {self.path}: {what} at offset {pos} with {self.size - pos} bytes after it"

    def __iter__(self) -> Iterator[ScannedRecord]:
        hs = RECORD_HEADER_SIZE
        pos, size = LOG_HEADER_SIZE, self.size
        while pos < size:
            if size - pos < hs:
                self._stop(pos, True, "partial record header")
                return
            head = self._get(pos, hs)
            length, crc, lid, eid = RECORD_HEADER.unpack_from(head)
            if length == 0 and crc == 0 and lid == 0 and eid == 0:
                self._stop(pos, self._zeros_to_end(pos), "zeroed record header")
                return
            end = pos + hs + length
            if end > size:
                self._stop(pos, True, f"record of length {length} running past the end")
                return
            rec = self._get(pos, hs + length)
            data = rec[hs:]
            if record_crc(rec[8:hs], data) != crc:
                self._stop(pos, end == size or self._zeros_to_end(end), "record failing its CRC32C check")
                return
            yield ScannedRecord(pos, lid, eid, crc, data)
            pos = end
        self.end = pos
