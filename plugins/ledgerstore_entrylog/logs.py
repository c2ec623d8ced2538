"""The entry logs of the entrylog engine (BookKeeper's ``EntryLogger``): the log files found at
open, the active log of each ledger directory, appends, rolls, ledger maps beside finished logs,
and the queue of logs the write-back thread should sync.

One file is an :class:`~ledgerstore_entrylog.entrylog.EntryLog`; this module manages the set.
Every method runs under the engine lock (:mod:`~ledgerstore_entrylog.state`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ledgerstore.errors import BookieIOError
from ledgerstore_entrylog.entrylog import EntryLog, LogScanner
from ledgerstore_entrylog.format import (
    DELETING_SUFFIX,
    LOG_HEADER_SIZE,
    OFFSET_MASK,
    RECORD_HEADER_SIZE,
    RECORD_LEN_CRC,
    decode_ledger_map,
    encode_ledger_map,
    parse_log_file_name,
)
from ledgerstore_entrylog.index import pwrite_all, read_file, remove_file
from ledgerstore_entrylog.state import EngineState

__all__ = ["EntryLogs"]

log = logging.getLogger(__name__)


class EntryLogs:
    """The engine's entry log files: loading, appending, rolling, ledger maps, write-back queue."""

    def __init__(self, state: EngineState) -> None:
        self._state = state
        self._next_log_id = 0
        #: logs past the write-back threshold, by id, waiting for the write-back thread
        self._sync_queue: dict[int, EntryLog] = {}
        #: set when a log is queued, and to stop the write-back thread
        self.sync_wake = threading.Event()
        #: called when a log is queued: wakes the write-back thread, or schedules its job on the
        #: host's loop (:meth:`Checkpointer.start <ledgerstore_entrylog.writeback.Checkpointer.start>`)
        self.on_queued: Callable[[], object] = self.sync_wake.set

    # --- open -------------------------------------------------------------------------------------

    def load(self) -> None:
        """Open every entry log of the ledger directories and load its ledger map (or scan the log
        when the map is missing); settle what a crash left mid-deletion or mid-compaction.
        BookieIOError naming the file for a damaged header or a log id found twice."""
        st = self._state
        files = st.files
        seen: dict[int, EntryLog] = {}
        for dir_idx, current in enumerate(st.currents):
            try:
                files.makedirs(current / "index")
                names = files.listdir(current)
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
                    raise BookieIOError(f"entry log id {log_id:08x} exists twice: {seen[log_id].path} and {path}")
                lg = EntryLog.open_existing(files, log_id, dir_idx, path)
                seen[log_id] = st.logs[log_id] = lg
                self._load_ledger_map(lg)
            for name in names:
                if name.endswith(DELETING_SUFFIX) and parse_log_file_name(name[: -len(DELETING_SUFFIX)] + ".log") is not None:
                    remove_file(files, current / name)  # a log GC was deleting in steps when a crash came
                elif name.endswith(".lmap") and parse_log_file_name(name[: -len(".lmap")] + ".log") not in st.logs:
                    remove_file(files, current / name)  # left by a crash while its log was being deleted
                elif name.endswith(".compacting"):
                    log_id = parse_log_file_name(name[: -len(".compacting")] + ".log")
                    if log_id is not None and log_id in st.logs:
                        # An interrupted compaction: some index slots may already point at the
                        # copies. Compacting the log again settles it either way.
                        st.logs[log_id].must_compact = True
                    else:
                        remove_file(files, current / name)
        self._next_log_id = max(st.logs, default=-1) + 1

    def _load_ledger_map(self, lg: EntryLog) -> None:
        map_path = lg.path.with_suffix(".lmap")
        decoded = None
        try:
            decoded = decode_ledger_map(read_file(self._state.files, map_path), lg.log_id)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("ignoring unreadable ledger map %s (%s); scanning the log instead", map_path, exc)
        if decoded is not None:
            lg.total, lg.ledgers = decoded
            return
        if lg.written < LOG_HEADER_SIZE:
            return
        scanner = LogScanner(lg.file, lg.written, lg.path)
        ledgers: dict[int, int] = {}
        total = 0
        for rec in scanner:
            n = rec.record_size
            ledgers[rec.ledger_id] = ledgers.get(rec.ledger_id, 0) + n
            total += n
        lg.ledgers, lg.total = ledgers, total
        if scanner.clean and scanner.end < lg.written:
            lg.map_end = scanner.end
        if not scanner.clean:
            # What follows the damage cannot be attributed to ledgers, so GC could delete live
            # data: keep the log until an operator looks at it.
            lg.pinned = True
            log.error("%s; the log is kept and excluded from GC and compaction", scanner.error)

    def close_all(self) -> None:
        """Close every log's descriptor (after a failed open, or at close)."""
        for lg in self._state.logs.values():
            lg.close()

    # --- appends ----------------------------------------------------------------------------------

    def append(self, dir_idx: int, ledger_id: int, ids: bytes, data: bytes | memoryview, crc: int) -> int:
        """Buffer one record in the directory's active log; returns its location."""
        st = self._state
        lg = st.active[dir_idx]
        n = len(data)
        rec = RECORD_HEADER_SIZE + n
        if lg is None:
            lg = self.roll(dir_idx)
        else:
            size = lg.written + len(lg.buf)  # type: ignore[arg-type]
            if size + rec > st.log_size_limit and size > LOG_HEADER_SIZE:
                lg = self.roll(dir_idx)
        buf = lg.buf
        assert buf is not None
        off = lg.written + len(buf)
        buf += RECORD_LEN_CRC.pack(n, crc)
        buf += ids
        buf += data
        if len(buf) >= st.write_buffer_size:
            lg.write_out()
            self.note_written(lg)
        m = lg.ledgers
        m[ledger_id] = m.get(ledger_id, 0) + rec
        lg.total += rec
        return (lg.log_id << 32) | off

    def roll(self, dir_idx: int) -> EntryLog:
        """Finish the directory's active log (if any) and start a new one."""
        st = self._state
        old = st.active[dir_idx]
        if old is not None:
            old.finish()
            # finished: no longer the active log, even if creating the next one fails below
            st.active[dir_idx] = None
            self.note_written(old)
            self.write_ledger_map(old)
        log_id = self._next_log_id
        if log_id > OFFSET_MASK:
            raise BookieIOError("entry log ids are exhausted (2**32 logs); the ledger directories need a reset")
        lg = EntryLog.create(st.files, log_id, dir_idx, st.currents[dir_idx])
        self._next_log_id = log_id + 1
        st.logs[log_id] = lg
        st.active[dir_idx] = lg
        st.dirs_to_sync.add(st.currents[dir_idx])
        return lg

    def active_for_append(self, dir_idx: int) -> EntryLog:
        """The directory's active log, started if there is none yet."""
        lg = self._state.active[dir_idx]
        return lg if lg is not None else self.roll(dir_idx)

    def write_out_active(self, dir_idx: int) -> None:
        """Hand the write buffer of the directory's active log (if any) to the OS, so an index
        page written next cannot point past the log's data if only the process dies."""
        lg = self._state.active[dir_idx]
        if lg is not None:
            lg.write_out()
            self.note_written(lg)

    def finish_active(self) -> None:
        """Finish every active log and write its ledger map (at close)."""
        active = self._state.active
        for i, lg in enumerate(active):
            if lg is not None:
                lg.finish()
                self.write_ledger_map(lg)
                active[i] = None

    def write_ledger_map(self, lg: EntryLog) -> None:
        """Write the ledger map beside a finished log (fsynced by the next checkpoint)."""
        path = lg.path.with_suffix(".lmap")
        try:
            f = self._state.files.open(path, create=True, truncate=True)
            try:
                pwrite_all(f, encode_ledger_map(lg.log_id, lg.total, lg.ledgers), 0)
            finally:
                f.close()
        except OSError as exc:
            # The map only saves a scan at open; without it nothing is lost.
            log.warning("could not write ledger map %s: %s", path, exc)
            return
        self._state.maps_to_sync.add(path)
        self._state.dirs_to_sync.add(path.parent)

    # --- write-back queue -------------------------------------------------------------------------

    def note_written(self, lg: EntryLog) -> None:
        """Queue ``lg`` for a background sync once enough of it has been written."""
        sync_bytes = self._state.sync_bytes
        if not sync_bytes or lg.written - lg.synced_to < sync_bytes:
            return
        if lg.log_id not in self._sync_queue:
            self._sync_queue[lg.log_id] = lg
            self.on_queued()

    def take_sync_queue(self) -> list[EntryLog]:
        """The logs queued for a background sync since the last call, in queueing order."""
        queued, self._sync_queue = self._sync_queue, {}
        return list(queued.values())
