"""Write-back of the ``entrylog`` engine (``flush_entrylog_bytes``): a background thread fdatasyncs
an entry log each time enough bytes have been written to it, on real files, without the add path
ever waiting for it and without ever syncing a log that GC, compaction or close have closed."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ledgerstore.errors import BookieIOError, ConfigError, NoSuchLedgerError
from ledgerstore_entrylog import EntryLogStorage

THREAD = "entrylog-writeback"
KiB = 1024


class SyncRecorder:
    """Wraps ``os.fdatasync``: records the inode behind every descriptor it is called with."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.inodes: list[int] = []
        self.errors: list[OSError] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_with: OSError | None = None
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        ino = os.fstat(fd).st_ino  # EBADF here would mean a closed descriptor was handed in
        self.entered.set()
        self.gate.wait(30)
        with self.lock:
            self.inodes.append(ino)
        if self.fail_with is not None:
            raise self.fail_with
        try:
            self.real(fd)
        except OSError as exc:
            self.errors.append(exc)
            raise


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncRecorder]:
    rec = SyncRecorder(os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", rec)
    yield rec
    rec.gate.set()


_earlier: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _only_this_tests_threads() -> None:
    """Write-back threads alive before the test (an engine another test left open in this
    process) are not this test's."""
    _earlier.clear()
    _earlier.update(t for t in threading.enumerate() if t.name == THREAD)


def writeback_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD and t not in _earlier]


def active_log(root: Path) -> Path:
    return max((root / "current").glob("entrylog-*.log"))


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def add_bytes(e: EntryLogStorage, ledger_id: int, first: int, total: int, size: int = 1000) -> int:
    """Add entries of ``size`` bytes until ``total`` bytes were added; returns the next entry id."""
    n = total // size + 1
    e.add_entries(ledger_id, [(first + i, bytes([i % 251]) * size) for i in range(n)])
    return first + n


def test_log_is_synced_in_the_background_without_a_flush(tmp_path: Path, syncs: SyncRecorder) -> None:
    e = EntryLogStorage([tmp_path], write_buffer_size=64 * KiB, flush_entrylog_bytes=256 * KiB)
    e.open()
    try:
        add_bytes(e, 1, 0, 1024 * KiB)
        ino = active_log(tmp_path).stat().st_ino
        assert wait_for(lambda: ino in syncs.inodes), "the active log was never fdatasynced"
        assert wait_for(lambda: e.stats().extra["background_sync_bytes"] >= 768 * KiB)
        assert e.stats().extra["background_syncs"] >= 1
        assert not syncs.errors
    finally:
        e.close()


def test_given_a_scheduler_the_write_back_runs_as_its_jobs_and_no_thread_starts(
        tmp_path: Path, syncs: SyncRecorder) -> None:
    """A host with a loop of its own (the simulation) hands the engine ``schedule``: each log
    queued for write-back schedules one job, nothing is synced until the host runs it, and no
    write-back or flush thread starts."""
    jobs: list[Callable[[], object]] = []
    e = EntryLogStorage([tmp_path], write_buffer_size=64 * KiB, flush_entrylog_bytes=256 * KiB, flush_interval=1.0,
                        schedule=jobs.append)
    e.open()
    try:
        assert writeback_threads() == []
        assert not [t for t in threading.enumerate() if t.name == "entrylog-flush"]
        add_bytes(e, 1, 0, 1024 * KiB)
        assert jobs, "no write-back job was scheduled"
        assert syncs.inodes == []
        while jobs:
            jobs.pop(0)()
        assert active_log(tmp_path).stat().st_ino in syncs.inodes
        assert e.stats().extra["background_sync_bytes"] >= 768 * KiB
    finally:
        e.close()


def test_below_the_threshold_nothing_is_synced(tmp_path: Path, syncs: SyncRecorder) -> None:
    e = EntryLogStorage([tmp_path], write_buffer_size=64 * KiB, flush_entrylog_bytes=1024 * KiB)
    e.open()
    try:
        add_bytes(e, 1, 0, 700 * KiB)  # ~700 KiB reach the file, below the 1 MiB threshold
        time.sleep(0.3)
        assert syncs.inodes == []
        assert e.stats().extra["background_syncs"] == 0
        add_bytes(e, 1, 10_000, 400 * KiB)
        ino = active_log(tmp_path).stat().st_ino
        assert wait_for(lambda: ino in syncs.inodes)
    finally:
        e.close()


def test_zero_turns_write_back_off(tmp_path: Path, syncs: SyncRecorder) -> None:
    e = EntryLogStorage([tmp_path], write_buffer_size=64 * KiB, flush_entrylog_bytes=0)
    e.open()
    try:
        assert writeback_threads() == []
        add_bytes(e, 1, 0, 2048 * KiB)
        time.sleep(0.3)
        assert syncs.inodes == []
        assert e.stats().extra["background_syncs"] == 0
    finally:
        e.close()


def test_default_is_one_mib(tmp_path: Path, syncs: SyncRecorder) -> None:
    e = EntryLogStorage([tmp_path], write_buffer_size=256 * KiB)
    e.open()
    try:
        assert len(writeback_threads()) == 1
        add_bytes(e, 1, 0, 768 * KiB)
        time.sleep(0.3)
        assert syncs.inodes == []
        add_bytes(e, 1, 10_000, 512 * KiB)
        ino = active_log(tmp_path).stat().st_ino
        assert wait_for(lambda: ino in syncs.inodes)
    finally:
        e.close()


@pytest.mark.parametrize("value", [-1, 1.5, "4MiB", True, None])
def test_bad_flush_entrylog_bytes_is_a_config_error(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match="flush_entrylog_bytes"):
        EntryLogStorage([tmp_path], flush_entrylog_bytes=value)


def test_close_stops_and_joins_the_thread(tmp_path: Path) -> None:
    before = len(writeback_threads())
    e = EntryLogStorage([tmp_path], flush_entrylog_bytes=64 * KiB)
    assert len(writeback_threads()) == before  # started by open(), not by the constructor
    e.open()
    assert len(writeback_threads()) == before + 1
    add_bytes(e, 1, 0, 256 * KiB)
    e.close()
    assert len(writeback_threads()) == before
    e.close()  # idempotent


def test_adds_gc_and_compaction_never_wait_for_a_sync(tmp_path: Path, syncs: SyncRecorder) -> None:
    """While a background fdatasync is stuck, adds, reads, GC and compaction go on."""
    e = EntryLogStorage(
        [tmp_path],
        write_buffer_size=16 * KiB,
        entry_log_size_limit=128 * KiB,
        flush_entrylog_bytes=32 * KiB,
    )
    e.open()
    try:
        syncs.gate.clear()
        nxt = add_bytes(e, 1, 0, 64 * KiB)
        assert syncs.entered.wait(10), "no background sync started"
        t0 = time.monotonic()
        for lid in (2, 3):
            add_bytes(e, lid, 0, 512 * KiB)  # several rolls and thresholds crossed meanwhile
        e.delete_ledger(2)
        e.gc()
        e.compact(0.9)
        nxt = add_bytes(e, 1, nxt, 64 * KiB)
        assert e.get_entry(3, 5) == bytes([5]) * 1000
        elapsed = time.monotonic() - t0
        assert elapsed < 5, f"adds/gc/compaction took {elapsed:.1f}s while a sync was stuck"
    finally:
        syncs.gate.set()
        e.close()
    assert writeback_threads() == []
    assert not syncs.errors


def test_failed_background_sync_fails_the_next_flush(tmp_path: Path, syncs: SyncRecorder) -> None:
    syncs.fail_with = OSError(errno.EIO, "Input/output error")
    e = EntryLogStorage([tmp_path], write_buffer_size=16 * KiB, flush_entrylog_bytes=32 * KiB)
    e.open()
    try:
        add_bytes(e, 1, 0, 64 * KiB)
        assert wait_for(lambda: len(syncs.inodes) >= 1)
        assert wait_for(lambda: writeback_threads() == [])  # the thread stops after a failure
        with pytest.raises(BookieIOError, match="background fdatasync of entry log"):
            e.flush()
    finally:
        e.close()


def test_concurrent_adds_gc_compaction_and_syncs(tmp_path: Path, syncs: SyncRecorder) -> None:
    """Small logs roll, GC deletes them and compaction copies them while the write-back thread
    syncs: no sync ever meets a closed descriptor and every stored entry reads back."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    e = EntryLogStorage(
        dirs,
        write_buffer_size=8 * KiB,
        entry_log_size_limit=64 * KiB,
        page_size=256,
        page_limit_bytes=8 * KiB,
        flush_entrylog_bytes=16 * KiB,
    )
    e.open()
    stop = threading.Event()
    failures: list[BaseException] = []
    written: dict[int, int] = {}  # ledger -> entries added (0..n-1)
    deleted: set[int] = set()
    finished: list[int] = []  # ledgers no adder writes to any more
    wlock = threading.Lock()

    def data(lid: int, eid: int) -> bytes:
        return (b"%d/%d:" % (lid, eid)) * ((lid + eid) % 40 + 5)

    def adder(base: int) -> None:
        rnd = random.Random(base)
        lid = base
        try:
            while not stop.is_set():
                n = written.get(lid, 0)
                batch = rnd.randint(1, 50)
                e.add_entries(lid, [(n + i, data(lid, n + i)) for i in range(batch)])
                with wlock:
                    written[lid] = n + batch
                    if n + batch > 300:
                        finished.append(lid)  # move on: this ledger may now be deleted
                        lid += 1000
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    def maintainer() -> None:
        rnd = random.Random(7)
        try:
            while not stop.is_set():
                with wlock:
                    candidates = [lid for lid in finished if lid not in deleted]
                    victim = rnd.choice(candidates) if len(candidates) > 1 else None
                    if victim is not None:
                        deleted.add(victim)
                if victim is not None:
                    e.delete_ledger(victim)
                e.gc()
                e.compact(0.8)
                if rnd.random() < 0.3:
                    e.flush()
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    threads = [threading.Thread(target=adder, args=(b,)) for b in (1, 2, 3)]
    threads.append(threading.Thread(target=maintainer))
    for t in threads:
        t.start()
    time.sleep(4)
    stop.set()
    for t in threads:
        t.join(60)
    try:
        assert not failures, failures
        assert not syncs.errors, syncs.errors
        st = e.stats()
        assert st.extra["background_syncs"] > 0
        assert st.gc_runs > 0 and st.bytes_reclaimed > 0
        checked = 0
        for lid, n in written.items():
            if lid in deleted:
                with pytest.raises(NoSuchLedgerError):
                    e.get_entry(lid, 0)
                continue
            got = e.get_entries(lid, list(range(n)))
            for eid, value in enumerate(got):
                assert value == data(lid, eid), (lid, eid, value)
            checked += n
        assert checked > 0
        e.flush()
    finally:
        e.close()
    assert writeback_threads() == []
