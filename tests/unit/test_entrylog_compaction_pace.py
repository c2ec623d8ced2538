"""The entrylog engine's compaction throttle (``compaction_rate_by_bytes``,
``compaction_rate_by_entries``): a compaction sleeps between batches, with no lock held, as long
as it is ahead of a rate, counting every record it reads (dead ones too). Time is faked here: the
tests count the seconds the compaction asks to sleep, never how long it took."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from ledgerstore.api.files import OsStorageFile
from ledgerstore.errors import BookieIOError, ConfigError
from ledgerstore_entrylog import EntryLogStorage
from ledgerstore_entrylog import compactor as compactor_module

MiB = 1024 * 1024


class FakeTime:
    """``time.monotonic`` and ``time.sleep`` of the compactor: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if seconds == 0:
            return  # the compactor's yield of the GIL between batches when other threads run, not pacing
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(compactor_module, "time", fake)
    return fake


def test_the_pace_sleeps_only_while_ahead_of_either_rate(fake_time: FakeTime) -> None:
    pace = compactor_module.Pace(bytes_per_s=1 * MiB, entries_per_s=1000)
    pace.start()
    assert pace.step(MiB // 2, 10) == pytest.approx(0.5)  # ahead of the bytes rate
    fake_time.now += 2.0  # slower than both rates meanwhile (the disk, the lock)
    assert pace.step(MiB // 2, 10) == 0.0
    assert pace.step(0, 3000) == pytest.approx(3.02 - 2.5)  # now ahead of the entries rate
    unthrottled = compactor_module.Pace()
    unthrottled.start()
    assert unthrottled.unthrottled and unthrottled.step(10 * MiB, 100_000) == 0.0


def write_two_ledgers(path: Path, **options: float) -> EntryLogStorage:
    """Two ledgers of 2 MiB each interleaved in one finished log, ledger 2 deleted: the log is
    half dead, a compaction candidate."""
    e = EntryLogStorage([path], flush_entrylog_bytes=0, **options)
    e.open()
    for start in range(0, 2048, 64):
        for lid in (1, 2):
            e.add_entries(lid, [(eid, bytes(1000)) for eid in range(start, start + 64)])
    e.flush()
    e.close()
    e = EntryLogStorage([path], flush_entrylog_bytes=0, **options)
    e.open()
    e.delete_ledger(2)
    return e


def test_a_compaction_reads_its_log_at_the_configured_rate(tmp_path: Path, fake_time: FakeTime) -> None:
    e = write_two_ledgers(tmp_path, compaction_rate_by_bytes=1 * MiB)
    try:
        e.compact(0.8)
        assert e.stats().extra["compactions"] == 1
        # every record read counts, the dead half too: about 4 MiB of records at 1 MiB/s
        assert 3.9 <= sum(fake_time.slept) <= 4.2, sum(fake_time.slept)
        assert len(fake_time.slept) > 10  # paced between batches, not once at the end
        assert e.get_entry(1, 2047) == bytes(1000)
    finally:
        e.close()


def test_a_compaction_can_be_paced_by_records(tmp_path: Path, fake_time: FakeTime) -> None:
    e = write_two_ledgers(tmp_path, compaction_rate_by_bytes=math.inf, compaction_rate_by_entries=1000)
    try:
        e.compact(0.8)
        assert 4.0 <= sum(fake_time.slept) <= 4.2, sum(fake_time.slept)  # 4,096 records at 1,000/s
    finally:
        e.close()


def test_an_unthrottled_compaction_never_sleeps(tmp_path: Path, fake_time: FakeTime) -> None:
    e = write_two_ledgers(tmp_path, compaction_rate_by_bytes=math.inf)
    try:
        e.compact(0.8)
        assert e.stats().extra["compactions"] == 1 and fake_time.slept == []
    finally:
        e.close()


@pytest.mark.parametrize("name", ["compaction_rate_by_bytes", "compaction_rate_by_entries", "delete_rate_by_bytes"])
@pytest.mark.parametrize("rate", [0, -1, "fast"])
def test_a_rate_of_zero_or_below_is_a_one_line_config_error(tmp_path: Path, name: str, rate: object) -> None:
    with pytest.raises(ConfigError, match=f"option '{name}' = .* (is out of range: must be|is not) a number >= 1") as err:
        EntryLogStorage([tmp_path], **{name: rate})
    assert "\n" not in str(err.value)


def start_slow_compaction(e: EntryLogStorage) -> threading.Thread:
    """Compact ``e`` in a thread; return once the pass is copying (it holds ``flush_mutex``
    and has slept at least once)."""
    worker = threading.Thread(target=e.compact, args=(0.8,), name="slow-compaction", daemon=True)
    state = e.parts.state
    started = state.counters.compactions
    worker.start()
    deadline = time.monotonic() + 30
    while not (state.flush_mutex.locked() and e.parts.compactor.pace._bytes > 0):
        assert worker.is_alive() or state.counters.compactions > started, "the compaction ended before it was seen"
        assert time.monotonic() < deadline, "the compaction did not start"
        time.sleep(0.01)
    return worker


# At 64 KiB/s the compaction of write_two_ledgers' 4 MiB log takes about a minute: a flush or a
# close that waited out the pass would take that long.
SLOW = 64 * 1024


def test_a_flush_does_not_wait_out_a_throttled_compaction(tmp_path: Path) -> None:
    e = write_two_ledgers(tmp_path, compaction_rate_by_bytes=SLOW)
    try:
        worker = start_slow_compaction(e)
        e.add_entries(1, [(2048, b"added during the compaction")])
        t0 = time.monotonic()
        e.flush()
        took = time.monotonic() - t0
        # the compaction checkpointed for the flush between two batches, and goes on
        assert took < 10, f"flush() waited {took:.1f}s for the compaction"
        assert worker.is_alive() and e.stats().extra["compactions"] == 0
    finally:
        t0 = time.monotonic()
        e.close()
        took = time.monotonic() - t0
    worker.join(timeout=30)
    assert not worker.is_alive()
    # the close made the pass finish at full speed rather than at its rate
    assert took < 20, f"close() waited {took:.1f}s for the compaction"
    assert e.stats().extra["compactions"] == 1
    e = EntryLogStorage([tmp_path])
    e.open()
    try:
        assert e.get_entry(1, 2048) == b"added during the compaction"
        assert all(e.get_entry(1, eid) == bytes(1000) for eid in range(0, 2048, 97))
    finally:
        e.close()


def test_a_flush_waiting_on_a_compaction_fails_as_the_compactions_checkpoint_did(tmp_path: Path) -> None:
    e = write_two_ledgers(tmp_path, compaction_rate_by_bytes=SLOW)
    try:
        worker = start_slow_compaction(e)
        e.parts.state.flush_failure = "fdatasync of an entry log failed: injected"
        with pytest.raises(BookieIOError, match="an earlier flush failed .*injected"):
            e.flush()
    finally:
        e.close()
    worker.join(timeout=30)
    assert not worker.is_alive()


def dead_log_of_two_mib(path: Path, **options: float) -> EntryLogStorage:
    """An engine over ``path`` whose one finished log (2 MiB of ledger 2, 1 KiB of ledger 1)
    holds only a deleted ledger's entries once ledger 1's entry moved on: GC deletes it whole."""
    e = EntryLogStorage([path], flush_entrylog_bytes=0, compaction_rate_by_bytes=math.inf, **options)
    e.open()
    e.add_entries(2, [(eid, bytes(1000)) for eid in range(2048)])
    e.flush()
    e.close()
    e = EntryLogStorage([path], flush_entrylog_bytes=0, compaction_rate_by_bytes=math.inf, **options)
    e.open()
    e.add_entries(1, [(0, b"live")])
    e.delete_ledger(2)
    return e


def log_files(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "current").iterdir() if p.is_file())


def test_gc_deletes_a_large_log_in_durable_steps_at_the_delete_rate(
        tmp_path: Path, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compactor_module, "_DELETE_STEP_BYTES", 256 * 1024)
    e = dead_log_of_two_mib(tmp_path, delete_rate_by_bytes=1 * MiB)
    steps: list[int] = []
    truncate = OsStorageFile.truncate

    def counting(self: OsStorageFile, size: int) -> None:
        steps.append(size)
        truncate(self, size)

    monkeypatch.setattr(OsStorageFile, "truncate", counting)
    try:
        before = e.stats().bytes_reclaimed
        e.gc()
        # the log shrank from its end a step at a time, down to nothing, then went
        assert len(steps) >= 8 and steps == sorted(steps, reverse=True) and steps[-1] == 0
        assert 1.8 <= sum(fake_time.slept) <= 2.3, sum(fake_time.slept)  # about 2 MiB at 1 MiB/s
        assert e.stats().bytes_reclaimed - before > 2 * MiB
        assert not [n for n in log_files(tmp_path) if n.endswith(".deleting")]
        assert e.get_entry(1, 0) == b"live"
    finally:
        e.close()


def test_an_unthrottled_delete_unlinks_at_once(tmp_path: Path, fake_time: FakeTime) -> None:
    e = dead_log_of_two_mib(tmp_path, delete_rate_by_bytes=math.inf)
    try:
        e.gc()
        assert fake_time.slept == [] and e.stats().extra["entry_logs"] == 1
    finally:
        e.close()


def test_a_log_left_mid_deletion_by_a_crash_is_deleted_at_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compactor_module, "_DELETE_STEP_BYTES", 256 * 1024)
    e = dead_log_of_two_mib(tmp_path)

    def crash(self: object, path: Path, size: int) -> None:
        raise KeyboardInterrupt("the bookie died here")

    monkeypatch.setattr(compactor_module.Compactor, "_shrink_and_remove", crash)
    e.flush()
    with pytest.raises(KeyboardInterrupt):
        e.gc()
    left = log_files(tmp_path)
    assert [n for n in left if n.endswith(".deleting")], left  # renamed, not yet deleted
    again = EntryLogStorage([tmp_path])  # the old engine is never closed: a crash
    again.open()
    try:
        assert not [n for n in log_files(tmp_path) if n.endswith(".deleting")]
        assert again.get_entry(1, 0) == b"live"
        assert again.stats().ledgers == 1
    finally:
        again.close()
