"""``EntryLogStorage.get_entries`` reads nearby records with one ``pread`` per window: on real
files its answers are exactly those of one ``get_entry`` per id (bytes, error types and
messages), across rolled logs and the write buffer, around damaged and truncated records, and
while GC and compaction move records underneath it."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.errors import BookieIOError, LedgerStoreError, NoSuchEntryError, NoSuchLedgerError
from ledgerstore_entrylog import EntryLogStorage

RECORD_HEADER = 24

# every test here runs on the compiled window loop (``_records.cut_records``) and the pure-Python one
pytestmark = pytest.mark.usefixtures("hot_path")


def payload(ledger_id: int, entry_id: int, size: int | None = None) -> bytes:
    if size is None:
        size = (entry_id * 7919 + ledger_id * 31) % 600
        if entry_id % 997 == 500:
            size = 70_000  # larger than a window's tail and than the gap a window bridges
    seed = hashlib.blake2b(b"%d/%d" % (ledger_id, entry_id)).digest()
    return (seed * (size // len(seed) + 1))[:size]


def assert_like_get_entry(e: EntryLogStorage, ledger_id: int, ids: list[int], got: list[Any]) -> None:
    """``got`` (from get_entries) holds, per id, what get_entry returns or raises."""
    assert len(got) == len(ids)
    for entry_id, result in zip(ids, got, strict=True):
        try:
            want = e.get_entry(ledger_id, entry_id)
        except LedgerStoreError as exc:
            assert type(result) is type(exc), (entry_id, result)
            assert str(result) == str(exc)
        else:
            assert type(result) is bytes, (entry_id, result)
            assert result == want


class PreadCounter:
    """Counts os.pread calls while delegating to the real one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = os.pread

        def counting(fd: int, n: int, offset: int) -> bytes:
            self.calls += 1
            return real(fd, n, offset)

        monkeypatch.setattr(os, "pread", counting)


def fill(e: EntryLogStorage, ledgers: dict[int, int], batch: int = 100) -> None:
    """Store ``count`` entries for each ``ledger: count``, ledgers taking turns by batch."""
    for lid in ledgers:
        e.set_master_key(lid, b"key")
    pos = dict.fromkeys(ledgers, 0)
    while any(pos[lid] < n for lid, n in ledgers.items()):
        for lid, n in ledgers.items():
            first = pos[lid]
            last = min(n, first + batch)
            if first < last:
                e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(first, last)])
                pos[lid] = last


@pytest.mark.parametrize("stride", [1, 3])
def test_sequential_batch_of_5000_reads_byte_equal_with_few_preads(
    tmp_path: Path, stride: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    fill(e, {1: 5000 * stride, 2: 2000})
    e.close()
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        ids = list(range(0, 5000 * stride, stride))
        counter = PreadCounter(monkeypatch)
        got = e.get_entries(1, ids)
        preads = counter.calls
        monkeypatch.undo()
        assert [len(r) for r in got] == [len(payload(1, eid)) for eid in ids]
        assert got == [payload(1, eid) for eid in ids]
        assert_like_get_entry(e, 1, ids, got)
        # One pread per entry before windows; now about one per MiB plus the large entries
        # (index pages are read with their own preads too).
        assert preads < len(ids) // 20, preads
    finally:
        e.close()


def test_batch_spanning_rolled_logs_and_the_write_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = EntryLogStorage(
        [tmp_path], write_buffer_size=1024 * 1024, entry_log_size_limit=256 * 1024, page_size=256
    )
    e.open()
    try:
        fill(e, {4: 3000, 5: 1000}, batch=50)
        logs = sorted((tmp_path / "current").glob("entrylog-*.log"))
        assert len(logs) >= 4
        # The newest entries are still only in the active log's buffer.
        assert payload(4, 2999) not in logs[-1].read_bytes()
        ids = list(range(3000))
        counter = PreadCounter(monkeypatch)
        got = e.get_entries(4, ids)
        preads = counter.calls
        monkeypatch.undo()
        assert got == [payload(4, eid) for eid in ids]
        # Windows in every rolled log, not only the first one.
        assert preads < 100, preads
        assert_like_get_entry(e, 4, ids, got)
        # Out of order, with repeats: results follow the order asked for.
        rnd = random.Random(7)
        for _ in range(20):
            ids = [rnd.randrange(-5, 3010) for _ in range(rnd.randrange(1, 400))]
            ids += ids[: len(ids) // 4]
            rnd.shuffle(ids)
            assert_like_get_entry(e, 4, ids, e.get_entries(4, ids))
    finally:
        e.close()


def _log_of(root: Path, data: bytes) -> tuple[Path, int]:
    for p in (root / "current").glob("entrylog-*.log"):
        pos = p.read_bytes().find(data)
        if pos >= 0:
            return p, pos
    raise AssertionError("payload not found in any entry log")


def test_damaged_records_in_a_window_fail_alone(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    e.set_master_key(1, b"key")
    e.add_entries(1, [(eid, payload(1, eid, 200)) for eid in range(300)])
    e.close()
    log_path, crc_pos = _log_of(tmp_path, payload(1, 150, 200))
    _, ids_pos = _log_of(tmp_path, payload(1, 160, 200))
    raw = bytearray(log_path.read_bytes())
    raw[crc_pos + 77] ^= 0xFF  # data of entry 150
    raw[ids_pos - 9] ^= 0x01  # low byte of entry 160's ledger id
    log_path.write_bytes(bytes(raw))
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        ids = list(range(300))
        got = e.get_entries(1, ids)
        for eid in ids:
            if eid not in (150, 160):
                assert got[eid] == payload(1, eid, 200)
        assert isinstance(got[150], BookieIOError)
        msg = str(got[150])
        assert str(log_path) in msg and f"offset {crc_pos - RECORD_HEADER}" in msg
        assert "ledger 1 entry 150" in msg and "CRC32C" in msg
        assert isinstance(got[160], BookieIOError)
        assert "ledger 1 entry 160" in str(got[160]) and "holds ledger 0 entry 160 instead" in str(got[160])
        assert_like_get_entry(e, 1, ids, got)
    finally:
        e.close()


def test_log_truncated_under_an_open_engine_fails_only_the_lost_records(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    e.set_master_key(1, b"key")
    e.add_entries(1, [(eid, payload(1, eid, 300)) for eid in range(400)])
    e.close()
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        log_path, pos = _log_of(tmp_path, payload(1, 250, 300))
        # Cut entry 250's record in the middle of its data, and later a header in two.
        os.truncate(log_path, pos + 100)
        ids = list(range(400))
        got = e.get_entries(1, ids)
        assert got[:250] == [payload(1, eid, 300) for eid in range(250)]
        assert all(isinstance(r, BookieIOError) for r in got[250:])
        assert "entry 250" in str(got[250]) and "truncated" in str(got[250])
        assert "entry 251" in str(got[251]) and "header cut off" in str(got[251])
        assert_like_get_entry(e, 1, ids, got)
    finally:
        e.close()


def test_log_truncated_before_open_reads_what_is_left(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    e.set_master_key(1, b"key")
    e.add_entries(1, [(eid, payload(1, eid, 300)) for eid in range(400)])
    e.close()
    log_path, pos = _log_of(tmp_path, payload(1, 250, 300))
    os.truncate(log_path, pos + 100)
    (tmp_path / "current" / log_path.with_suffix(".lmap").name).unlink()
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        ids = list(range(400))
        got = e.get_entries(1, ids)
        assert got[:250] == [payload(1, eid, 300) for eid in range(250)]
        assert isinstance(got[250], BookieIOError) and "truncated" in str(got[250])
        assert all(isinstance(r, NoSuchEntryError) for r in got[251:])
        assert_like_get_entry(e, 1, ids, got)
    finally:
        e.close()


def test_missing_entries_and_ledgers_fail_in_place(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path], page_size=256, page_limit_bytes=1024)
    e.open()
    try:
        e.set_master_key(3, b"key")
        e.add_entries(3, [(eid, payload(3, eid, 50)) for eid in range(100)])
        e.add_entries(3, [(eid, payload(3, eid, 50)) for eid in range(150, 200)])
        e.flush()
        ids = [-1, 0, 99, 100, 149, 150, 199, 200, 10**12, 5, 5, 120]
        got = e.get_entries(3, ids)
        kinds = [type(r) for r in got]
        assert kinds == [
            NoSuchEntryError,
            bytes,
            bytes,
            NoSuchEntryError,
            NoSuchEntryError,
            bytes,
            bytes,
            NoSuchEntryError,
            NoSuchEntryError,
            bytes,
            bytes,
            NoSuchEntryError,
        ]
        assert got[9] == got[10] == payload(3, 5, 50)
        assert_like_get_entry(e, 3, ids, got)

        unknown = e.get_entries(42, [0, 1, 2])
        assert all(isinstance(r, NoSuchLedgerError) for r in unknown)
        assert len({id(r) for r in unknown}) == 3
        assert e.get_entries(3, []) == []
    finally:
        e.close()
    closed = e.get_entries(3, [0, 1])
    assert all(isinstance(r, BookieIOError) and "closed" in str(r) for r in closed)


def test_batch_larger_than_a_lock_hold_reads_everything(tmp_path: Path) -> None:
    # 80 entries of 30 KiB: about 2.4 MiB, read over several holds of the lock.
    e = EntryLogStorage([tmp_path], write_buffer_size=256 * 1024)
    e.open()
    try:
        e.set_master_key(6, b"key")
        e.add_entries(6, [(eid, payload(6, eid, 30_000)) for eid in range(80)])
        ids = list(range(80)) + list(range(79, -1, -7))
        got = e.get_entries(6, ids)
        assert got == [payload(6, eid, 30_000) for eid in ids]
    finally:
        e.close()


def test_reads_stay_correct_while_gc_and_compaction_move_records(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path], write_buffer_size=8192, entry_log_size_limit=64 * 1024, page_size=256)
    e.open()
    try:
        # Ledger 7 is read; ledger 8 shares its logs and is deleted, so compaction moves 7's
        # records into new logs and deletes the old ones while the reader runs.
        fill(e, {7: 1500, 8: 6000}, batch=20)
        e.flush()
        logs_before = {p.name for p in (tmp_path / "current").glob("entrylog-*.log")}
        want = [payload(7, eid) for eid in range(1500)]
        failures: list[str] = []
        stop = threading.Event()

        def reader() -> None:
            rounds = 0
            while not stop.is_set() or rounds < 3:
                for stride in (1, 3):
                    ids = list(range(rounds % stride, 1500, stride))
                    got = e.get_entries(7, ids)
                    for eid, r in zip(ids, got, strict=True):
                        if r != want[eid]:
                            failures.append(f"entry {eid}: {r!r:.120}")
                            return
                rounds += 1

        t = threading.Thread(target=reader)
        t.start()
        try:
            e.delete_ledger(8)
            e.gc()
            e.compact(1.0)
        finally:
            stop.set()
            t.join(timeout=120)
        assert not t.is_alive()
        assert not failures, failures[:3]
        logs_after = {p.name for p in (tmp_path / "current").glob("entrylog-*.log")}
        assert logs_before - logs_after, "compaction deleted no log: the test moved nothing"
        assert e.get_entries(7, list(range(1500))) == want
    finally:
        e.close()


def test_records_not_in_the_page_cache_are_read_ahead_without_the_engine_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catch-up read of evicted records waits for the disk with the lock released: the add
    path (the bookie's event loop) takes the same lock, so a cold read under it held every add
    for the disk's time."""
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        e.set_master_key(1, b"mk")
        e.add_entries(1, [(eid, payload(1, eid, 4096)) for eid in range(512)])
        e.flush()
        log_file = next(tmp_path.rglob("entrylog-*.log"))
        fd = os.open(log_file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(fd, [bytearray(1)], 1 << 20, os.RWF_NOWAIT)
                pytest.skip("this file system keeps the entry log in memory: nothing is cold here")
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
        lock = e.parts.state.lock
        read_ahead: list[int] = []
        real_pread = os.pread

        def pread(fd: int, n: int, offset: int) -> bytes:
            if not lock.locked():  # the read-ahead's reads: the only ones made without the lock
                read_ahead.append(n)
            return real_pread(fd, n, offset)

        monkeypatch.setattr(os, "pread", pread)
        got = e.get_entries(1, list(range(256, 512)))
        assert sum(read_ahead) >= 256 * 4096 * 0.9  # the records' bytes, read before the lock is taken
        assert got == [payload(1, eid, 4096) for eid in range(256, 512)]
        read_ahead.clear()
        e.get_entries(1, list(range(256, 512)))  # now in the page cache: nothing is read ahead
        assert read_ahead == []
    finally:
        e.close()
