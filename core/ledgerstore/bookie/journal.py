"""The bookie's write-ahead journal: group commit, fsync before acknowledging, rolling files,
a LastLogMark checkpoint and replay.

File ``journal-<id:016x>.log``: a 16-byte header (``b"LSJ1"``, u32 format version, u64 file id),
then records::

    u32 body length | u32 crc32c(body) | body = u8 type | u64 ledger id | u64 entry id | data

Types: ADD (data = signed entry), FENCE (no data), MASTER_KEY (data = key), ADD_BATCH (entry id
field = entry count, data = count x (u64 entry id | u32 length | signed entry), the entry section
of the wire's ADD_BATCH request as received; read back as one ADD record per entry). A record whose length
or checksum does not hold at the tail of the newest file is a torn write from a crash: replay
truncates the file there. The same damage anywhere else is corruption and stops start-up.

A journal written with ``O_DIRECT`` (``direct_io``, the default where the file system supports
it) writes whole 4 KiB blocks: the block holding the end of the last group is written again, with
the same bytes, at the start of the next group, and the file ends in zeros up to the block after
its last record. Zeros shorter than a block after a record are therefore the file's clean end.

The LastLogMark (file ``lastMark``: u64 file id, u64 offset, u32 crc32c) says up to where the
storage engine holds everything; replay starts there. It is written only after the engine flushed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import crc32c

from ledgerstore.bookie.files import DIRECT_ALIGN, OS_FILES, Buffer, DirectWriter, FileSystem, JournalFile
from ledgerstore.errors import BookieIOError
from ledgerstore.latency import LatencyHistogram
from ledgerstore.stalls import peaks

log = logging.getLogger(__name__)

MAGIC = b"LSJ1"
FORMAT_VERSION = 1
FILE_HEADER = struct.Struct(">4sIQ")
REC_HEADER = struct.Struct(">II")
REC_BODY = struct.Struct(">BQQ")
MARK = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
MAX_RECORD = 64 * 1024 * 1024
#: what :meth:`Journal.append` takes: a record's bytes, or its parts in order
Appended = bytes | tuple[Buffer, ...]
#: upper bounds of the per-group count histograms (appends per group)
GROUP_COUNT_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: upper bounds of the per-group size histogram, in bytes (4 KiB .. 64 MiB)
GROUP_BYTES_BUCKETS: tuple[float, ...] = tuple(float(4096 << (2 * i)) for i in range(8))
#: why the writer thread closed a group: the queue ran empty, the group wait ran out, the group
#: reached ``max_group_bytes`` (BookKeeper's JOURNAL_NUM_FLUSH_EMPTY_QUEUE, _MAX_WAIT,
#: _MAX_OUTSTANDING_BYTES)
FLUSH_EMPTY_QUEUE, FLUSH_MAX_WAIT, FLUSH_MAX_BYTES = 0, 1, 2

ADD, FENCE, MASTER_KEY, ADD_BATCH = 1, 2, 3, 4
_BATCH_ITEM = struct.Struct(">QI")
_NAME = re.compile(r"^journal-([0-9a-f]{16})\.log$")

__all__ = ["ADD", "ADD_BATCH", "DIRECT_ALIGN", "FENCE", "MASTER_KEY", "DirectWriter", "Journal", "LogMark", "Record",
           "ReplayTarget", "encode_record", "journal_files", "read_mark", "record_parts", "scan_file", "write_mark"]


def encode_record(rtype: int, ledger_id: int, entry_id: int, data: bytes = b"") -> bytes:
    return b"".join(record_parts(rtype, ledger_id, entry_id, data))


def record_parts(rtype: int, ledger_id: int, entry_id: int, data: Buffer) -> tuple[bytes, Buffer]:
    """One record as two parts, its header and body head, then ``data`` as it is: for
    :meth:`Journal.append`, which writes the parts without joining them (a batch's entry section
    goes from the request frame to the file with no copy in between)."""
    head = REC_BODY.pack(rtype, ledger_id, entry_id)
    # the checksum runs over the body in two steps, so ``data`` is not copied to checksum it
    crc = crc32c.crc32c(data, crc32c.crc32c(head))
    return REC_HEADER.pack(len(head) + len(data), crc) + head, data


#: what the journal hands back, per append, once the append is durable (or failed)
C = TypeVar("C")
#: one queued append: the record, its completion, its record count, when it was queued and when
#: its request arrived
_Item = tuple[Appended, C, int, float, float]


class _Group(Generic[C]):
    """The appends one fsync commits: their buffers, in order, and what answering them needs."""

    __slots__ = ("bufs", "size", "tokens", "records", "queued", "started")

    def __init__(self) -> None:
        self.bufs: list[Buffer] = []
        self.size = 0
        self.tokens: list[C] = []
        self.records = 0
        self.queued: list[float] = []
        self.started: list[float] = []

    def add(self, item: _Item[C]) -> None:
        """Add one queued append (bytes, or parts written as they are)."""
        record = item[0]
        if isinstance(record, tuple):
            self.bufs += record
            self.size += sum(map(len, record))
        else:
            self.bufs.append(record)
            self.size += len(record)
        self.tokens.append(item[1])
        self.records += item[2]
        self.queued.append(item[3])
        self.started.append(item[4])


@dataclasses.dataclass(frozen=True, order=True)
class LogMark:
    file_id: int
    offset: int


@dataclasses.dataclass(frozen=True)
class Record:
    type: int
    ledger_id: int
    entry_id: int
    data: bytes
    mark: LogMark  # position just after this record


def journal_files(directory: Path, files: FileSystem = OS_FILES) -> list[tuple[int, Path]]:
    out = []
    for name in files.listdir(directory):
        m = _NAME.match(name)
        if m:
            out.append((int(m.group(1), 16), directory / name))
    return sorted(out)


def read_mark(directory: Path, files: FileSystem = OS_FILES, *, name: str = "lastMark") -> LogMark:
    p = directory / name
    if not files.exists(p):
        return LogMark(0, 0)
    raw = files.read(p)
    if len(raw) != MARK.size + 4 or crc32c.crc32c(raw[: MARK.size]) != _U32.unpack_from(raw, MARK.size)[0]:
        raise BookieIOError(f"{p}: the LastLogMark file is damaged ({len(raw)} bytes, checksum mismatch)")
    return LogMark(*MARK.unpack_from(raw))


def write_mark(directory: Path, mark: LogMark, files: FileSystem = OS_FILES, *, name: str = "lastMark") -> None:
    body = MARK.pack(mark.file_id, mark.offset)
    files.replace(directory / name, body + _U32.pack(crc32c.crc32c(body)))


def scan_file(path: Path, start: int = 0, *, repair: bool = False, files: FileSystem = OS_FILES) -> Iterator[Record]:
    """Yield the records of one journal file from ``start`` (0 = after the header).

    With ``repair``, a damaged tail is truncated (torn write); without, it raises BookieIOError.
    """
    header = files.read(path, 0, FILE_HEADER.size)
    if len(header) < FILE_HEADER.size:
        if repair:
            log.warning("%s: journal file shorter than its header (torn at creation); rewriting header", path)
            return
        raise BookieIOError(f"{path}: journal file shorter than its {FILE_HEADER.size}-byte header")
    magic, version, file_id = FILE_HEADER.unpack(header)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise BookieIOError(f"{path}: not a journal file of format {FORMAT_VERSION} (magic {magic!r}, version {version})")
    pos = max(start, FILE_HEADER.size)
    data = files.read(path, pos)
    view = memoryview(data)
    off = 0
    while off < len(data):
        problem = None
        if len(data) - off < REC_HEADER.size:
            problem = "truncated record header"
        else:
            length, crc = REC_HEADER.unpack_from(data, off)
            end = off + REC_HEADER.size + length
            if length < REC_BODY.size or length > MAX_RECORD:
                problem = f"impossible record length {length}"
            elif end > len(data):
                problem = "truncated record body"
            elif crc32c.crc32c(view[off + REC_HEADER.size : end]) != crc:
                problem = "record checksum mismatch"
        if problem and _is_padding(view[off:]):
            return  # the zeros an O_DIRECT journal ends a file with: its clean end
        if problem:
            where = pos + off
            if repair:
                log.warning("%s: %s at offset %d: truncating the torn tail (%d bytes)", path, problem, where, len(data) - off)
                files.truncate(path, where)
                return
            raise BookieIOError(f"{path}: {problem} at offset {where}")
        body = view[off + REC_HEADER.size : end]
        rtype, lid, eid = REC_BODY.unpack_from(body)
        mark = LogMark(file_id, pos + end)
        if rtype == ADD_BATCH:
            yield from _split_batch(path, pos + off, lid, eid, body[REC_BODY.size :], mark)
        else:
            yield Record(rtype, lid, eid, bytes(body[REC_BODY.size :]), mark)
        off = end


def _is_padding(rest: memoryview) -> bool:
    """True when ``rest`` (what follows the last whole record) is the zero padding of a file
    written with O_DIRECT: all zeros, and shorter than a block."""
    return 0 < len(rest) < DIRECT_ALIGN and rest.tobytes().count(0) == len(rest)


def _split_batch(path: Path, where: int, ledger_id: int, count: int, data: memoryview, mark: LogMark) -> Iterator[Record]:
    """The ADD records of a checksummed ADD_BATCH record (all carry the mark after the batch)."""
    pos, n = 0, len(data)
    unpack = _BATCH_ITEM.unpack_from
    for i in range(count):
        if n - pos < _BATCH_ITEM.size:
            raise BookieIOError(f"{path}: batch record at offset {where} holds {i} of its {count} entries")
        eid, size = unpack(data, pos)
        pos += _BATCH_ITEM.size
        if size > n - pos:
            raise BookieIOError(f"{path}: batch record at offset {where}: entry {eid} overruns the record")
        yield Record(ADD, ledger_id, eid, bytes(data[pos : pos + size]), mark)
        pos += size
    if pos != n:
        raise BookieIOError(f"{path}: batch record at offset {where} has {n - pos} bytes after its {count} entries")


Callback = Callable[[], None]


class ReplayTarget(Protocol):
    """What a replayed journal is applied to: one method per record type (a batch record is
    replayed as one add per entry). The bookie's is its :class:`~ledgerstore.bookie.ledgers.Ledgers`."""

    def replay_add(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        """An entry that was acknowledged (or may have been)."""

    def replay_fence(self, ledger_id: int) -> None:
        """The ledger was fenced."""

    def replay_master_key(self, ledger_id: int, key: bytes) -> None:
        """The ledger's first master key on this bookie."""


def _replay_table(target: ReplayTarget) -> dict[int, Callable[[Record], None]]:
    """Record type → how a record of it is applied to ``target``."""
    return {
        ADD: lambda r: target.replay_add(r.ledger_id, r.entry_id, r.data),
        FENCE: lambda r: target.replay_fence(r.ledger_id),
        MASTER_KEY: lambda r: target.replay_master_key(r.ledger_id, r.data),
    }


class Journal(Generic[C]):
    """Appends records from the event loop; a writer thread (or the loop) commits them in groups.

    ``append(record, completion)`` queues bytes; once the group holding them is written and
    fsync'd, ``on_durable(completions)`` runs on the event loop with the completions of the whole
    group, in order. If the writer fails, ``on_failed(completions, error)`` runs instead for the
    group it could not write, and no later append is accepted. A completion is whatever the caller
    needs to answer the requests behind its records (the bookie's are
    :data:`ledgerstore.bookie.completions.Completion`); the journal never looks inside it.

    The bookie logs through the typed calls (:meth:`log_add`, :meth:`log_add_batch`,
    :meth:`log_fence`, :meth:`log_master_key`) and replays into a :class:`ReplayTarget`
    (:meth:`replay_into`); :meth:`append` and :meth:`replay` are the untyped layer under them.

    Its files go through ``files`` (:class:`~ledgerstore.bookie.files.FileSystem`, the operating
    system's by default). With ``commit_on_loop`` the groups are committed by a task on the event
    loop instead of a thread, each fsync taking ``commit_on_loop()`` seconds of the loop's time:
    the deterministic simulation runs the journal so, on its simulated files.
    """

    def __init__(
        self,
        directory: Path,
        on_durable: Callable[[list[C]], None],
        *,
        on_failed: Callable[[list[C], BaseException], None] | None = None,
        max_group_wait_ms: float = 2.0,
        max_group_bytes: int = 512 * 1024,
        flush_when_queue_empty: bool = True,
        max_file_size: int = 2048 * 1024 * 1024,
        max_backups: int = 5,
        sync: bool = True,
        direct_io: bool = True,
        files: FileSystem = OS_FILES,
        commit_on_loop: Callable[[], float] | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.on_durable = on_durable
        self.on_failed = on_failed
        self.max_group_wait = max_group_wait_ms / 1000.0
        self.max_group_bytes = max_group_bytes
        self.flush_when_queue_empty = flush_when_queue_empty
        self.max_file_size = max_file_size
        self.max_backups = max_backups
        self.sync = sync
        #: write with O_DIRECT where the file system allows it (see :class:`DirectWriter`);
        #: after a file system refuses it, the journal writes through the page cache
        self.direct_io = direct_io
        self.files = files
        self._commit_delay = commit_on_loop
        self._file: JournalFile | None = None
        self._queue: queue.SimpleQueue[_Item[C] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the committer task of a journal committed on the loop, and what wakes it
        self._committer: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        #: set by :meth:`abort`: the process is gone, nothing more is written or answered
        self._aborted = False
        self._file_id = 0
        #: the end of what is synced, and of what is written, in the current file
        self._offset = 0
        self._end = 0
        self._durable = LogMark(0, 0)
        self._lock = threading.Lock()
        self.failed: BaseException | None = None
        # figures for metrics
        self.groups = 0
        self.records = 0
        self.bytes_written = 0
        self.fsync_seconds = 0.0
        self.last_group_size = 0
        #: groups closed for each reason (FLUSH_EMPTY_QUEUE, FLUSH_MAX_WAIT, FLUSH_MAX_BYTES)
        self.flushes = [0, 0, 0]
        #: 1 while a written group waits in fdatasync (BookKeeper's force-write queue: here the
        #: writer thread syncs each group itself, so at most one)
        self.syncing = 0
        #: appends of durable groups handed to the loop, and answered there: the difference is
        #: BookKeeper's journal callback queue (each counter has one writing thread)
        self.answers_posted = 0
        self.answers_done = 0
        #: appends (requests or batches) and bytes per durable group, one observation per group
        #: (JOURNAL_FORCE_WRITE_GROUPING_COUNT, JOURNAL_FORCE_WRITE_BATCH_BYTES)
        self.group_appends = LatencyHistogram(GROUP_COUNT_BUCKETS)
        self.group_bytes = LatencyHistogram(GROUP_BYTES_BUCKETS)
        # latency histograms, one observation per append (a request or a batch) or per group:
        #: append -> group taken by the writer thread (BookKeeper's JOURNAL_QUEUE_LATENCY)
        self.queue_seconds = LatencyHistogram()
        #: append -> its group fsync'd (JOURNAL_ADD_ENTRY)
        self.add_seconds = LatencyHistogram()
        #: one fdatasync per group (JOURNAL_SYNC)
        self.sync_seconds = LatencyHistogram()
        #: writing a group to the file, before its fdatasync (JOURNAL_FLUSH_LATENCY)
        self.write_seconds = LatencyHistogram()
        #: creating, fsyncing and naming a new journal file (JOURNAL_CREATION_LATENCY)
        self.creation_seconds = LatencyHistogram()
        #: request received (``started`` given to append) -> answered on the loop (ADD_ENTRY_REQUEST)
        self.request_seconds = LatencyHistogram()

    # --- replay --------------------------------------------------------------------------------

    def replay(self, apply: Callable[[Record], None]) -> int:
        """Apply every record after the LastLogMark; repair a torn tail. Returns records applied."""
        self.files.makedirs(self.dir)
        mark = read_mark(self.dir, self.files)
        files = journal_files(self.dir, self.files)
        n = 0
        for i, (fid, path) in enumerate(files):
            if fid < mark.file_id:
                continue
            start = mark.offset if fid == mark.file_id else 0
            last = i == len(files) - 1
            for rec in scan_file(path, start, repair=last, files=self.files):
                apply(rec)
                n += 1
        self._file_id = files[-1][0] if files else 0
        return n

    def replay_into(self, target: ReplayTarget) -> int:
        """:meth:`replay`, each record applied by the ``target`` method of its type (a record of
        a type it has none for is skipped). Returns records replayed."""
        table = _replay_table(target)

        def apply(rec: Record) -> None:
            how = table.get(rec.type)
            if how is not None:
                how(rec)

        return self.replay(apply)

    # --- writing -------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open a new journal file and start the writer thread, or the committer task on
        ``loop`` (after replay)."""
        self._loop = loop
        self._roll()
        if self._commit_delay is not None:
            self._committer = loop.create_task(self._commit_on_loop(), name="journal-committer")
            return
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def append(self, record: Appended, completion: C, records: int = 1, started: float = 0.0) -> None:
        """Queue bytes holding ``records`` records (from the event loop), or the parts of such
        bytes in order (:func:`record_parts`), which are written as they are. Never blocks.

        ``started`` is the ``time.perf_counter()`` at which the request behind the record
        arrived: given, the time until its answer is counted in :attr:`request_seconds`."""
        if self.failed is not None:
            raise BookieIOError(f"journal is failed: {self.failed}")
        self._queue.put((record, completion, records, time.perf_counter(), started))
        if self._wake is not None and not self._wake.done():  # committed on the loop, which is idle
            self._wake.set_result(None)

    def log_add(self, ledger_id: int, entry_id: int, entry: bytes, completion: C, started: float = 0.0) -> None:
        """Log one added entry; ``completion`` comes back once it is durable."""
        self.append(encode_record(ADD, ledger_id, entry_id, entry), completion, 1, started)

    def log_add_batch(self, ledger_id: int, count: int, entries: Buffer, completion: C, started: float = 0.0) -> None:
        """Log ``count`` entries of one ledger as one record whose data is the wire's ADD_BATCH
        entry section as received (written as it is, not copied)."""
        self.append(record_parts(ADD_BATCH, ledger_id, count, entries), completion, count, started)

    def log_adds(self, ledger_id: int, entries: list[tuple[int, bytes]], completion: C) -> None:
        """Log some entries of one ledger as one ADD record each, in one append."""
        self.append(b"".join([encode_record(ADD, ledger_id, eid, e) for eid, e in entries]), completion,
                    len(entries))

    def log_fence(self, ledger_id: int, completion: C) -> None:
        """Log that the ledger is fenced; ``completion`` comes back once that (and everything
        logged before it) is durable."""
        self.append(encode_record(FENCE, ledger_id, 0), completion)

    def log_master_key(self, ledger_id: int, key: bytes, completion: C) -> None:
        """Log the ledger's first master key on this bookie."""
        self.append(encode_record(MASTER_KEY, ledger_id, 0, key), completion)

    def queue_size(self) -> int:
        """Appends waiting for the writer thread (approximate)."""
        return self._queue.qsize()

    def callback_queue_size(self) -> int:
        """Appends whose group is durable but not yet answered on the event loop."""
        return max(0, self.answers_posted - self.answers_done)

    def durable_mark(self) -> LogMark:
        """Position up to which every record is on disk (for the checkpoint)."""
        with self._lock:
            return self._durable

    def _roll(self) -> None:
        t0 = time.perf_counter()
        self._close_file()
        self._file_id += 1
        path = self.dir / f"journal-{self._file_id:016x}.log"
        header = FILE_HEADER.pack(MAGIC, FORMAT_VERSION, self._file_id)
        self._file = self.files.create(path, header, direct=self.direct_io,
                                       buffer_size=self.max_group_bytes + 2 * DIRECT_ALIGN)
        # after a file system refuses O_DIRECT, the journal writes through the page cache
        self.direct_io = self._file.direct
        self._offset = self._end = FILE_HEADER.size
        with self._lock:
            self._durable = LogMark(self._file_id, self._offset)
        self.creation_seconds.observe(time.perf_counter() - t0)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _run(self) -> None:
        q = self._queue
        loop = self._loop
        assert loop is not None
        while True:
            item = q.get()
            if item is None:
                break
            group: _Group[C] = _Group()
            group.add(item)
            stop = False
            reason = FLUSH_MAX_BYTES
            deadline = time.monotonic() + self.max_group_wait
            while group.size < self.max_group_bytes:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    if self.flush_when_queue_empty:
                        reason = FLUSH_EMPTY_QUEUE
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        reason = FLUSH_MAX_WAIT
                        break
                    try:
                        nxt = q.get(timeout=remaining)
                    except queue.Empty:
                        reason = FLUSH_MAX_WAIT
                        break
                if nxt is None:
                    stop = True
                    reason = FLUSH_EMPTY_QUEUE
                    break
                group.add(nxt)
            taken = time.perf_counter()
            # the oldest append of the group waited longest: the queue's per-second peak
            peaks.observe("journal_queue", taken - group.queued[0])
            try:
                self._write(group.bufs, group.size)
                self._sync(group.size, group.records)
            except OSError as exc:
                self._fail(exc, group.tokens, loop.call_soon_threadsafe)
                break
            if self._aborted:
                break  # the process died during the fsync: nobody hears of the group
            self._count_group(group, reason, taken)
            loop.call_soon_threadsafe(self._answer, group.tokens, group.started)
            if stop:
                break
        if self._aborted:
            self._close_file()

    async def _commit_on_loop(self) -> None:
        """The writer thread's group commit as a task of the event loop: each group is what
        was appended while the previous one was being synced (up to ``max_group_bytes``), its
        fsync takes ``commit_on_loop()`` seconds of the loop's time, and its appends are
        answered once that sync returned."""
        assert self._commit_delay is not None and self._loop is not None
        while True:
            if self._queue.empty():
                self._wake = self._loop.create_future()
                await self._wake
                self._wake = None
            group = self._drain(self.max_group_bytes)
            taken = time.perf_counter()
            try:
                self._write(group.bufs, group.size)
                await asyncio.sleep(self._commit_delay())
                self._sync(group.size, group.records)
            except OSError as exc:
                self._fail(exc, group.tokens, self._loop.call_soon)
                return
            if self._aborted:
                return  # the process died during the fsync: nobody hears of the group
            self._count_group(group, FLUSH_EMPTY_QUEUE, taken)
            self._answer(group.tokens, group.started)

    def _drain(self, limit: int) -> _Group[C]:
        """What is queued, up to ``limit`` bytes (on the loop: nothing else takes from the queue)."""
        group: _Group[C] = _Group()
        while group.size < limit and not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                group.add(item)
        return group

    def _fail(self, exc: OSError, tokens: list[C], post: Callable[..., object]) -> None:
        """The group of ``tokens`` could not be made durable: no later append is taken, and
        ``on_failed`` hears of the group through ``post`` (unless the process is gone)."""
        self.failed = exc
        log.error("journal write failed, no further adds are acknowledged: %s", exc)
        if self.on_failed is not None and not self._aborted:
            post(self.on_failed, tokens, exc)

    def _count_group(self, group: _Group[C], reason: int, taken: float) -> None:
        """Count a durable group: why it was closed, its appends and bytes, and one queue and add
        latency per append, on the one thread (or task) that updates these figures."""
        self.flushes[reason] += 1
        self.answers_posted += len(group.queued)
        self.group_appends.observe(len(group.queued))
        self.group_bytes.observe(group.size)
        durable = time.perf_counter()
        q, a = self.queue_seconds.observe, self.add_seconds.observe
        for t in group.queued:
            q(taken - t)
            a(durable - t)

    def _answer(self, tokens: list[C], started: list[float]) -> None:
        """On the loop: answer a durable group, then count its requests' latencies."""
        self.on_durable(tokens)
        self.answers_done += len(tokens)
        now = time.perf_counter()
        observe = self.request_seconds.observe
        for t in started:
            if t:
                observe(now - t)

    def _write(self, bufs: list[Buffer], size: int) -> None:
        """Write one group after what the file holds (a new file first if it would grow past
        ``max_file_size``). Raises OSError."""
        if self._end + size > self.max_file_size and self._end > FILE_HEADER.size:
            self._roll()
        assert self._file is not None
        t0 = time.perf_counter()
        self._file.write(bufs, size)
        self._end += size
        self.write_seconds.observe(time.perf_counter() - t0)

    def _sync(self, size: int, nrecords: int) -> None:
        """Sync the group just written (``size`` bytes, ``nrecords`` records) and move the
        durable mark past everything written. Raises OSError."""
        assert self._file is not None
        if self.sync:
            t0 = time.perf_counter()
            self.syncing = 1
            try:
                self._file.sync()
            finally:
                self.syncing = 0
            took = time.perf_counter() - t0
            self.fsync_seconds += took
            self.sync_seconds.observe(took)
            peaks.observe("journal_fsync", took)
        self._offset = self._end
        self.groups += 1
        self.records += nrecords
        self.bytes_written += size
        self.last_group_size = nrecords
        with self._lock:
            self._durable = LogMark(self._file_id, self._offset)

    def checkpoint_done(self, mark: LogMark) -> None:
        """Record that the engine holds everything up to ``mark``; drop old journal files."""
        write_mark(self.dir, mark, self.files)
        old = [p for fid, p in journal_files(self.dir, self.files) if fid < mark.file_id]
        for p in old[: max(0, len(old) - self.max_backups)]:
            self.files.remove(p)

    def close(self) -> None:
        """A clean stop: everything appended is written and synced (answered only by the writer
        thread, which answers what it wrote before it ends)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._committer is not None:
            self._committer.cancel()
            self._committer = None
            self._write_rest()
        self._close_file()

    def _write_rest(self) -> None:
        """On the loop, at a clean stop: write and sync what is queued and what was written
        and not yet synced, answering nobody."""
        group = self._drain(1 << 62)
        if self._file is None or self.failed is not None or self._loop is None:
            return
        try:
            if group.size:
                self._write(group.bufs, group.size)
            self._sync(group.size, group.records)
        except OSError as exc:
            self._fail(exc, [], self._loop.call_soon)

    def abort(self) -> None:
        """The process died: nothing more is written, synced or answered. What was written and
        not synced is the file system's to keep or lose, as after a crash."""
        self._aborted = True
        if self._thread is not None:
            self._queue.put(None)  # the thread ends after the group it holds, answering nobody
            self._thread = None
        if self._committer is not None:
            self._committer.cancel()
            self._committer = None
            self._close_file()
