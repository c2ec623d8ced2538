"""Batch adds and reads (``add_entries`` / ``get_entries``) of the entrylog and rocksdb engines on
real files: the same bytes on disk as one add at a time, crash safety of a batch interrupted by a
SIGKILL, and per-entry errors returned in place (damaged records, closed engines)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from ledgerstore.api import StorageEngine
from ledgerstore.errors import BookieIOError, InvalidArgumentError, NoSuchEntryError, NoSuchLedgerError
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_rocksdb import RocksDBStorage
from ledgerstore_rocksdb.format import encode_entries, encode_record, entry_key

# every test here runs on the compiled hot path (the entry log's record headers) and the pure-Python one
pytestmark = pytest.mark.usefixtures("hot_path")

TINY = {
    "write_buffer_size": 4096,
    "entry_log_size_limit": 64 * 1024,
    "page_size": 256,
    "page_limit_bytes": 4096,
}

PAYLOAD_SRC = """
import hashlib
def payload(ledger_id, entry_id):
    size = (entry_id * 7919 + ledger_id * 31) % 3000
    seed = hashlib.blake2b(b"%d/%d" % (ledger_id, entry_id)).digest()
    return (seed * (size // len(seed) + 1))[:size]
"""
_ns: dict = {"hashlib": hashlib}
exec(PAYLOAD_SRC, _ns)
payload = _ns["payload"]


def _workload() -> list[tuple[int, list[tuple[int, bytes]]]]:
    """Batches of varying size interleaved over five ledgers, with some re-adds (a replay)."""
    batches: list[tuple[int, list[tuple[int, bytes]]]] = []
    next_id = dict.fromkeys(range(5), 0)
    for i in range(120):
        lid = (i * 3) % 5
        n = 1 + (i * 37) % 60
        first = next_id[lid]
        batches.append((lid, [(eid, payload(lid, eid)) for eid in range(first, first + n)]))
        next_id[lid] = first + n
        if i % 17 == 16:
            batches.append((lid, [(eid, payload(lid, eid)) for eid in range(max(0, first - 5), first + 3)]))
    return batches


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- entrylog: exactly the on-disk format of one add at a time ------------------------------------


def test_entrylog_batches_write_the_same_files_as_single_adds(tmp_path: Path) -> None:
    single_dirs = [tmp_path / "single" / "d0", tmp_path / "single" / "d1"]
    batch_dirs = [tmp_path / "batch" / "d0", tmp_path / "batch" / "d1"]
    stats = []
    for dirs, batched in ((single_dirs, False), (batch_dirs, True)):
        e = EntryLogStorage(dirs, **TINY)
        e.open()
        for lid in range(5):
            e.set_master_key(lid, b"key-%d" % lid)
        for n, (lid, batch) in enumerate(_workload()):
            if batched:
                e.add_entries(lid, batch)
            else:
                for eid, data in batch:
                    e.add_entry(lid, eid, data)
            if n == 60:
                e.flush()
        stats.append(e.stats())
        e.close()
    single, batch = stats
    assert batch.entries_written == single.entries_written
    # The workload must exercise rolls and evictions in the middle of batches.
    assert batch.extra["entry_logs"] > 10
    assert batch.extra["dirty_evictions"] > 0
    assert batch.extra == single.extra
    assert _tree(tmp_path / "batch") == _tree(tmp_path / "single")


# --- entrylog: a SIGKILL in the middle of unflushed batches -------------------------------------

BATCH_ADDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from ledgerstore_entrylog import EntryLogStorage
    e = EntryLogStorage([Path(sys.argv[1])], write_buffer_size=4096, entry_log_size_limit=65536,
                        page_size=256, page_limit_bytes=4096)
    e.open()
    flushed = int(sys.argv[2])
    for n in range(flushed * 10):
        lid = n % 3
        e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(n // 3 * 50, n // 3 * 50 + 50)])
        if n + 1 == flushed:
            e.flush()
            print("FLUSHED", flush=True)
    print("ADDED", flush=True)
    sys.stdin.read()
    """
)


def test_entrylog_batches_killed_before_flush_never_serve_damage(tmp_path: Path) -> None:
    flushed = 30
    proc = subprocess.Popen(
        [sys.executable, "-c", PAYLOAD_SRC + BATCH_ADDER, str(tmp_path), str(flushed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "FLUSHED", proc.stderr.read()  # type: ignore[union-attr]
        assert proc.stdout.readline().strip() == "ADDED", proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    e = EntryLogStorage([tmp_path], **TINY)
    e.open()
    try:
        found = 0
        for lid in range(3):
            eids = list(range(flushed * 10 // 3 * 50))
            for eid, got in zip(eids, e.get_entries(lid, eids), strict=True):
                if eid < flushed // 3 * 50:
                    assert got == payload(lid, eid), (lid, eid, got)
                elif isinstance(got, NoSuchEntryError):
                    continue
                else:  # the process died, not the machine: what the index shows must be intact
                    assert got == payload(lid, eid), (lid, eid, got)
                found += 1
        assert found > flushed // 3 * 50 * 3  # evictions and buffer writes kept unflushed entries
    finally:
        e.close()


# --- entrylog: reads larger than one hold of the lock -------------------------------------------


def test_entrylog_get_entries_spanning_several_lock_holds(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        big = [(eid, bytes([eid]) * 700_000) for eid in range(0, 12, 2)]  # about 4 MiB
        e.add_entries(1, big)
        e.flush()
        results = e.get_entries(1, list(range(12)))
        for eid, got in enumerate(results):
            if eid % 2:
                assert isinstance(got, NoSuchEntryError)
            else:
                assert got == bytes([eid]) * 700_000
    finally:
        e.close()


def test_entrylog_damaged_record_is_an_error_in_its_slot_only(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    e.add_entries(2, [(eid, payload(2, eid)) for eid in range(100)])
    e.close()
    target = payload(2, 40)
    (log_path,) = [p for p in (tmp_path / "current").glob("entrylog-*.log") if target in p.read_bytes()]
    raw = bytearray(log_path.read_bytes())
    raw[raw.find(target) + 10] ^= 0xFF
    log_path.write_bytes(bytes(raw))
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        results = e.get_entries(2, list(range(100)))
        assert isinstance(results[40], BookieIOError)
        assert "ledger 2 entry 40" in str(results[40]) and str(log_path) in str(results[40])
        assert [r for i, r in enumerate(results) if i != 40] == [payload(2, i) for i in range(100) if i != 40]
    finally:
        e.close()


# --- rocksdb ------------------------------------------------------------------------------------


def test_rocksdb_batch_with_an_invalid_id_stores_nothing(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path])
    e.open()
    try:
        with pytest.raises(InvalidArgumentError):
            e.add_entries(3, [(0, b"a"), (2**64, b"b")])
        assert not e.has_ledger(3)
        e.add_entries(3, [(0, b"a"), (1, b"b")])
        assert e.stats().entries_written == 2
        assert e.last_entry_id(3) == 1
        (bad,) = e.get_entries(3, [-1])
        assert isinstance(bad, InvalidArgumentError)
    finally:
        e.close()


def test_rocksdb_corrupt_value_is_an_error_in_its_slot_only(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path])
    e.open()
    e.add_entries(7, [(eid, b"entry %d " % eid * 20) for eid in range(5)])
    e.close()
    db = Rdict(str(e.path), Options(raw_mode=True))
    good = db[entry_key(7, 3)]
    db[entry_key(7, 3)] = good[:-1] + bytes((good[-1] ^ 1,))
    db.close()
    e = RocksDBStorage([tmp_path])
    e.open()
    try:
        results = e.get_entries(7, [2, 3, 4, 5])
        assert results[0] == b"entry 2 " * 20
        assert isinstance(results[1], BookieIOError) and "ledger 7 entry 3" in str(results[1])
        assert results[2] == b"entry 4 " * 20
        assert isinstance(results[3], NoSuchEntryError)
    finally:
        e.close()


# --- both engines ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [EntryLogStorage, RocksDBStorage], ids=["entrylog", "rocksdb"])
def test_closed_engine_reads_fail_per_entry_like_get_entry(tmp_path: Path, cls: type[StorageEngine]) -> None:
    e = cls([tmp_path])
    e.open()
    e.add_entries(1, [(0, b"x"), (1, b"y")])
    e.close()
    with pytest.raises(BookieIOError):
        e.get_entry(1, 0)
    results = e.get_entries(1, [0, 1, 2])
    assert len(results) == 3
    assert all(isinstance(r, BookieIOError) for r in results)
    assert len({id(r) for r in results}) == 3
    with pytest.raises(BookieIOError):
        e.add_entries(1, [(2, b"z")])


def test_rocksdb_batch_encoding_is_the_single_entry_encoding() -> None:
    entries = [(0, b""), (1, b"one"), (2**63, b"x" * 1000), (2**64 - 1, b"last")]
    assert encode_entries(5, entries) == [
        (entry_key(5, eid), encode_record(entry_key(5, eid), d)) for eid, d in entries
    ]
    for bad in (-1, 2**64, 1.5):
        with pytest.raises(InvalidArgumentError, match=repr(bad)):
            encode_entries(5, [(0, b"ok"), (bad, b"bad")])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError):
        encode_entries(-1, [(0, b"x")])


@pytest.mark.parametrize("cls", [EntryLogStorage, RocksDBStorage], ids=["entrylog", "rocksdb"])
def test_concurrent_batches_reads_and_flushes(tmp_path: Path, cls: type[StorageEngine]) -> None:
    options = TINY if cls is EntryLogStorage else {}
    e = cls([tmp_path], **options)
    e.open()
    errors: list[BaseException] = []
    done = threading.Event()
    per_ledger = 1500

    def writer(lid: int) -> None:
        try:
            for first in range(0, per_ledger, 50):
                e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(first, first + 50)])
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            while not done.is_set():
                for lid in (1, 2, 3):
                    eids = list(range(0, per_ledger, 7))
                    for eid, got in zip(eids, e.get_entries(lid, eids), strict=True):
                        if not isinstance(got, NoSuchEntryError | NoSuchLedgerError):
                            assert got == payload(lid, eid), (lid, eid, got)
        except BaseException as exc:
            errors.append(exc)

    def flusher() -> None:
        try:
            while not done.is_set():
                e.flush()
                e.gc()
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(lid,)) for lid in (1, 2, 3)]
    others = [threading.Thread(target=reader), threading.Thread(target=flusher)]
    for t in writers + others:
        t.start()
    for t in writers:
        t.join(timeout=120)
    done.set()
    for t in others:
        t.join(timeout=120)
    assert not errors, errors
    e.flush()
    e.close()
    e = cls([tmp_path], **options)
    e.open()
    try:
        for lid in (1, 2, 3):
            assert e.last_entry_id(lid) == per_ledger - 1
            assert e.get_entries(lid, range(per_ledger)) == [payload(lid, eid) for eid in range(per_ledger)]
    finally:
        e.close()
