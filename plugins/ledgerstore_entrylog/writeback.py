"""Write-back and checkpoint of the entrylog engine: ``flush()`` writes and fsyncs the entry logs,
then the dirty index pages and headers (so a durable index never points at data that is not
durable); a background thread fdatasyncs an entry log every ``flush_entrylog_bytes`` written so
dirty pages never pile up between checkpoints; another flushes every ``flush_interval`` seconds.
``close()`` is a last checkpoint that also finishes the active logs. Locking and the crash-safety
argument: :mod:`~ledgerstore_entrylog.state`.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ledgerstore.api import StorageFile
from ledgerstore.errors import BookieDiskFullError, BookieIOError
from ledgerstore.stalls import peaks
from ledgerstore_entrylog.entrylog import EntryLog
from ledgerstore_entrylog.index import fsync_dir, fsync_file
from ledgerstore_entrylog.ledger_cache import LedgerCache
from ledgerstore_entrylog.logs import EntryLogs
from ledgerstore_entrylog.state import EngineState

__all__ = ["Checkpointer"]

log = logging.getLogger(__name__)

_FLUSH_LEDGER_CHUNK = 64
#: index pages a checkpoint writes per hold of the lock: the add path (the bookie's event loop)
#: waits for the lock, so one hold must stay short however many pages a ledger dirtied (a
#: compaction or a long write can dirty thousands)
_FLUSH_PAGES_PER_HOLD = 32
# A flush() waiting for a compaction's flush_mutex looks this often whether the compaction ran a
# checkpoint for it (Checkpointer._wait_for_flush_mutex).
_FLUSH_WAIT_POLL_S = 0.05


class Checkpointer:
    """``flush`` (the checkpoint), ``close``, and the background flush and write-back threads."""

    def __init__(self, state: EngineState, logs: EntryLogs, cache: LedgerCache, flush_interval: float) -> None:
        self._state = state
        self._logs = logs
        self._cache = cache
        self._flush_interval = flush_interval
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._syncer: threading.Thread | None = None

    def start(self) -> None:
        """Start the background flush thread (``flush_interval`` > 0) and the write-back thread
        (``flush_entrylog_bytes`` > 0); called once the engine is open. Given the host's
        ``schedule`` (:class:`~ledgerstore_entrylog.state.EngineState`), no thread starts: each
        time a log is queued, one :meth:`sync_queued` is scheduled on the host's loop."""
        schedule = self._state.schedule
        if schedule is not None:
            if self._state.sync_bytes > 0:
                self._logs.on_queued = lambda: schedule(self.sync_queued)
            return
        if self._flush_interval > 0:
            self._flusher = threading.Thread(target=self._flush_loop, name="entrylog-flush", daemon=True)
            self._flusher.start()
        if self._state.sync_bytes > 0:
            self._syncer = threading.Thread(target=self._sync_loop, name="entrylog-writeback", daemon=True)
            self._syncer.start()

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_interval):
            try:
                self.flush()
            except BookieIOError:
                if self._state.closed:
                    return
                log.exception("background flush of the entrylog storage failed; stopping background flushes")
                return

    def _sync_loop(self) -> None:
        """Write-back thread: fdatasync the logs :meth:`EntryLogs.note_written` queued."""
        wake = self._logs.sync_wake
        while True:
            wake.wait()
            wake.clear()
            if self._stop.is_set() or not self.sync_queued():
                return

    def sync_queued(self) -> bool:
        """One round of write-back: fdatasync the logs queued since the last round. False once
        write-back must stop (a sync failed, or the engine closed while it ran)."""
        st = self._state
        jobs: list[tuple[EntryLog, StorageFile, int]] = []
        try:
            with st.lock:
                if st.flush_failure:
                    return False
                for lg in self._logs.take_sync_queue():
                    # GC and compaction take a log out of state.logs under this lock before they
                    # close and delete it, and close() closes logs under it: a log still in
                    # state.logs here is open and its file exists until the lock is released. A
                    # file of our own cannot be closed or reused under the sync, and an error
                    # the sync meets is still reported to the checkpoint's fsync through the
                    # log's own file (errors are tracked per open file).
                    if st.closed or st.logs.get(lg.log_id) is not lg or not lg.is_open:
                        continue
                    try:
                        f = st.files.open(lg.path, write=False)
                    except OSError as exc:
                        # Nothing is lost: the checkpoint still syncs the log.
                        log.warning("write-back skips entry log %s: %s", lg.path, exc)
                        continue
                    jobs.append((lg, f, lg.written - lg.synced_to))
                    lg.synced_to = lg.written
            for lg, f, nbytes in jobs:
                try:
                    t0 = time.perf_counter()
                    f.datasync()
                    peaks.observe("writeback_sync", time.perf_counter() - t0)
                except OSError as exc:
                    if st.closed:
                        return False
                    # What reached the disk is unknown: refuse checkpoints as a failed flush does.
                    msg = f"background fdatasync of entry log {lg.path} failed: {exc}"
                    st.flush_failure = st.flush_failure or msg
                    log.error("%s; write-back stopped and the next flush() will fail", msg)
                    return False
                with st.lock:
                    st.counters.background_syncs += 1
                    st.counters.background_sync_bytes += nbytes
        finally:
            for _, f, _ in jobs:
                f.close()
        return True

    def flush(self) -> None:
        """Checkpoint: write and fsync the entry logs, then write and fsync every dirty index page
        and header. When it returns, everything added before the call is durable."""
        st = self._state
        with st.lock:
            # a checkpoint numbered this or later starts after this call: it covers every add
            # made before it
            covering = st.checkpoints_started + 1
        if not self._wait_for_flush_mutex(covering):
            self._check_flushable()  # a compaction's checkpoint ran for this call
            return
        try:
            self._check_flushable()
            self.checkpoint()
        finally:
            st.flush_mutex.release()

    def _wait_for_flush_mutex(self, covering: int) -> bool:
        """Take ``flush_mutex`` (True), or return False once a checkpoint numbered ``covering``
        or later has succeeded meanwhile. A compaction holds the mutex for its whole pass, which
        its throttle stretches to tens of seconds: while this waits, it runs a checkpoint
        between two batches (``Compactor``), so the bookie's checkpoint, and with it the trim of
        its journal, does not wait out the pass."""
        st = self._state
        if st.flush_mutex.acquire(blocking=False):
            return True
        with st.lock:
            st.flush_waiters += 1
        try:
            while not st.flush_mutex.acquire(timeout=_FLUSH_WAIT_POLL_S):
                with st.lock:
                    if st.checkpoints_done >= covering:
                        return False
            return True
        finally:
            with st.lock:
                st.flush_waiters -= 1

    def _check_flushable(self) -> None:
        st = self._state
        with st.lock:
            st.check_open()
        if st.flush_failure:
            raise BookieIOError(
                f"an earlier flush failed ({st.flush_failure}); what is durable is unknown: "
                "restart the bookie so the journal is replayed"
            )

    def checkpoint(self) -> None:
        """The checkpoint itself, without the checks of :meth:`flush`; the caller holds
        ``flush_mutex`` (compaction runs it between its steps).

        A failure other than a full disk leaves what is durable unknown, whoever called: it
        poisons every later :meth:`flush` (a compaction's checkpoint that failed once let the
        bookie's next flush succeed without the index pages it had taken, and the journal was
        trimmed past entries whose index never reached the disk). A full disk does not: what did
        not fit is still buffered or dirty, so the next flush retries it once space comes back."""
        st = self._state
        with st.lock:
            st.checkpoints_started += 1
            number = st.checkpoints_started
        try:
            self._checkpoint()
            with st.lock:
                st.checkpoints_done = number
        except BookieDiskFullError:
            raise
        except BookieIOError as exc:
            st = self._state
            st.flush_failure = st.flush_failure or str(exc)
            raise

    def _checkpoint(self) -> None:
        st = self._state
        # 1. Entry logs: every record added so far reaches the disk before any index does.
        with st.lock:
            for lg in st.active:
                if lg is not None:
                    lg.write_out()
            logs = [(lg, lg.written) for lg in st.logs.values() if lg.unsynced]
            for lg, written in logs:
                lg.synced_to = max(lg.synced_to, written)
            todo = sorted(st.dirty_ledgers)
            st.dirty_ledgers = set()
            maps, st.maps_to_sync = st.maps_to_sync, set()
            dirs, st.dirs_to_sync = st.dirs_to_sync, set()
        for lg, _ in logs:
            lg.fsync()
        files = st.files
        for p in maps:
            fsync_file(files, p)
        for d in dirs:
            fsync_dir(files, d)
        with st.lock:
            for lg, written in logs:
                if lg.written == written:
                    lg.unsynced = False
        # 2. Index pages and headers, at most _FLUSH_PAGES_PER_HOLD pages (of up to
        # _FLUSH_LEDGER_CHUNK ledgers) per hold of the lock; the fsyncs run without it so adds
        # and reads go on meanwhile.
        i = 0
        written_pages: set[int] = set()  # pages of todo[i] already written by this flush
        while i < len(todo):
            start = i
            opened: list[tuple[StorageFile, Path]] = []
            try:
                with st.lock:
                    # Pages may have gained slots since step 1: keep their records ahead of them.
                    for lg in st.active:
                        if lg is not None:
                            lg.write_out()
                    budget = _FLUSH_PAGES_PER_HOLD
                    while i < len(todo) and budget > 0 and len(opened) < _FLUSH_LEDGER_CHUNK:
                        led = st.ledgers.get(todo[i])
                        # A page written_pages earlier in this flush and dirtied again since holds only
                        # adds made after flush() began: the next flush writes it.
                        dirty = [] if led is None else [pg for pg in led.pages.values()
                                                        if pg.dirty and pg.page_no not in written_pages]
                        if led is None or (not dirty and led.file_exists and not led.header_dirty):
                            i, written_pages = i + 1, set()
                            continue
                        part = dirty[:budget]
                        f = self._cache.write_pages(led, part, keep_open=True)
                        assert f is not None
                        opened.append((f, led.path))
                        budget -= max(1, len(part))
                        if len(part) == len(dirty):
                            i, written_pages = i + 1, set()
                        else:  # the rest of this ledger's pages in the next hold
                            written_pages.update(pg.page_no for pg in part)
                for f, path in opened:
                    try:
                        f.sync()
                    except OSError as exc:
                        raise BookieIOError(f"fsync of index file {path} failed: {exc}") from exc
            except BookieIOError:
                # A write of this hold failed (a full disk, or an error that poisons later
                # flushes: see checkpoint()). Its pages already written are no longer dirty but
                # not yet synced: sync them by path in a later flush; the ledgers from this
                # hold's first on are flushed again (a clean one is skipped).
                with st.lock:
                    st.unsynced_index.update(path for _, path in opened)
                    st.dirty_ledgers.update(todo[start:])
                raise
            finally:
                for f, _ in opened:
                    f.close()
        # 3. Index files written by cache evictions, and directories of created/deleted files.
        with st.lock:
            paths, st.unsynced_index = st.unsynced_index, set()
            dirs, st.dirs_to_sync = st.dirs_to_sync, set()
        for p in paths:
            fsync_file(files, p)
        for d in dirs:
            fsync_dir(files, d)

    def close(self) -> None:
        """Stop the background threads, then checkpoint, finish the active logs (writing their
        ledger maps), sync what is left and close every log. Idempotent."""
        st = self._state
        self._stop.set()
        self._logs.sync_wake.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        if self._syncer is not None:
            self._syncer.join()
        with st.urgent_flush_mutex():
            if st.closed or not st.opened:
                st.closed = True
                return
            try:
                self.checkpoint()
                with st.lock:
                    self._logs.finish_active()
                    logs = [lg for lg in st.logs.values() if lg.unsynced]
                    maps, st.maps_to_sync = st.maps_to_sync, set()
                    dirs, st.dirs_to_sync = st.dirs_to_sync, set()
                for lg in logs:
                    lg.fsync()
                for p in maps:
                    fsync_file(st.files, p)
                for d in dirs:
                    fsync_dir(st.files, d)
            finally:
                with st.lock:
                    st.closed = True
                    self._logs.close_all()
                    self._cache.close_files()
