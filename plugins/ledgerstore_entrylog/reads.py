"""Reads of the entrylog engine: one entry, or many with one ``pread`` per window of nearby
records of a log, releasing the engine's lock after about every MiB read. Records of a batch
that are not in the page cache are read ahead without the lock first, so the disk's time is
not spent holding every add.

Index look-ups go through the ledger cache (:mod:`~ledgerstore_entrylog.ledger_cache`), records are
read and verified by :class:`~ledgerstore_entrylog.entrylog.EntryLog`. Locking:
:mod:`~ledgerstore_entrylog.state`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledgerstore.api import StorageFile
from ledgerstore.errors import BookieIOError, LedgerStoreError, NoSuchEntryError
from ledgerstore_entrylog.entrylog import WINDOW_TAIL
from ledgerstore_entrylog.format import OFFSET_MASK, RECORD_HEADER_SIZE
from ledgerstore_entrylog.ledger_cache import LedgerCache
from ledgerstore_entrylog.state import CachedLedger, EngineState

__all__ = ["Reader"]

# get_entries releases the lock after reading about this many bytes.
_READ_BATCH_BYTES = 1024 * 1024
# get_entries reads records of one log with one pread while each starts at most _WINDOW_GAP
# bytes after the one before it and at most _WINDOW_BYTES after the first.
_WINDOW_BYTES = 1024 * 1024
_WINDOW_GAP = 64 * 1024
# get_entries reads ahead without the lock at most this many bytes per call, this much per pread
_PREFETCH_BYTES = 16 * 1024 * 1024
_PREFETCH_CHUNK = 1024 * 1024
# Ids get_entries looks up per step: the first step's, then at most this many.
_FIRST_BLOCK = 256
_MAX_BLOCK = 2048


class Reader:
    """``get_entry`` and ``get_entries`` over the engine's entry logs and ledger cache."""

    def __init__(self, state: EngineState, cache: LedgerCache) -> None:
        self._state = state
        self._cache = cache

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's data, verified against its record's CRC32C and ids."""
        st = self._state
        with st.lock:
            return self._read_locked(st.ledger(ledger_id), entry_id)

    def get_entries(self, ledger_id: int, entry_ids: Sequence[int]) -> list[bytes | BaseException]:
        """The data of each entry, or the error :meth:`get_entry` would raise for it, in the order
        of ``entry_ids``. Under the lock the ids of a block are looked up in the index, then their
        records are read in log and offset order with one ``pread`` per window of nearby records
        (:meth:`EntryLog.read_window`). The lock is released after about every MiB read so adds
        are not held up behind a large batch of reads; ids not read by then are looked up again
        under the next hold, as compaction may have moved their records meanwhile."""
        count = len(entry_ids)
        if count > 1:
            self._read_ahead(ledger_id, entry_ids)
        results: list[Any] = [None] * count
        i = 0  # entry_ids[i:] are not looked up yet
        carry: list[int] = []  # positions looked up under an earlier hold but not read
        seen_bytes = seen_entries = 0
        st = self._state
        while i < count or carry:
            with st.lock:
                try:
                    led = st.ledger(ledger_id)
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

    def _read_ahead(self, ledger_id: int, entry_ids: Sequence[int]) -> None:
        """When the first record asked for is not in the page cache (a ``preadv`` with
        ``RWF_NOWAIT`` says so), read the spans holding the records into the page cache with
        the lock released: the reads under the lock then copy from memory instead of holding
        the lock, and the add path behind it, for the disk's time (a catch-up reader of cold
        entries held each add up to ~100 ms: ``docs/performance.md``, "Catch-up reads beside
        writers"). A log compacted away meanwhile only makes this read nothing useful."""
        st = self._state
        spans: list[tuple[StorageFile, int, int]] = []  # (file, start, end) of nearby records of one log
        with st.lock:
            try:
                led = st.ledger(ledger_id)
                slot = self._cache.slot
                # the first and the last record: the kernel's own read-ahead after the previous
                # batch may already hold the first
                if not any(self._cold(slot(led, eid) - 1) for eid in (entry_ids[0], entry_ids[-1])
                           if 0 <= eid <= led.last):
                    return
                locs = [v - 1 for eid in entry_ids if 0 <= eid <= led.last and (v := slot(led, eid))]
            except (LedgerStoreError, OSError):
                return  # get_entries reports it
            locs.sort()
            total = 0
            for loc in locs:
                lg = st.logs.get(loc >> 32)
                offset = loc & OFFSET_MASK
                if lg is None or offset >= lg.written:
                    continue  # gone, or still in the write buffer
                end = min(offset + WINDOW_TAIL, lg.written)
                if spans and spans[-1][0] is lg.file and offset - spans[-1][2] <= _WINDOW_GAP:
                    f, start, prev_end = spans[-1]
                    spans[-1] = (f, start, max(prev_end, end))
                else:
                    spans.append((lg.file, offset, end))
                total += end - offset  # at most each record's first read: a bound, not a sum
                if total >= _PREFETCH_BYTES:
                    break
        for f, start, end in spans:
            pos = start
            while pos < end:
                try:
                    got = len(f.pread(min(_PREFETCH_CHUNK, end - pos), pos))
                except OSError:
                    break
                if not got:
                    break
                pos += got

    def _cold(self, loc: int) -> bool:
        """Whether the record at ``loc`` is on file and not in the page cache (a file system that
        cannot tell says it is cached: :meth:`~ledgerstore.api.StorageFile.cold`). Lock held."""
        if loc < 0:
            return False  # no such entry
        lg = self._state.logs.get(loc >> 32)
        offset = loc & OFFSET_MASK
        if lg is None or offset >= lg.written:
            return False
        return lg.file.cold(offset)

    def _read_block_locked(
        self, led: CachedLedger, entry_ids: Sequence[int], block: Sequence[int], results: list[Any], budget: int
    ) -> tuple[int, int, list[int]]:
        """Look up and read the entries at positions ``block`` of ``entry_ids`` into ``results``;
        stops before a window once ``budget`` bytes were read. Returns the bytes read, the number
        of entries read and the positions left unread. Lock held."""
        ledger_id = led.ledger_id
        last = led.last
        spp = self._state.slots_per_page
        page_of = self._cache.page
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
        logs = self._state.logs
        got = done = 0
        k, n = 0, len(locs)
        while k < n:
            if got >= budget:
                return got, done, sorted(pos for _, _, pos in locs[k:])
            loc, entry_id, pos = locs[k]
            log_id = loc >> 32
            offset = loc & OFFSET_MASK
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
                length = min((prev & OFFSET_MASK) + WINDOW_TAIL, written) - offset
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

    def _read_locked(self, led: CachedLedger, entry_id: int) -> bytes:
        """The verified data of one entry of ``led``. Lock held."""
        ledger_id = led.ledger_id
        if entry_id < 0 or entry_id > led.last:
            raise NoSuchEntryError(
                f"entry {entry_id} of ledger {ledger_id} is not stored here (last entry {led.last})"
            )
        v = self._cache.slot(led, entry_id)
        if not v:
            raise NoSuchEntryError(f"entry {entry_id} of ledger {ledger_id} is not stored here")
        v -= 1
        lg = self._state.logs.get(v >> 32)
        if lg is None:
            raise BookieIOError(
                f"index file {led.path}: entry {entry_id} of ledger {ledger_id} points at entry log "
                f"{v >> 32:08x}, which does not exist"
            )
        return lg.read_record(v & OFFSET_MASK, ledger_id, entry_id)
