"""Behaviour of the ``entrylog`` engine beyond the conformance suite: crash safety with real
SIGKILLed processes, detection of on-disk damage, space reclamation by GC and compaction."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.api.files import OsStorageFile, OsStorageFiles
from ledgerstore.errors import (
    BookieDiskFullError,
    BookieIOError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_entrylog.entrylog import LogScanner

TINY = {"write_buffer_size": 4096, "entry_log_size_limit": 64 * 1024, "page_size": 256, "page_limit_bytes": 4096}

# Deterministic entry contents, shared with the child processes (which exec this source).
PAYLOAD_SRC = '''
import hashlib
def payload(ledger_id, entry_id, size=None):
    if size is None:
        size = (entry_id * 7919 + ledger_id * 31) % 3000
    seed = hashlib.blake2b(b"%d/%d" % (ledger_id, entry_id)).digest()
    return (seed * (size // len(seed) + 1))[:size]
'''
_ns: dict = {}
exec(PAYLOAD_SRC, _ns)
payload = _ns["payload"]


def log_files(root: Path) -> set[str]:
    return {p.name for p in root.rglob("entrylog-*.log")}


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def run_child(src: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PAYLOAD_SRC + src, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def engine_dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "d0", tmp_path / "d1"]


# --- (a) a SIGKILL after flush() loses nothing that flush() covered -----------------------------

ADDER = '''
import sys
from collections.abc import Callable
from pathlib import Path
from ledgerstore_entrylog import EntryLogStorage
dirs = [Path(p) for p in sys.argv[1].split(",")]
e = EntryLogStorage(dirs, write_buffer_size=4096, entry_log_size_limit=65536, page_size=256,
                    page_limit_bytes=4096)
e.open()
for lid in range(5):
    e.set_master_key(lid, b"key-%d" % lid)
i = 0
flush_at = int(sys.argv[2])
while True:
    lid, eid = i % 5, i // 5
    e.add_entry(lid, eid, payload(lid, eid))
    i += 1
    if i == flush_at:
        e.set_fenced(3)
        e.flush()
        print("FLUSHED", i, flush=True)
    if i == flush_at + 20000:
        print("STILL-ADDING", flush=True)
'''


@pytest.mark.parametrize("flush_at", [3000, 7777])
def test_entries_flushed_before_sigkill_survive(engine_dirs: list[Path], flush_at: int) -> None:
    proc = run_child(ADDER, ",".join(map(str, engine_dirs)), str(flush_at))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.split() == ["FLUSHED", str(flush_at)], line + proc.stderr.read()  # type: ignore[union-attr]
        assert proc.stdout.readline().strip() == "STILL-ADDING"
    finally:
        kill(proc)
    e = EntryLogStorage(engine_dirs, **TINY)
    e.open()
    try:
        assert sorted(e.list_ledgers()) == [0, 1, 2, 3, 4]
        assert e.get_master_key(2) == b"key-2"
        assert e.is_fenced(3)
        for i in range(flush_at):
            lid, eid = i % 5, i // 5
            assert e.get_entry(lid, eid) == payload(lid, eid), (lid, eid)
        # Entries added after the checkpoint may or may not be there, but never wrong.
        for i in range(flush_at, flush_at + 20000):
            lid, eid = i % 5, i // 5
            try:
                assert e.get_entry(lid, eid) == payload(lid, eid), (lid, eid)
            except NoSuchEntryError:
                pass
        # The journal would now replay everything after its mark: re-adding is idempotent.
        for i in range(flush_at - 50, flush_at + 50):
            lid, eid = i % 5, i // 5
            e.add_entry(lid, eid, payload(lid, eid))
            assert e.get_entry(lid, eid) == payload(lid, eid)
    finally:
        e.close()


# --- (a') a full disk fails a flush without losing anything: the retried flush covers it all -----

DISK_FULL = '''
import errno, os, sys, time
from collections.abc import Callable
from pathlib import Path
from ledgerstore.errors import BookieDiskFullError
from ledgerstore_entrylog import EntryLogStorage
e = EntryLogStorage([Path(sys.argv[1])], write_buffer_size=1 << 20, page_size=256, page_limit_bytes=1 << 20,
                    flush_entrylog_bytes=0)
e.open()
ledgers = range(150)  # more than one chunk of the flush's index pass
for eid in range(8):
    e.add_entries(1000, [(eid, payload(1000, eid))])
e.flush()
for eid in range(8, 16):
    for lid in ledgers:
        e.add_entry(lid, eid - 8, payload(lid, eid - 8))
    e.add_entry(1000, eid, payload(1000, eid))
real, calls, ok_calls = os.pwrite, [0], int(sys.argv[2])
def full_disk(fd, data, offset):
    calls[0] += 1
    if calls[0] > ok_calls:
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(fd, data, offset)
os.pwrite = full_disk
try:
    e.flush()
except BookieDiskFullError as exc:
    print("FULL", exc, flush=True)
os.pwrite = real
if sys.argv[3] == "crash":
    time.sleep(60)
e.flush()
print("FLUSHED", calls[0], flush=True)
time.sleep(60)
'''


@pytest.mark.parametrize("ok_writes", [0, 1, 40, 140])
def test_a_full_disk_fails_a_flush_and_the_retry_makes_everything_durable(tmp_path: Path, ok_writes: int) -> None:
    """ENOSPC from a write is not a failed fsync: the engine keeps what did not fit and the next
    flush writes it. ``ok_writes`` writes succeed first: none, the entry log only, the log and
    some index pages of the first chunk of ledgers, or of the second. Then the process is
    SIGKILLed: every entry the retried flush covered is read back."""
    proc = run_child(DISK_FULL, str(tmp_path), str(ok_writes), "retry")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("FULL write to "), line + proc.stderr.read()  # type: ignore[union-attr]
        assert "No space left on device" in line
        line = proc.stdout.readline()
        assert line.startswith("FLUSHED"), line + proc.stderr.read()  # type: ignore[union-attr]
    finally:
        kill(proc)
    e = EntryLogStorage([tmp_path], page_size=256)
    e.open()
    try:
        assert sorted(e.list_ledgers()) == [*range(150), 1000]
        for eid in range(16):
            assert e.get_entry(1000, eid) == payload(1000, eid), eid
        for lid in range(150):
            for eid in range(8):
                assert e.get_entry(lid, eid) == payload(lid, eid), (lid, eid)
    finally:
        e.close()


@pytest.mark.parametrize("ok_writes", [1, 40])
def test_a_crash_after_a_flush_found_the_disk_full_still_reopens(tmp_path: Path, ok_writes: int) -> None:
    """SIGKILL between the failed flush and its retry: the index files that flush created but
    could not write are empty; the engine opens (the journal still holds their entries) and
    everything the earlier flush covered is there."""
    proc = run_child(DISK_FULL, str(tmp_path), str(ok_writes), "crash")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("FULL write to "), line + proc.stderr.read()  # type: ignore[union-attr]
    finally:
        kill(proc)
    if ok_writes == 1:  # the first index write failed: its file was created, nothing in it
        assert any(p.stat().st_size == 0 for p in tmp_path.rglob("*.idx"))
    e = EntryLogStorage([tmp_path], page_size=256)
    e.open()
    try:
        for eid in range(8):
            assert e.get_entry(1000, eid) == payload(1000, eid), eid
    finally:
        e.close()
    assert not any(p.stat().st_size == 0 for p in tmp_path.rglob("*.idx"))


# --- (b) damage is detected, never served --------------------------------------------------------


def _write_some(dirs: list[Path], n: int = 200) -> None:
    e = EntryLogStorage(dirs)
    e.open()
    for lid in (1, 2):
        e.set_master_key(lid, b"secret")
        for eid in range(n):
            e.add_entry(lid, eid, payload(lid, eid, 500))
    e.close()


def test_flipped_bytes_in_entry_log_raise_bookie_io_error(tmp_path: Path) -> None:
    _write_some([tmp_path])
    target = payload(2, 77, 500)
    (log_path,) = [p for p in (tmp_path / "current").glob("entrylog-*.log") if target in p.read_bytes()]
    raw = bytearray(log_path.read_bytes())
    pos = raw.find(target)
    raw[pos + 100] ^= 0xFF
    log_path.write_bytes(bytes(raw))
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        with pytest.raises(BookieIOError) as err:
            e.get_entry(2, 77)
        msg = str(err.value)
        assert str(log_path) in msg and "ledger 2" in msg and "entry 77" in msg
        assert f"offset {pos - 24}" in msg
        assert e.get_entry(2, 76) == payload(2, 76, 500)
        assert e.get_entry(1, 77) == payload(1, 77, 500)
    finally:
        e.close()


def test_flipped_ledger_id_in_record_header_is_detected(tmp_path: Path) -> None:
    _write_some([tmp_path])
    target = payload(1, 10, 500)
    log_path = next((tmp_path / "current").glob("entrylog-*.log"))
    raw = bytearray(log_path.read_bytes())
    pos = raw.find(target)
    raw[pos - 9] ^= 0x01  # low byte of the record's ledger id
    log_path.write_bytes(bytes(raw))
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        with pytest.raises(BookieIOError, match="ledger 1 entry 10"):
            e.get_entry(1, 10)
    finally:
        e.close()


def test_flipped_bytes_in_index_header_fail_open_naming_the_file(tmp_path: Path) -> None:
    _write_some([tmp_path])
    (idx,) = [p for p in (tmp_path / "current" / "index").rglob("*.idx") if p.name == f"{2:016x}.idx"]
    raw = bytearray(idx.read_bytes())
    raw[30] ^= 0x40  # inside the master key
    idx.write_bytes(bytes(raw))
    e = EntryLogStorage([tmp_path])
    with pytest.raises(BookieIOError) as err:
        e.open()
    assert str(idx) in str(err.value)


# --- (c) GC reclaims logs that hold no live ledger -----------------------------------------------


def test_gc_reclaims_space_of_deleted_ledgers(tmp_path: Path) -> None:
    size, per_ledger = 16 * 1024, 384  # 10 ledgers x 6 MiB
    e = EntryLogStorage([tmp_path], entry_log_size_limit=4 * 1024 * 1024)
    e.open()
    try:
        for lid in range(10):
            e.set_master_key(lid, b"mk")
            for eid in range(per_ledger):
                e.add_entry(lid, eid, payload(lid, eid, size))
        e.flush()
        written = 10 * per_ledger * size
        before = e.stats().bytes_on_disk
        assert before >= written
        for lid in range(5):
            e.delete_ledger(lid)
        st = e.gc()
        assert before - st.bytes_on_disk >= 0.4 * written, (before, st.bytes_on_disk)
        assert st.bytes_reclaimed >= 0.4 * written
        assert st.gc_runs == 1
        assert disk_bytes(tmp_path) <= st.bytes_on_disk + 64 * 1024
        for lid in range(5, 10):
            for eid in range(per_ledger):
                assert e.get_entry(lid, eid) == payload(lid, eid, size)
    finally:
        e.close()
    e = EntryLogStorage([tmp_path], entry_log_size_limit=4 * 1024 * 1024)
    e.open()
    try:
        assert list(e.list_ledgers()) == [5, 6, 7, 8, 9]
        with pytest.raises(NoSuchLedgerError):
            e.get_entry(0, 0)
        for lid in range(5, 10):
            assert e.last_entry_id(lid) == per_ledger - 1
            assert e.get_entry(lid, per_ledger - 1) == payload(lid, per_ledger - 1, size)
    finally:
        e.close()


def test_gc_reclaims_deleted_ledgers_of_the_active_log_while_serving(tmp_path: Path) -> None:
    """Ten interleaved ledgers, all in the one active log (it rolls only at 1 GiB); nine are
    deleted. One GC pass gives their space back without a restart: the active log is finished
    and compacted, the survivor stays readable, and adds go on into the new active log."""
    size, per_ledger = 4096, 256  # 10 MiB in all
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        for lid in range(10):
            e.set_master_key(lid, b"mk")
        for eid in range(per_ledger):
            for lid in range(10):
                e.add_entry(lid, eid, payload(lid, eid, size))
        e.flush()
        assert len(log_files(tmp_path)) == 1
        for lid in range(9):
            e.delete_ledger(lid)
        live = per_ledger * size
        st = e.gc()
        assert st.bytes_on_disk <= 1.2 * live + 128 * 1024, (st.bytes_on_disk, live)
        assert disk_bytes(tmp_path) <= 1.2 * live + 256 * 1024
        for eid in range(per_ledger):
            assert e.get_entry(9, eid) == payload(9, eid, size)
        e.add_entry(9, per_ledger, payload(9, per_ledger, size))
        assert e.get_entry(9, per_ledger) == payload(9, per_ledger, size)
    finally:
        e.close()


def test_gc_leaves_an_active_log_that_is_mostly_live(tmp_path: Path) -> None:
    e = _interleaved([tmp_path], entries=1000, size=1024)
    try:
        e.delete_ledger(1)  # half the log is dead: above the minor threshold (0.2 live)
        logs = log_files(tmp_path)
        e.gc()
        assert log_files(tmp_path) == logs
    finally:
        e.close()


# --- (d) compaction copies live entries forward and deletes the old logs -------------------------


def _interleaved(dirs: list[Path], entries: int = 3000, size: int = 1024, **opts: int) -> EntryLogStorage:
    e = EntryLogStorage(dirs, **opts)
    e.open()
    for lid in (1, 2):
        e.set_master_key(lid, b"mk")
    for eid in range(entries):
        for lid in (1, 2):
            e.add_entry(lid, eid, payload(lid, eid, size))
    e.flush()
    return e


def test_major_compaction_moves_survivor_and_deletes_old_logs(tmp_path: Path) -> None:
    opts = {"entry_log_size_limit": 256 * 1024, "page_size": 1024, "page_limit_bytes": 8192}
    e = _interleaved([tmp_path], **opts)
    try:
        old_logs = log_files(tmp_path)
        assert len(old_logs) > 10
        e.delete_ledger(1)
        before = e.stats()
        e.gc()  # minor compaction (0.2) leaves half-live logs alone
        assert log_files(tmp_path) >= old_logs - {max(old_logs)}
        st = e.compact(e.major_compaction_threshold)
        remaining = log_files(tmp_path)
        # Every finished log was compacted; only the log active before compaction may remain.
        assert len(old_logs & remaining) <= 1
        assert st.extra["compactions"] >= len(old_logs) - 1
        assert st.bytes_on_disk < 0.6 * before.bytes_on_disk
        for eid in range(3000):
            assert e.get_entry(2, eid) == payload(2, eid, 1024)
        with pytest.raises(NoSuchLedgerError):
            e.get_entry(1, 0)
    finally:
        e.close()
    e = EntryLogStorage([tmp_path], **opts)
    e.open()
    try:
        assert e.last_entry_id(2) == 2999
        for eid in range(3000):
            assert e.get_entry(2, eid) == payload(2, eid, 1024)
    finally:
        e.close()


def test_compaction_keeps_entries_readded_while_it_runs(tmp_path: Path) -> None:
    """Adds and reads go on during compaction; an entry re-added meanwhile keeps its new copy."""
    opts = {"entry_log_size_limit": 128 * 1024, "page_size": 512, "page_limit_bytes": 4096}
    e = _interleaved([tmp_path], entries=2000, size=512, **opts)
    e.delete_ledger(1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        rnd = random.Random(1)
        try:
            while not stop.is_set():
                eid = rnd.randrange(2000)
                e.add_entry(2, eid, payload(2, eid, 512))
                assert e.get_entry(2, rnd.randrange(2000)) is not None
                e.add_entry(3, eid, payload(3, eid, 100))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    try:
        e.compact(0.8)
        e.compact(0.8)
    finally:
        stop.set()
        t.join()
    try:
        assert not errors, errors
        for eid in range(2000):
            assert e.get_entry(2, eid) == payload(2, eid, 512)
    finally:
        e.close()


class _FaultyFiles(OsStorageFiles):
    """The operating system's files, with two faults of a disk: reads of one file covering one
    offset come back with a bit of that byte flipped (while ``flip_armed``), and writes to index
    files fail with EIO (while ``fail_index_writes``)."""

    def __init__(self) -> None:
        self.target: tuple[str, int] | None = None
        self.flip_armed = False
        self.flipped = 0
        self.fail_index_writes = False
        self.failed_writes = 0

    def open(self, path: Path, **kw: Any) -> OsStorageFile:
        f = super().open(path, **kw)
        files = self
        flip_at = self.target[1] if self.target is not None and path.name == self.target[0] else None
        index = path.suffix == ".idx"
        if flip_at is None and not index:
            return f

        class Faulty(OsStorageFile):
            def pread(self, size: int, offset: int, /) -> bytes:
                raw = super().pread(size, offset)
                if flip_at is not None and files.flip_armed and offset <= flip_at < offset + len(raw):
                    files.flipped += 1
                    b = bytearray(raw)
                    b[flip_at - offset] ^= 0x40
                    return bytes(b)
                return raw

            def pwrite(self, data: Any, offset: int, /) -> int:
                if index and files.fail_index_writes:
                    files.failed_writes += 1
                    raise OSError(errno.EIO, "Input/output error (injected)", str(path))
                return super().pwrite(data, offset)

        g = Faulty(f.fd)
        f.fd = -1  # the descriptor now belongs to the faulty file
        return g


def test_compaction_keeps_a_log_whose_scan_stopped_at_a_flipped_record_length(tmp_path: Path) -> None:
    """A bit flipped in a record's length makes the record run past the end of its log, which the
    scan takes for a torn tail: compaction must not then delete the log with the live entries
    after it (the index still points at them). Found by the simulation (seed 619)."""
    files = _FaultyFiles()
    opts = {"entry_log_size_limit": 128 * 1024, "page_size": 512, "page_limit_bytes": 4096}
    e = EntryLogStorage([tmp_path], files=files, **opts)
    e.open()
    try:
        for lid in (1, 2):
            e.set_master_key(lid, b"mk")
        for eid in range(600):
            for lid in (1, 2):
                e.add_entry(lid, eid, payload(lid, eid, 512))
        e.flush()
        first = min(tmp_path.rglob("entrylog-*.log"))
        with first.open("rb") as fh:
            f = OsStorageFile(os.dup(fh.fileno()))
            try:
                records = list(LogScanner(f, first.stat().st_size, first))
            finally:
                f.close()
        victim = next(r for r in records[len(records) // 2:] if r.ledger_id == 2)
        # the high byte of the big-endian length: the record now runs far past the end of the log
        files.target = (first.name, victim.offset)
        e.close()
        e = EntryLogStorage([tmp_path], files=files, **opts)
        e.open()
        e.delete_ledger(1)  # half of every log is dead: a candidate for compaction
        files.flip_armed = True
        e.compact(0.8)
        assert files.flipped, "the compaction never read the damaged record"
        assert first.exists(), "compaction deleted a log the index still points into"
        files.flip_armed = False
        for eid in range(600):
            assert e.get_entry(2, eid) == payload(2, eid, 512)
    finally:
        e.close()


def test_gc_keeps_a_log_whose_map_was_scanned_short_while_the_index_points_past_it(tmp_path: Path) -> None:
    """A log without a ledger map (the one active at a crash) is scanned at open; a bit flipped in
    a record's length stops that scan early, as a torn tail would, and the map misses the ledgers
    after it. GC deletes a log whose mapped ledgers are all deleted: it must first ask the index."""
    files = _FaultyFiles()
    opts = {"entry_log_size_limit": 1 << 20, "page_size": 512, "page_limit_bytes": 4096}
    e = EntryLogStorage([tmp_path], files=files, **opts)
    e.open()
    for lid in (1, 2):
        e.set_master_key(lid, b"mk")
        for eid in range(200):  # ledger 1's records, then ledger 2's, in one log
            e.add_entry(lid, eid, payload(lid, eid, 512))
    e.flush()
    e.close()
    first = min(tmp_path.rglob("entrylog-*.log"))
    with first.open("rb") as fh:
        f = OsStorageFile(os.dup(fh.fileno()))
        try:
            victim = next(r for r in LogScanner(f, first.stat().st_size, first) if r.ledger_id == 2)
        finally:
            f.close()
    first.with_suffix(".lmap").unlink()  # as if the process died before it finished the log
    files.target = (first.name, victim.offset)
    files.flip_armed = True
    e = EntryLogStorage([tmp_path], files=files, **opts)
    e.open()  # the scan stops at ledger 2's first record: the map knows only ledger 1
    files.flip_armed = False
    try:
        assert files.flipped
        e.delete_ledger(1)
        e.gc()
        assert first.exists(), "GC deleted a log the index still points into"
        for eid in range(200):
            assert e.get_entry(2, eid) == payload(2, eid, 512)
    finally:
        e.close()


def test_a_compaction_checkpoint_that_fails_makes_every_later_flush_fail(tmp_path: Path) -> None:
    """Compaction checkpoints between its steps. When that checkpoint's index write fails, the
    pages it took are not on disk: a later flush must not then report everything durable (the
    bookie would trim its journal past entries whose index never reached the disk). Found by the
    simulation (seed 1441: a bookie lost a whole ledger at its next crash)."""
    files = _FaultyFiles()
    opts = {"entry_log_size_limit": 128 * 1024, "page_size": 512, "page_limit_bytes": 1 << 20}
    e = EntryLogStorage([tmp_path], files=files, **opts)
    e.open()
    try:
        for lid in (1, 2, 3):
            e.set_master_key(lid, b"mk")
        for eid in range(600):
            for lid in (1, 2):
                e.add_entry(lid, eid, payload(lid, eid, 512))
        e.flush()
        e.delete_ledger(1)  # half of every log is dead: compaction has work
        for eid in range(50):
            e.add_entry(3, eid, payload(3, eid, 100))  # index pages dirty, not yet flushed
        files.fail_index_writes = True
        with pytest.raises(BookieIOError):
            e.compact(0.8)
        assert files.failed_writes
        files.fail_index_writes = False
        with pytest.raises(BookieIOError, match="an earlier flush failed"):
            e.flush()
    finally:
        with contextlib.suppress(BookieIOError):
            e.close()


# --- (e) a SIGKILL at any moment of a compaction loses nothing ----------------------------------

COMPACTOR = '''
import sys
from collections.abc import Callable
from pathlib import Path
from ledgerstore_entrylog import EntryLogStorage
e = EntryLogStorage([Path(sys.argv[1])], entry_log_size_limit=256 * 1024, page_size=512,
                    page_limit_bytes=4096)
e.open()
print("OPEN", flush=True)
e.compact(0.8)
print("DONE", flush=True)
e.close()
'''


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_sigkill_during_compaction_loses_nothing(tmp_path: Path, seed: int) -> None:
    opts = {"entry_log_size_limit": 256 * 1024, "page_size": 512, "page_limit_bytes": 4096}
    e = _interleaved([tmp_path], entries=4000, size=1024, **opts)
    e.delete_ledger(1)
    e.close()
    proc = run_child(COMPACTOR, str(tmp_path))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "OPEN", proc.stderr.read()  # type: ignore[union-attr]
        # Wait for the first compaction intent file, then strike somewhere inside the run
        # (the whole compaction takes about 0.1-0.2 s here).
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("current/*.compacting")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(random.Random(seed).uniform(0.0, 0.1))
    finally:
        kill(proc)
    for _ in range(2):  # reopen after the crash, then once more after finishing the compaction
        e = EntryLogStorage([tmp_path], **opts)
        e.open()
        try:
            assert list(e.list_ledgers()) == [2]
            assert e.last_entry_id(2) == 3999
            for eid in range(4000):
                assert e.get_entry(2, eid) == payload(2, eid, 1024), eid
            e.compact(0.8)
            for eid in range(0, 4000, 7):
                assert e.get_entry(2, eid) == payload(2, eid, 1024), eid
        finally:
            e.close()
    assert not list(tmp_path.rglob("*.compacting"))


# --- smaller contracts ---------------------------------------------------------------------------


def test_entry_still_in_write_buffer_is_readable_and_counted(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        e.add_entry(7, 0, b"buffered")
        assert e.get_entry(7, 0) == b"buffered"
        log = next((tmp_path / "current").glob("entrylog-*.log"))
        assert log.stat().st_size == 0  # nothing reached the file yet: it came from the buffer
        assert e.stats().entries_written == 1
    finally:
        e.close()


def test_other_master_key_is_refused(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        e.set_master_key(1, b"a")
        with pytest.raises(UnauthorizedAccessError):
            e.set_master_key(1, b"b")
    finally:
        e.close()


def test_ledgers_spread_over_directories(engine_dirs: list[Path]) -> None:
    e = EntryLogStorage(engine_dirs)
    e.open()
    try:
        for lid in range(4):
            e.add_entry(lid, 0, payload(lid, 0))
        e.flush()
        for d in engine_dirs:
            assert len(list((d / "current" / "index").rglob("*.idx"))) == 2
            assert log_files(d)
    finally:
        e.close()


def test_background_flush_interval_writes_without_an_explicit_flush(tmp_path: Path) -> None:
    e = EntryLogStorage([tmp_path], flush_interval=0.05)
    e.open()
    try:
        e.set_master_key(9, b"mk")
        e.add_entry(9, 0, b"later")
        idx = tmp_path / "current" / "index" / "09" / f"{9:016x}.idx"
        deadline = time.monotonic() + 10
        while not (idx.exists() and e.stats().extra["cache_dirty_pages"] == 0):
            assert time.monotonic() < deadline, "the background flush never ran"
            time.sleep(0.01)
        log = next((tmp_path / "current").glob("entrylog-*.log"))
        assert log.stat().st_size > 0
    finally:
        e.close()


def test_unknown_option_is_a_config_error(tmp_path: Path) -> None:
    from ledgerstore.errors import ConfigError

    with pytest.raises(ConfigError, match="write_bufer_size"):
        EntryLogStorage([tmp_path], write_bufer_size=10)


@pytest.fixture
def tiny_disk(tmpfs: Callable[[int], Path]) -> Path:
    """A 16 MiB file system of the test's own (tmpfs)."""
    return tmpfs(16)


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "buffered"])
def test_gc_on_a_disk_full_to_the_last_byte_gives_the_space_back(tiny_disk: Path, flushed: bool) -> None:
    """A disk filled to the last byte, then the ledger holding it deleted: one GC pass gives the
    space back, although finishing the mostly-dead active log wants to write (its buffer, its
    ledger map, the next log) before the dead logs are deleted, and adds work again after it.
    ``buffered``: the active log still holds records the full disk refused (a bookie whose flush
    failed), so finishing it fails; GC leaves it active and deletes the dead logs all the same."""
    size = 64 * 1024
    e = EntryLogStorage([tiny_disk / "ledgers"], entry_log_size_limit=2 * 1024 * 1024,
                        write_buffer_size=4 * 1024 * 1024)
    e.open()
    try:
        e.set_master_key(0, b"mk")
        for eid in range(180):  # 11.25 MiB: five finished 2 MiB logs and 1.25 MiB in the active one
            e.add_entry(0, eid, payload(0, eid, size))
        if flushed:
            e.flush()
        with open(tiny_disk / "ballast", "wb", buffering=0) as fh:  # the rest of the disk, to the last byte
            with pytest.raises(OSError):
                while True:
                    fh.write(b"\0" * 4096)
        e.delete_ledger(0)
        st = e.gc()
        assert st.bytes_reclaimed >= 9.5 * 1024 * 1024, st  # at least the five finished logs
        e.set_master_key(1, b"mk")
        e.add_entry(1, 0, payload(1, 0))
        e.flush()
        assert e.get_entry(1, 0) == payload(1, 0)
    finally:
        e.close()


def test_a_dirty_page_whose_eviction_meets_a_full_disk_stays_cached(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache eviction writes the log buffer and then the dirty page; when the disk is full the
    add that needed the room fails, and the evicted page must stay cached and dirty: dropped,
    the slots of entries added (and acknowledged) before were lost, and reading them back
    found nothing. (Found by the simulation: a bookie with an ENOSPC spell lost entries.)"""
    e = EntryLogStorage([tmp_path], page_size=64, page_limit_bytes=128, write_buffer_size=64 * 1024,
                        flush_entrylog_bytes=0)  # two pages of 8 slots in the cache
    e.open()
    try:
        for lid in (1, 2):
            e.add_entries(lid, [(eid, payload(lid, eid)) for eid in range(8)])
        real = os.pwrite

        def full(fd: int, data: Any, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        with pytest.raises(BookieDiskFullError):
            e.add_entry(3, 0, payload(3, 0))  # a third page: evicts ledger 1's dirty page
        monkeypatch.setattr(os, "pwrite", real)
        assert [e.get_entry(1, eid) for eid in range(8)] == [payload(1, eid) for eid in range(8)]
        e.flush()
    finally:
        e.close()
    again = EntryLogStorage([tmp_path], page_size=64, page_limit_bytes=128)
    again.open()
    try:
        assert [again.get_entry(lid, eid) for lid in (1, 2) for eid in range(8)] == \
            [payload(lid, eid) for lid in (1, 2) for eid in range(8)]
    finally:
        again.close()
