"""The add path of the entrylog engine: each record is appended to its ledger directory's active
entry log (through the log's write buffer), then the ledger's index slot is pointed at it.

``add_entries`` is the bookie's ADD_BATCH path: it takes the engine lock once per batch and, on the
common case (same index page, no roll, no buffer write), hands a run of records to the compiled
``append_run`` of :mod:`~ledgerstore_entrylog.format`. Locking: :mod:`~ledgerstore_entrylog.state`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from crc32c import crc32c

from ledgerstore.errors import InvalidArgumentError
from ledgerstore_entrylog.format import LOG_HEADER_SIZE, MAX_ID, RECORD_IDS, append_run, record_heads
from ledgerstore_entrylog.ledger_cache import LedgerCache
from ledgerstore_entrylog.logs import EntryLogs
from ledgerstore_entrylog.state import EngineState

__all__ = ["Writer"]


class Writer:
    """``add_entry`` and ``add_entries`` over the engine's entry logs and ledger cache."""

    def __init__(self, state: EngineState, logs: EntryLogs, cache: LedgerCache) -> None:
        self._state = state
        self._logs = logs
        self._cache = cache

    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Append the entry to the active log's buffer and point the ledger's index slot at it.
        Re-adding an entry stores a new copy and moves the slot to it."""
        if not 0 <= entry_id <= MAX_ID or not 0 <= ledger_id <= MAX_ID:
            raise InvalidArgumentError(f"entry ({ledger_id}, {entry_id}) is outside 0..2**63-1")
        ids = RECORD_IDS.pack(ledger_id, entry_id)
        crc = crc32c(data, crc32c(ids))
        st = self._state
        with st.lock:
            if st.closed or not st.opened:
                st.check_open()
            led = st.ledgers.get(ledger_id) or self._cache.get_or_create(ledger_id)
            loc = self._logs.append(led.dir_idx, ledger_id, ids, data, crc)
            self._cache.set_slot(led, entry_id, loc + 1)
            if entry_id > led.last:
                led.last = entry_id
            st.counters.entries_written += 1

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
        # The batch's lowest and highest entry ids: set_slot marks the slots between them dirty
        # on each page the batch moves to, as the slots set directly below are not marked.
        ids = [r[0] for r in records]
        span = (min(ids), max(ids)) if ids else (0, 0)
        st = self._state
        limit = st.log_size_limit
        wbs = st.write_buffer_size
        spp = st.slots_per_page
        logs = self._logs
        set_slot = self._cache.set_slot
        with st.lock:
            if st.closed or not st.opened:
                st.check_open()
            led = st.ledgers.get(ledger_id) or self._cache.get_or_create(ledger_id)
            dir_idx = led.dir_idx
            lg = logs.active_for_append(dir_idx)
            base = lg.log_id << 32
            # size: bytes in lg, buffered ones included (write_out moves bytes from the buffer
            # to ``written`` without changing the sum); segment: size when this batch began
            # appending to lg, so size - segment is what lg's ledger map has yet to count.
            size = segment = lg.size
            last = led.last
            # The index page the previous entry went to. While entries stay on it, its slots
            # are set directly: set_slot already cached it and marked the batch's slots on it dirty
            # (its span), and nothing can clean or evict it before the lock is released, except
            # our own set_slot calls.
            cur_no = -1
            slots: array[int] | None = None
            fast = append_run()
            n = len(records)
            i = 0
            try:
                while i < n:
                    if fast is not None and slots is not None:
                        # the common case, compiled: same page, no roll, no buffer write
                        # (lg is the active log: its buffer is set)
                        i, size, last = fast(records, i, lg.buf, size, limit, wbs, base, spp, cur_no, slots, last)  # type: ignore[arg-type]
                        if i == n:
                            break
                    entry_id, head, data, rec = records[i]
                    if size + rec > limit and size > LOG_HEADER_SIZE:
                        # The finished log's ledger map is written by roll(): count its bytes first.
                        if size > segment:
                            lg.account(ledger_id, size - segment)
                            segment = size  # nothing more to count if roll() fails
                        lg = logs.roll(dir_idx)
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
                        logs.note_written(lg)
                    # Record first, slot second: an eviction inside set_slot writes the log
                    # buffer out before the page, so the index never points past the log's data.
                    page_no, slot = divmod(entry_id, spp)
                    if page_no == cur_no:
                        slots[slot] = (base | size) + 1  # type: ignore[index]
                    else:
                        set_slot(led, entry_id, (base | size) + 1, span)
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
                st.counters.entries_written += i
