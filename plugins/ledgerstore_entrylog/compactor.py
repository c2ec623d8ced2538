"""Garbage collection and compaction of the entrylog engine (BookKeeper's
``GarbageCollectorThread`` on the storage side): delete entry logs that hold no live ledger, and
copy the live entries of sparse logs forward (copies durable, then the index, then the delete).
Both run under the engine's ``flush_mutex``, with the lock taken for short steps only
(:mod:`~ledgerstore_entrylog.state`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path

from ledgerstore.errors import BookieDiskFullError, BookieIOError
from ledgerstore_entrylog.entrylog import EntryLog, LogScanner, ScannedRecord
from ledgerstore_entrylog.format import RECORD_IDS, deleting_path
from ledgerstore_entrylog.index import fsync_dir, remove_file
from ledgerstore_entrylog.ledger_cache import LedgerCache
from ledgerstore_entrylog.logs import EntryLogs
from ledgerstore_entrylog.state import EngineState
from ledgerstore_entrylog.writeback import Checkpointer

__all__ = ["Compactor", "Pace"]

log = logging.getLogger(__name__)

# Compaction copies records in batches of about this many bytes per hold of the lock, and moves
# this many index slots per hold. The add path (the bookie's event loop) waits for the lock, so
# a hold must stay short: with 1 MiB batches (thousands of small records, each an index look-up
# that may read a page) a long compaction held the loop for most of its run.
_COMPACT_BATCH_BYTES = 64 * 1024
_INDEX_UPDATE_CHUNK = 256
# GC finishes an active log holding at least this many bytes of deleted ledgers when its live
# fraction is below the threshold, so that it can be compacted now: an active log is never
# compacted, and one rolls only at entry_log_size_limit (1 GiB), so the space of ledgers deleted
# while it was written came back only once it filled up or the bookie restarted
_GC_ROLL_DEAD_BYTES = 1024 * 1024
# A throttled compaction looks this often whether a checkpoint or a close waits for it (Pace).
_HURRY_POLL_S = 0.05
# GC frees the blocks of a deleted log this many bytes at a time (Compactor._remove_log): 16 MiB
# steps, each made durable, at 256 MiB/s kept a prompt fsync beside the deletion of a 1 GiB log
# at 3-8 ms, where the unlink alone stalled it for 61-67 ms.
_DELETE_STEP_BYTES = 16 * 1024 * 1024


class Pace:
    """The compaction throttle (BookKeeper's ``compactionRateByBytes`` and
    ``compactionRateByEntries``): a compaction of a log sleeps, between two batches and with no
    lock held, as long as it is ahead of either rate. It counts every record the scan reads,
    copied or not, where BookKeeper counts only the entries it re-adds: a log that is 90% dead
    is read whole, and reading it costs the disk and the CPU the writers need (without a
    throttle, three bookies compacting at once held the writers' p99 at 12x their solo p99:
    ``docs/performance.md``, "Disk that comes back"). ``math.inf`` leaves a rate unthrottled.

    A compaction holds the engine's ``flush_mutex`` for its whole pass, so a close (a SIGTERM)
    would wait out the throttle: while one waits, ``hurry`` is set and the pace stops sleeping,
    within :data:`_HURRY_POLL_S`. (A waiting ``flush()`` is served otherwise: the compaction
    runs a checkpoint for it between two batches.)"""

    def __init__(self, bytes_per_s: float = math.inf, entries_per_s: float = math.inf,
                 hurry: threading.Event | None = None) -> None:
        self.bytes_per_s = bytes_per_s
        self.entries_per_s = entries_per_s
        #: set by whoever waits for the compaction's ``flush_mutex``
        #: (:meth:`EngineState.urgent_flush_mutex`)
        self.hurry = hurry if hurry is not None else threading.Event()
        self._t0 = 0.0
        self._bytes = 0
        self._entries = 0

    @property
    def unthrottled(self) -> bool:
        return self.bytes_per_s == math.inf and self.entries_per_s == math.inf

    def start(self) -> None:
        """A compaction of a log begins: the rates count from now."""
        self._t0 = time.monotonic()
        self._bytes = self._entries = 0

    def step(self, nbytes: int, entries: int) -> float:
        """``nbytes`` in ``entries`` records were processed: sleep while ahead of a rate; returns
        the seconds slept."""
        self._bytes += nbytes
        self._entries += entries
        if self.unthrottled:
            return 0.0
        due = max(self._bytes / self.bytes_per_s, self._entries / self.entries_per_s)
        ahead = due - (time.monotonic() - self._t0)
        slept = 0.0
        while slept < ahead and not self.hurry.is_set():
            nap = min(ahead - slept, _HURRY_POLL_S)
            time.sleep(nap)
            slept += nap
        return slept


class Compactor:
    """GC and compaction of the engine's entry logs."""

    def __init__(self, state: EngineState, logs: EntryLogs, cache: LedgerCache, checkpointer: Checkpointer,
                 pace: Pace | None = None, delete_pace: Pace | None = None) -> None:
        self._state = state
        self._logs = logs
        self._cache = cache
        self._checkpointer = checkpointer
        #: the throttle of :meth:`compact` (unthrottled when None is given)
        self.pace = pace if pace is not None else Pace()
        self.pace.hurry = state.hurry
        #: the pace of a log's deletion (:meth:`_remove_log`; each log unlinked at once when None)
        self.delete_pace = delete_pace if delete_pace is not None else Pace()
        self.delete_pace.hurry = state.hurry

    def gc(self, threshold: float) -> None:
        """Delete entry logs that hold no live ledger, then run a minor compaction (logs whose
        live fraction is below ``threshold``)."""
        st = self._state
        with st.flush_mutex:
            with st.lock:
                st.check_open()
                st.counters.gc_runs += 1
                self._roll_sparse_active(threshold)
            self._delete_dead_logs()
            self._compact_locked(threshold)

    def _roll_sparse_active(self, threshold: float) -> None:
        """Finish every active log that is mostly deleted ledgers (live fraction below
        ``threshold``, at least :data:`_GC_ROLL_DEAD_BYTES` dead), so the same pass deletes or
        compacts it while the bookie serves. Lock held."""
        st = self._state
        for dir_idx, lg in enumerate(st.active):
            if lg is None or lg.total <= 0 or threshold <= 0:
                continue
            live = sum(n for lid, n in lg.ledgers.items() if lid in st.ledgers)
            if live / lg.total < threshold and lg.total - live >= _GC_ROLL_DEAD_BYTES:
                try:
                    self._logs.roll(dir_idx)
                except BookieDiskFullError as exc:
                    # Its buffer did not fit: it stays active with the buffer whole, and this
                    # pass goes on to delete the dead logs, which is what makes room.
                    log.info("GC leaves active entry log %s unfinished: %s", lg.path, exc)

    def compact(self, threshold: float) -> None:
        """Compact every finished log whose live fraction is below ``threshold`` (the bookie
        passes the minor or the major threshold); logs with no live data are deleted."""
        st = self._state
        with st.flush_mutex:
            with st.lock:
                st.check_open()
            self._compact_locked(threshold)

    def _delete_dead_logs(self) -> None:
        st = self._state
        with st.lock:
            ledgers = st.ledgers
            dead = [
                lg
                for lg in st.logs.values()
                if lg.buf is None and not lg.pinned and not any(lid in ledgers for lid in lg.ledgers)
            ]
        # a map built by a scan that stopped early may miss a live ledger: ask the index
        dead = [lg for lg in dead if lg.map_end is None or self._may_delete_partly_mapped(lg, {}, [])]
        with st.lock:
            for lg in dead:
                del st.logs[lg.log_id]
            # Index deletions must be durable before the logs they pointed into disappear.
            dirs, st.dirs_to_sync = st.dirs_to_sync, set()
        for d in dirs:
            fsync_dir(st.files, d)
        for lg in dead:
            self._remove_log(lg)

    def _remove_log(self, lg: EntryLog) -> None:
        """Close and delete a log no index points into any more. ``flush_mutex`` held.

        A log larger than one step of :data:`_DELETE_STEP_BYTES` is paced (``delete_pace``):
        renamed to ``*.deleting`` (what open deletes, should a crash interrupt us), then truncated
        a step at a time, each step made durable, and only then unlinked. Unlinked at once, a
        1 GiB log freed all its blocks in one file-system commit, and on a file system that
        discards freed blocks every fsync on it (the journals') waited for that commit."""
        st = self._state
        files = st.files
        size = lg.written
        lg.close()
        paced = size > _DELETE_STEP_BYTES and not self.delete_pace.unthrottled
        if paced:
            doomed = deleting_path(lg.path)
            try:
                files.rename(lg.path, doomed)
            except OSError as exc:
                raise BookieIOError(f"cannot rename {lg.path} to {doomed} to delete it: {exc}") from exc
        # Map first, intent last: a crash in between leaves a log without a map (rescanned at
        # open) or an intent that makes the next compaction finish the job. (A renamed log is
        # deleted at open: its map and intent are then left over, and open removes them too.)
        remove_file(files, lg.path.with_suffix(".lmap"))
        if not paced:
            remove_file(files, lg.path)
        remove_file(files, lg.path.with_suffix(".compacting"))
        fsync_dir(files, lg.path.parent)
        with st.lock:
            st.maps_to_sync.discard(lg.path.with_suffix(".lmap"))
        if paced:
            self._shrink_and_remove(doomed, size)
            fsync_dir(files, lg.path.parent)
        with st.lock:
            st.counters.bytes_reclaimed += size

    def _shrink_and_remove(self, path: Path, size: int) -> None:
        """Truncate ``path`` (a renamed log of ``size`` bytes) from its end in steps at the
        delete pace, each step made durable, then unlink it. A checkpoint waiting meanwhile is
        run between two steps, as the copies of a compaction are (:meth:`_compact_log`)."""
        st = self._state
        pace = self.delete_pace
        pace.start()
        try:
            f = st.files.open(path)
            try:
                while size > 0:
                    size = max(0, size - _DELETE_STEP_BYTES)
                    f.truncate(size)
                    f.datasync()
                    pace.step(_DELETE_STEP_BYTES, 0)
                    if st.flush_waiters:
                        self._checkpointer.checkpoint()
            finally:
                f.close()
        except OSError as exc:
            # the steps are a courtesy to the other writers of the disk: unlink it at once
            log.warning("GC could not truncate %s before deleting it (%s); unlinking it at once", path, exc)
        remove_file(st.files, path)

    def _compact_locked(self, threshold: float) -> None:
        st = self._state
        with st.lock:
            candidates: list[tuple[float, EntryLog]] = []
            for lg in st.logs.values():
                if lg.buf is not None or lg.pinned:
                    continue
                if lg.must_compact:
                    candidates.append((-1.0, lg))
                    continue
                if threshold <= 0 or lg.total <= 0:
                    continue
                live = sum(n for lid, n in lg.ledgers.items() if lid in st.ledgers)
                fraction = live / lg.total
                if fraction < threshold:
                    candidates.append((fraction, lg))
        candidates.sort(key=lambda c: c[0])
        for _, lg in candidates:
            self._compact_log(lg)

    def _compact_log(self, lg: EntryLog) -> None:
        """Copy the live entries of ``lg`` into the active log, make the copies durable, point the
        index at them, make the index durable, and only then delete ``lg``."""
        st = self._state
        intent = lg.path.with_suffix(".compacting")
        if not lg.must_compact:
            # Marks the log for re-compaction at the next open should a crash interrupt us
            # after some index slots already point at the copies.
            try:
                f = st.files.open(intent, create=True, truncate=True)
                try:
                    f.sync()
                finally:
                    f.close()
            except OSError as exc:
                raise BookieIOError(f"cannot create compaction intent {intent}: {exc}") from exc
            fsync_dir(st.files, intent.parent)
        moved: list[tuple[int, int, int, int]] = []
        scanner = LogScanner(lg.file, lg.written, lg.path)
        batch: list[ScannedRecord] = []
        batch_bytes = 0
        seen: dict[int, int] = {}  # record bytes the scan read, by ledger
        pace = self.pace
        pace.start()
        for rec in scanner:
            batch.append(rec)
            batch_bytes += rec.record_size
            seen[rec.ledger_id] = seen.get(rec.ledger_id, 0) + rec.record_size
            if batch_bytes >= _COMPACT_BATCH_BYTES:
                self._copy_live(lg, batch, moved)
                pace.step(batch_bytes, len(batch))
                batch, batch_bytes = [], 0
                if st.flush_waiters:
                    # A flush() waits for the mutex this pass holds: checkpoint for it (the copies
                    # so far are records in the active log like any other; the index still points
                    # at the old log until the pass ends).
                    self._checkpointer.checkpoint()
        if batch:
            self._copy_live(lg, batch, moved)
        if not scanner.clean:
            # Copies made so far are unreferenced garbage; the log stays.
            with st.lock:
                lg.pinned = True
            remove_file(st.files, intent)
            log.error("%s; compaction skipped, the log is kept and excluded from GC", scanner.error)
            return
        unread = self._unread_live_entry(lg, seen, moved)
        if unread is not None:
            # The scan ended early at what looked like a torn tail (a length field read with a
            # flipped bit does), and the index still points past it: deleting the log would lose
            # acknowledged entries. The copies made so far are unreferenced garbage; the log stays.
            with st.lock:
                lg.pinned = True
            remove_file(st.files, intent)
            log.error("entry log %s: the index points at entry %d of ledger %d in it, which the compaction scan "
                      "(stopped at offset %d of %d) did not read; compaction skipped, the log is kept and "
                      "excluded from GC", lg.path, unread[1], unread[0], scanner.end, lg.written)
            return
        self._checkpointer.checkpoint()  # the copies are durable ...
        cache = self._cache
        for start in range(0, len(moved), _INDEX_UPDATE_CHUNK):
            with st.lock:
                for ledger_id, entry_id, old, new in moved[start : start + _INDEX_UPDATE_CHUNK]:
                    led = st.ledgers.get(ledger_id)
                    # Skip entries deleted or re-added since they were copied.
                    if led is not None and cache.slot(led, entry_id) == old:
                        cache.set_slot(led, entry_id, new)
            _let_waiters_in()
        self._checkpointer.checkpoint()  # ... before the index points at them, and that before the delete.
        with st.lock:
            st.logs.pop(lg.log_id, None)
            st.counters.compactions += 1
        self._remove_log(lg)

    def _unread_live_entry(self, lg: EntryLog, seen: dict[int, int],
                           moved: list[tuple[int, int, int, int]]) -> tuple[int, int] | None:
        """``(ledger id, entry id)`` of an entry the index places in ``lg`` that the scan did not
        copy, or None. Only ledgers the scan read fewer record bytes of than the log's ledger map
        counts are looked at (a healthy scan reads them all: nothing to look at)."""
        st = self._state
        cache = self._cache
        with st.lock:
            if lg.map_end is not None:  # the map itself may miss ledgers: look at every live one
                short = list(st.ledgers)
            else:
                short = [lid for lid, n in lg.ledgers.items() if lid in st.ledgers and seen.get(lid, 0) < n]
        if not short:
            return None
        copied = {(lid, eid) for lid, eid, _, _ in moved}
        for lid in short:
            with st.lock:
                led = st.ledgers.get(lid)
                last = -1 if led is None else led.last
            for start in range(0, last + 1, _INDEX_UPDATE_CHUNK):
                with st.lock:
                    led = st.ledgers.get(lid)
                    if led is None:
                        break
                    for eid in range(start, min(last + 1, start + _INDEX_UPDATE_CHUNK)):
                        slot = cache.slot(led, eid)
                        if slot and (slot - 1) >> 32 == lg.log_id and (lid, eid) not in copied:
                            return lid, eid
                _let_waiters_in()
        return None

    def _may_delete_partly_mapped(self, lg: EntryLog, seen: dict[int, int], moved: list[tuple[int, int, int, int]]) -> bool:
        """Whether ``lg``, whose ledger map stops at :attr:`EntryLog.map_end`, may be deleted:
        False (the log is pinned, with an error) when the index points into it."""
        unread = self._unread_live_entry(lg, seen, moved)
        if unread is None:
            return True
        with self._state.lock:
            lg.pinned = True
        log.error("entry log %s: its ledger map was built by a scan that stopped at offset %s of %d, and the "
                  "index points at entry %d of ledger %d in it; the log is kept and excluded from GC",
                  lg.path, lg.map_end, lg.written, unread[1], unread[0])
        return False

    def _copy_live(self, lg: EntryLog, batch: list[ScannedRecord], moved: list[tuple[int, int, int, int]]) -> None:
        """Append the records of ``batch`` that the index still points at to the active logs."""
        st = self._state
        cache = self._cache
        base = lg.log_id << 32
        copied = 0
        with st.lock:
            for rec in batch:
                led = st.ledgers.get(rec.ledger_id)
                if led is None:
                    continue
                old = (base | rec.offset) + 1
                if cache.slot(led, rec.entry_id) != old:
                    continue
                ids = RECORD_IDS.pack(rec.ledger_id, rec.entry_id)
                new = self._logs.append(led.dir_idx, rec.ledger_id, ids, rec.data, rec.crc) + 1
                moved.append((rec.ledger_id, rec.entry_id, old, new))
                copied += rec.record_size
            st.counters.bytes_compacted += copied
        _let_waiters_in()


def _let_waiters_in() -> None:
    """Between two holds of the engine lock: give up the GIL for a moment, so that a thread
    waiting for the lock (the add path) takes it before this thread holds it again (the lock is
    not fair: a thread that releases and re-acquires it at once can keep a waiter out). Alone
    in its process (the engine run on its caller's thread, as under the simulation), nothing
    waits: the yield would only hand the core to another process."""
    if threading.active_count() > 1:
        time.sleep(0)
