"""The rocksdb storage engine on real RocksDB files: crash durability, checksums, space reclaim,
options, and concurrent use from several threads."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from ledgerstore.errors import (
    BookieIOError,
    ConfigError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore_rocksdb import RocksDBStorage
from ledgerstore_rocksdb.format import deletion_runs, encode_record, entry_key, ledger_key

MiB = 1024 * 1024


def payload(ledger_id: int, entry_id: int) -> bytes:
    """Deterministic entry bytes of varying length, so a reader can recompute what was written."""
    return hashlib.blake2b(b"%d:%d" % (ledger_id, entry_id)).digest() * (1 + entry_id % 8)


@pytest.fixture
def engine(tmp_path: Path):
    e = RocksDBStorage([tmp_path])
    e.open()
    yield e
    e.close()


def reopen(e: RocksDBStorage, **options) -> RocksDBStorage:
    e.close()
    e2 = RocksDBStorage(e.ledger_dirs, **options)
    e2.open()
    return e2


def raw_db(path: Path) -> Rdict:
    return Rdict(str(path), Options(raw_mode=True))


# --- (a) a SIGKILLed bookie keeps everything added before flush() -------------------------------

CHILD = textwrap.dedent(
    """
    import hashlib, json, sys, time
    from pathlib import Path
    from ledgerstore_rocksdb import RocksDBStorage
    {payload}
    path, options, n = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    e = RocksDBStorage([path], **options)
    e.open()
    for lid in (1, 2, 3):
        e.set_master_key(lid, b"key-%d" % lid)
    e.set_fenced(2)
    for i in range(n):
        e.add_entry(1 + i % 3, i // 3, payload(1 + i % 3, i // 3))
    e.flush()
    e.delete_ledger(3)  # a delete is durable on return: nothing replays it
    print("flushed", flush=True)
    i = n
    while i < 20 * n:  # keep adding, unflushed, until killed (bounded in case the parent died)
        e.add_entry(1 + i % 2, i, payload(1 + i % 2, i))
        i += 1
        if i == 2 * n:
            print("writing", flush=True)
    time.sleep(120)
    """
).format(payload=inspect.getsource(payload))


@pytest.mark.parametrize(
    "options",
    [{}, {"wal": True}, {"write_buffer_size": MiB}],
    ids=["memtable-flush", "wal-sync", "small-memtables"],
)
def test_entries_added_before_flush_survive_sigkill(tmp_path: Path, options: dict) -> None:
    n = 30_000
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), json.dumps(options), str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == b"flushed\n", proc.stderr.read().decode() if proc.stderr else line
        assert proc.stdout.readline() == b"writing\n"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    e = RocksDBStorage([tmp_path], **options)
    e.open()
    try:
        assert list(e.list_ledgers()) == [1, 2]
        assert e.get_master_key(1) == b"key-1"
        assert e.is_fenced(2) and not e.is_fenced(1)
        with pytest.raises(NoSuchLedgerError):
            e.get_entry(3, 0)
        for i in range(n):
            lid, eid = 1 + i % 3, i // 3
            if lid != 3:
                assert e.get_entry(lid, eid) == payload(lid, eid), (lid, eid)
        for lid in (1, 2):  # whatever survived of the unflushed tail is intact, never torn
            last = e.last_entry_id(lid)
            assert last >= (n - 1) // 3
            if last >= n:
                assert e.get_entry(lid, last) == payload(lid, last)
        e.add_entry(1, 10**9, b"after the crash")  # and the reopened database takes writes
        e.flush()
        assert e.get_entry(1, 10**9) == b"after the crash"
    finally:
        e.close()


# --- (b) a corrupt value is an error, never bytes ------------------------------------------------


def test_key_layout_is_prefix_and_big_endian_ids() -> None:
    assert entry_key(7, 3) == b"e" + (7).to_bytes(8, "big") + (3).to_bytes(8, "big")
    assert ledger_key(b"m", 7) == b"m" + (7).to_bytes(8, "big")
    assert entry_key(1, 2**40) < entry_key(2, 0) < entry_key(2, 1)


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda good, other: good[:-1] + bytes((good[-1] ^ 0x01,)), id="bit-flip"),
        pytest.param(lambda good, other: good[:3], id="truncated"),
        pytest.param(lambda good, other: b"\x09" + good[1:], id="unknown-version"),
        pytest.param(lambda good, other: other, id="value-of-another-entry"),
    ],
)
def test_corrupt_value_raises_bookie_io_error_naming_ledger_and_entry(tmp_path: Path, corrupt) -> None:
    e = RocksDBStorage([tmp_path])
    e.open()
    e.set_master_key(7, b"mk")
    for eid in range(5):
        e.add_entry(7, eid, b"entry %d " % eid * 20)
    e.close()

    db = raw_db(e.path)
    good, other = db[entry_key(7, 3)], db[entry_key(7, 4)]
    db[entry_key(7, 3)] = corrupt(good, other)
    db.close()

    e = RocksDBStorage([tmp_path])
    e.open()
    try:
        with pytest.raises(BookieIOError, match=r"ledger 7 entry 3\b"):
            e.get_entry(7, 3)
        assert e.get_entry(7, 2) == b"entry 2 " * 20
        assert e.get_entry(7, 4) == b"entry 4 " * 20
    finally:
        e.close()


def test_corrupt_ledger_state_fails_open(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path])
    e.open()
    e.set_master_key(8, b"secret")
    e.close()
    db = raw_db(e.path)
    key = ledger_key(b"m", 8)
    db[key] = db[key][:-1] + b"X"
    db.close()
    with pytest.raises(BookieIOError, match="ledger 8 state"):
        RocksDBStorage([tmp_path]).open()


def test_a_value_written_by_another_engine_version_is_refused(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path])
    e.open()
    e.set_master_key(9, b"mk")
    e.close()
    db = raw_db(e.path)
    key = entry_key(9, 0)
    db[key] = encode_record(key, b"fine")  # the engine's own encoding reads back...
    db.close()
    e = RocksDBStorage([tmp_path])
    e.open()
    try:
        assert e.get_entry(9, 0) == b"fine"
    finally:
        e.close()


# --- (c) GC gives the space of deleted ledgers back ---------------------------------------------


def test_gc_reclaims_deleted_ledgers_space(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path])
    e.open()
    entry_size, per_ledger = 4096, 1280  # 10 ledgers x 1280 x 4 KiB = 50 MiB, incompressible
    written = 10 * per_ledger * entry_size
    kept: dict[tuple[int, int], bytes] = {}
    for lid in range(10):
        e.set_master_key(lid, b"mk")
    for eid in range(per_ledger):
        for lid in range(10):
            data = os.urandom(entry_size)
            e.add_entry(lid, eid, data)
            if lid % 2:
                kept[(lid, eid)] = data
    e.flush()
    before = e.stats().bytes_on_disk
    assert before >= written * 0.9

    for lid in (0, 2, 4, 6, 8):  # interleaved with live ledgers: five separate key ranges
        e.delete_ledger(lid)
    st = e.gc()

    assert before - st.bytes_on_disk >= 0.4 * written, (before, st.bytes_on_disk)
    assert st.bytes_reclaimed >= 0.4 * written
    assert st.gc_runs == 1 and st.ledgers == 5 and st.extra["pending_gc"] == 0
    for (lid, eid), data in kept.items():
        assert e.get_entry(lid, eid) == data
    e = reopen(e)
    try:
        assert list(e.list_ledgers()) == [1, 3, 5, 7, 9]
        for lid in (0, 2, 4, 6, 8):
            with pytest.raises(NoSuchLedgerError):
                e.get_entry(lid, 0)
        for (lid, eid), data in kept.items():
            assert e.get_entry(lid, eid) == data
        assert e.last_entry_id(9) == per_ledger - 1
    finally:
        e.close()


def test_deletions_not_yet_collected_are_collected_after_restart(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path])
    e.open()
    for lid in range(4):
        e.set_master_key(lid, b"mk")
        for eid in range(500):
            e.add_entry(lid, eid, os.urandom(4096))
    e.flush()
    e.delete_ledger(1)
    e.delete_ledger(2)
    e = reopen(e)
    try:
        st = e.stats()
        assert st.extra["pending_gc"] == 2
        st = e.gc()
        assert st.extra["pending_gc"] == 0
        assert st.bytes_reclaimed >= 0.4 * 4 * 500 * 4096
        assert e.gc().gc_runs == 2  # nothing left to do is still a run
    finally:
        e.close()


def test_runs_group_adjacent_deletions_without_live_ledgers_between() -> None:
    assert deletion_runs([1, 2, 3, 7, 9], [5, 8]) == [(1, 3), (7, 7), (9, 9)]
    assert deletion_runs([4, 6], []) == [(4, 6)]
    assert deletion_runs([], [1]) == []


# --- per-ledger state and arguments --------------------------------------------------------------


def test_master_key_cannot_change(engine: RocksDBStorage) -> None:
    engine.set_master_key(1, b"a")
    engine.set_master_key(1, b"a")
    with pytest.raises(UnauthorizedAccessError, match="ledger 1"):
        engine.set_master_key(1, b"b")
    assert engine.get_master_key(1) == b"a"


def test_fencing_or_adding_creates_an_unknown_ledger(engine: RocksDBStorage, tmp_path: Path) -> None:
    assert engine.set_fenced(5) is True
    engine.add_entry(6, 0, b"x")
    assert engine.get_master_key(5) is None and engine.is_fenced(5)
    engine.set_master_key(5, b"later")  # a fence may arrive before the key; the key is kept after
    engine.flush()
    e2 = reopen(engine)
    try:
        assert list(e2.list_ledgers()) == [5, 6]
        assert e2.get_master_key(5) == b"later" and e2.is_fenced(5)
        assert e2.last_entry_id(6) == 0
    finally:
        e2.close()


def test_last_entry_id_stays_within_its_ledger(engine: RocksDBStorage) -> None:
    for lid in (1, 2, 3):
        engine.set_master_key(lid, b"mk")
    engine.add_entry(1, 7, b"a")
    engine.add_entry(3, 2**63, b"b")
    assert engine.last_entry_id(1) == 7
    assert engine.last_entry_id(2) == -1
    assert engine.last_entry_id(3) == 2**63
    engine.delete_ledger(1)
    engine.set_master_key(1, b"again")
    assert engine.last_entry_id(1) == -1
    with pytest.raises(NoSuchEntryError):
        engine.get_entry(1, 7)


def test_bad_ids_are_invalid_arguments(engine: RocksDBStorage) -> None:
    with pytest.raises(InvalidArgumentError):
        engine.add_entry(1, -1, b"x")
    with pytest.raises(InvalidArgumentError):
        engine.set_master_key(2**64, b"k")
    assert not engine.has_ledger(2**64)


def test_closed_engine_refuses_calls(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path])
    with pytest.raises(BookieIOError, match="not open"):
        e.add_entry(1, 0, b"x")
    e.open()
    e.close()
    e.close()
    with pytest.raises(BookieIOError, match="not open"):
        e.flush()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_cache": 1}, "unknown option.*block_cache"),
        ({"compression": "brotli"}, "compression"),
        ({"write_buffer_size": 1024}, "write_buffer_size"),
        ({"wal": "maybe"}, "wal"),  # "yes" is true, as for every plugin (environment overrides are text)
        ({"max_background_jobs": -1}, "max_background_jobs"),
        ({"bytes_per_sync": -1}, "bytes_per_sync"),
        ({"wal_bytes_per_sync": "1MiB"}, "wal_bytes_per_sync"),
        ({"bytes_per_sync": True}, "bytes_per_sync"),
    ],
)
def test_bad_options_are_config_errors(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RocksDBStorage([tmp_path], **options)


def _persisted_db_options(db_dir: Path) -> dict[str, str]:
    """The [DBOptions] section of the newest OPTIONS file RocksDB wrote for the database."""
    newest = max(db_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    values: dict[str, str] = {}
    section = ""
    for line in newest.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[DBOptions]" and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, ("1048576", "1048576")),
        ({"bytes_per_sync": 2 * 1024 * 1024, "wal_bytes_per_sync": 512 * 1024, "wal": True}, ("2097152", "524288")),
        ({"bytes_per_sync": 0, "wal_bytes_per_sync": 0}, ("0", "0")),
    ],
)
def test_bytes_per_sync_reaches_rocksdb(tmp_path: Path, options: dict, expected: tuple[str, str]) -> None:
    e = RocksDBStorage([tmp_path], **options)
    e.open()
    try:
        e.add_entry(1, 0, b"x" * 1000)
        e.flush()
        found = _persisted_db_options(tmp_path / "rocksdb")
        assert (found["bytes_per_sync"], found["wal_bytes_per_sync"]) == expected
    finally:
        e.close()


def test_only_the_first_ledger_dir_is_used(tmp_path: Path) -> None:
    e = RocksDBStorage([tmp_path / "a", tmp_path / "b"], compression="zstd", block_cache_size=0)
    e.open()
    try:
        e.add_entry(1, 0, b"x" * 1000)
        e.flush()
        assert (tmp_path / "a" / "rocksdb" / "CURRENT").exists()
        assert not (tmp_path / "b").exists()
        assert e.stats().extra["compression"] == "zstd"
    finally:
        e.close()


def test_default_compression_is_lz4(engine: RocksDBStorage) -> None:
    assert engine.stats().extra["compression"] == "lz4"


# --- thread safety ----------------------------------------------------------------------------


def test_concurrent_adds_reads_flushes_and_gc(engine: RocksDBStorage) -> None:
    per_writer, writers = 3000, 3
    for lid in range(writers):
        engine.set_master_key(lid, b"mk")
    for lid in (100, 101):
        engine.set_master_key(lid, b"doomed")
        engine.add_entry(lid, 0, b"x" * 1000)
    errors: list[BaseException] = []
    done = threading.Event()

    def guard(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        return run

    def writer(lid: int) -> None:
        for eid in range(per_writer):
            engine.add_entry(lid, eid, payload(lid, eid))

    def reader() -> None:
        while not done.is_set():
            for lid in range(writers):
                last = engine.last_entry_id(lid)
                if last >= 0:
                    assert engine.get_entry(lid, last) == payload(lid, last)

    def checkpointer() -> None:
        engine.delete_ledger(100)
        engine.gc()
        fenced_first = engine.set_fenced(200 + writers)
        while not done.is_set():
            engine.flush()
            assert engine.set_fenced(200 + writers) is False
        assert fenced_first
        engine.delete_ledger(101)
        engine.gc()

    threads = [threading.Thread(target=guard(lambda lid=lid: writer(lid))) for lid in range(writers)]
    others = [threading.Thread(target=guard(reader)), threading.Thread(target=guard(checkpointer))]
    for t in threads + others:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for t in others:
        t.join()
    assert not errors, errors
    st = engine.stats()
    assert st.entries_written == writers * per_writer + 2
    assert st.gc_runs == 2
    assert list(engine.list_ledgers()) == [0, 1, 2, 200 + writers]
    for lid in range(writers):
        assert engine.last_entry_id(lid) == per_writer - 1
        for eid in range(0, per_writer, 97):
            assert engine.get_entry(lid, eid) == payload(lid, eid)
