"""Background work of the ``entrylog`` engine (checkpoint, compaction) holds the engine lock for
short steps only: the bookie's add path takes the same lock on its event loop, so one long hold
stalls every add and the metadata session's heartbeat with them. These tests count the work
done per hold of the lock (records copied, index slots moved, index pages written), never time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ledgerstore_entrylog import EntryLogStorage


class CountingLock:
    """The engine lock, counting the work reported while it is held, per hold."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.work = 0
        self.most = 0

    def acquire(self, *args: Any) -> bool:
        got = self._lock.acquire(*args)
        if got:
            self.work = 0
        return got

    def release(self) -> None:
        self.most = max(self.most, self.work)
        self._lock.release()

    def __enter__(self) -> CountingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def counting(e: EntryLogStorage, *methods: tuple[str, str]) -> CountingLock:
    """Replace ``e``'s lock with a counting one; each call of ``methods`` (a part of
    ``e.parts`` and one of its methods) counts 1, except the cache's ``write_pages``, which
    counts the pages it writes."""
    lock = CountingLock()
    e.parts.state.lock = lock  # type: ignore[assignment]
    for part_name, name in methods:
        part = getattr(e.parts, part_name)
        real = getattr(part, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            lock.work += len(args[1]) if _name == "write_pages" else 1
            return _real(*args, **kw)

        setattr(part, name, counted)
    return lock


def engine(path: Path) -> EntryLogStorage:
    # no write-back thread: only the test's own thread takes the lock
    e = EntryLogStorage([path], flush_entrylog_bytes=0, write_buffer_size=64 * 1024)
    e.open()
    return e


def test_compaction_copies_and_moves_index_slots_a_few_hundred_at_a_time(tmp_path: Path) -> None:
    e = engine(tmp_path)
    data = {lid: [(eid, b"%d-%d-" % (lid, eid) + bytes(90)) for eid in range(20_000)] for lid in (1, 2)}
    for start in range(0, 20_000, 500):
        for lid in (1, 2):
            e.add_entries(lid, data[lid][start : start + 500])
    e.flush()
    e.close()
    e = engine(tmp_path)  # the log written above is finished now: a compaction candidate
    try:
        e.delete_ledger(2)
        lock = counting(e, ("logs", "append"), ("cache", "set_slot"))
        e.compact(0.8)
        assert e.stats().extra["compactions"] == 1
        # 20,000 records copied and 20,000 slots moved; with 1 MiB batches a hold copied ~9,000
        assert 0 < lock.most <= 1_000, lock.most
        for eid in (0, 1, 9_999, 19_999):
            assert e.get_entry(1, eid) == data[1][eid][1]
    finally:
        e.close()


def test_a_checkpoint_writes_a_bounded_number_of_index_pages_per_hold(tmp_path: Path) -> None:
    e = engine(tmp_path)
    entries = [(eid, b"e%d" % eid) for eid in range(200_000)]  # 196 index pages of 1024 slots
    for start in range(0, len(entries), 1000):
        e.add_entries(7, entries[start : start + 1000])
    e.add_entries(8, entries[:3000])
    lock = counting(e, ("cache", "write_pages"))
    e.flush()
    assert 0 < lock.most <= 32, lock.most
    assert e.stats().extra["cache_dirty_pages"] == 0
    e.close()
    e = engine(tmp_path)
    try:
        for lid, eid in ((7, 0), (7, 123_456), (7, 199_999), (8, 2_999)):
            assert e.get_entry(lid, eid) == b"e%d" % eid
    finally:
        e.close()
