"""The journal: group commit, replay from the mark, torn tails, corruption, rolling."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
from pathlib import Path

import pytest

from ledgerstore.bookie.journal import (
    ADD,
    ADD_BATCH,
    DIRECT_ALIGN,
    FENCE,
    DirectWriter,
    Journal,
    LogMark,
    Record,
    encode_record,
    journal_files,
    read_mark,
)
from ledgerstore.errors import BookieIOError


@pytest.fixture(params=[True, False], ids=["direct", "buffered"], autouse=True)
def direct_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every test runs with the journal written with O_DIRECT (the default) and through the page
    cache; the tmp directory is on a file system that takes O_DIRECT (not tmpfs)."""
    monkeypatch.setattr(Journal.__init__, "__kwdefaults__", {**Journal.__init__.__kwdefaults__,
                                                             "direct_io": request.param})
    return bool(request.param)


def run_journal(directory: Path, records: list[bytes], **kw: object) -> tuple[list[object], Journal]:
    async def main() -> tuple[list[object], Journal]:
        done: list[object] = []
        all_done = asyncio.Event()

        def on_durable(tokens: list[object]) -> None:
            done.extend(tokens)
            if len(done) == len(records):
                all_done.set()

        j = Journal(directory, on_durable, **kw)  # type: ignore[arg-type]
        j.replay(lambda r: None)
        j.start(asyncio.get_running_loop())
        for i, r in enumerate(records):
            j.append(r, i)
        await asyncio.wait_for(all_done.wait(), 30)
        j.close()
        return done, j

    return asyncio.run(main())


def replayed(directory: Path) -> list[Record]:
    out: list[Record] = []
    Journal(directory, lambda t: None).replay(out.append)
    return out


def test_every_record_is_acknowledged_in_order_and_grouped(tmp_path: Path) -> None:
    recs = [encode_record(ADD, 1, i, b"x" * 100) for i in range(5000)]
    done, j = run_journal(tmp_path, recs)
    assert done == list(range(5000))
    assert j.groups < 5000, "records should be committed in groups, not one fsync each"
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(5000))


def test_replay_starts_at_the_mark(tmp_path: Path) -> None:
    recs = [encode_record(ADD, 1, i, b"a") for i in range(10)]
    _, j = run_journal(tmp_path, recs)
    recs2 = [encode_record(FENCE, 2, 0)]
    mark = j.durable_mark()
    j.checkpoint_done(mark)
    assert read_mark(tmp_path) == mark
    run_journal(tmp_path, recs2)
    got = replayed(tmp_path)
    assert [(r.type, r.ledger_id) for r in got] == [(FENCE, 2)]


def _tear(path: Path, end: int, torn: bytes) -> None:
    """A torn write after the last whole record (at ``end``; a direct journal has zero padding
    there, which the torn bytes overwrite)."""
    with open(path, "r+b") as fh:
        fh.seek(end)
        fh.write(torn)


def test_torn_tail_is_truncated_not_read(tmp_path: Path) -> None:
    _, j = run_journal(tmp_path, [encode_record(ADD, 1, i, b"p" * 50) for i in range(20)])
    (_, path), = journal_files(tmp_path)
    end = j.durable_mark().offset
    _tear(path, end, encode_record(ADD, 1, 20, b"p" * 50)[:30])
    got = replayed(tmp_path)
    assert [r.entry_id for r in got] == list(range(20))
    assert path.stat().st_size == end, "the torn tail must be cut off"


def test_flipped_byte_in_an_older_file_is_an_error(tmp_path: Path) -> None:
    run_journal(tmp_path, [encode_record(ADD, 1, i, b"q" * 50) for i in range(20)])
    run_journal(tmp_path, [encode_record(ADD, 1, 100, b"z")])
    (_, first), _ = journal_files(tmp_path)
    data = bytearray(first.read_bytes())
    data[200] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(BookieIOError, match=str(first.name)):
        replayed(tmp_path)


def test_rolls_at_size_and_keeps_backups(tmp_path: Path) -> None:
    recs = [encode_record(ADD, 1, i, os.urandom(1000)) for i in range(300)]
    _, j = run_journal(tmp_path, recs, max_file_size=20_000, max_backups=2, flush_when_queue_empty=False,
                       max_group_wait_ms=0.1, max_group_bytes=8_000)
    files = journal_files(tmp_path)
    assert len(files) > 3
    j.checkpoint_done(LogMark(files[-1][0], 16))
    assert len(journal_files(tmp_path)) == 3  # the mark's file plus two backups


def test_damaged_mark_is_reported(tmp_path: Path) -> None:
    (tmp_path / "lastMark").write_bytes(b"garbage")
    with pytest.raises(BookieIOError, match="LastLogMark"):
        replayed(tmp_path)


def _batch(ledger_id: int, entries: list[tuple[int, bytes]]) -> bytes:
    """A batch record as a bookie writes it: the wire's ADD_BATCH entry section as its data."""
    section = b"".join(struct.pack(">QI", eid, len(data)) + data for eid, data in entries)
    return encode_record(ADD_BATCH, ledger_id, len(entries), section)


def test_batch_records_replay_as_one_add_per_entry(tmp_path: Path) -> None:
    first = [(i, f"entry-{i}".encode() * 3) for i in range(100)]
    run_journal(tmp_path, [_batch(7, first), encode_record(ADD, 7, 100, b"single"), _batch(8, [(0, b"")])])
    got = replayed(tmp_path)
    assert [(r.type, r.ledger_id, r.entry_id, r.data) for r in got] == (
        [(ADD, 7, e, d) for e, d in first] + [(ADD, 7, 100, b"single"), (ADD, 8, 0, b"")])
    # every entry of a batch carries the position after the whole batch: a checkpoint mark
    # never falls inside a batch
    assert len({r.mark for r in got[:100]}) == 1 and got[0].mark < got[100].mark


def test_torn_batch_record_loses_the_whole_batch_only(tmp_path: Path) -> None:
    _, j = run_journal(tmp_path, [_batch(1, [(i, b"k" * 40) for i in range(10)])])
    (_, path), = journal_files(tmp_path)
    end = j.durable_mark().offset
    _tear(path, end, _batch(1, [(i, b"k" * 40) for i in range(10, 20)])[:-7])
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(10))
    assert path.stat().st_size == end


def test_batch_record_whose_entries_overrun_it_is_an_error(tmp_path: Path) -> None:
    # a checksummed record that lies about its entries cannot come from a torn write
    section = struct.pack(">QI", 0, 500) + b"short"
    run_journal(tmp_path, [encode_record(ADD_BATCH, 1, 1, section)])
    with pytest.raises(BookieIOError, match="overruns the record"):
        replayed(tmp_path)


# --- O_DIRECT ------------------------------------------------------------------------------------


def test_a_direct_journal_holds_the_same_bytes_in_whole_blocks(tmp_path: Path, direct_io: bool) -> None:
    # groups of every size, each its own write: a group ending mid-block, one ending on a block
    # boundary, one far larger than the write buffer; the block a group ends in is written again
    # by the next, so every earlier group's bytes must survive that rewrite
    head = [10, 5000, 3]
    to_boundary = -(16 + sum(25 + n for n in head)) % DIRECT_ALIGN - 25  # the next record ends a block
    sizes = [*head, to_boundary, 1, 3 << 20, 700, 0, 12_345]
    recs = [encode_record(ADD, 1, i, os.urandom(n)) for i, n in enumerate(sizes)]
    _, j = run_journal(tmp_path, recs, max_group_bytes=1)
    (_, path), = journal_files(tmp_path)
    data = path.read_bytes()
    end = j.durable_mark().offset
    assert data[16:end] == b"".join(recs), "the journal must hold exactly the records, in order"
    if direct_io:
        assert len(data) % DIRECT_ALIGN == 0 and len(data) - end < DIRECT_ALIGN
        assert data[end:] == bytes(len(data) - end), "the padding after the last record must be zeros"
    else:
        assert len(data) == end
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(len(sizes)))


def test_the_direct_buffer_grows_for_a_large_group_and_shrinks_after_it(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    w = DirectWriter(fd, 64 * 1024)
    try:
        small, large = os.urandom(1000), os.urandom(3 << 20)
        for data in (small, large, small):
            w.write([data], len(data))
            if data is large:
                assert len(w.buf) > 3 << 20
        assert len(w.buf) == w.capacity == 64 * 1024, "the large group's memory must be given back"
    finally:
        w.close()
        os.close(fd)
    assert (tmp_path / "f").read_bytes()[: 2000 + (3 << 20)] == small + large + small


def test_an_older_direct_file_ends_cleanly_at_its_padding(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # files that roll while the journal runs keep their padding (only the newest file is repaired
    # at start-up). A 5,000-byte group leaves stale bytes in the write buffer after its last
    # block; the next, shorter group must pad with zeros, not with them, or the file reads as
    # damaged once it is older.
    recs = [encode_record(ADD, 1, i, (b"s" * 5000) if i % 2 == 0 else b"u") for i in range(8)]
    run_journal(tmp_path, recs, max_group_bytes=1, max_file_size=6000)
    assert len(journal_files(tmp_path)) >= 3
    with caplog.at_level("WARNING", logger="ledgerstore.bookie.journal"):
        assert [r.entry_id for r in replayed(tmp_path)] == list(range(8))
    assert not caplog.records, "a clean end must not be reported as a torn tail"


def test_a_block_of_zeros_in_an_older_file_is_still_damage(tmp_path: Path) -> None:
    run_journal(tmp_path, [encode_record(ADD, 1, i, b"w" * 100) for i in range(5)])
    run_journal(tmp_path, [encode_record(ADD, 1, 5, b"w")])
    (_, first), _ = journal_files(tmp_path)
    with open(first, "ab") as fh:
        fh.write(bytes(DIRECT_ALIGN))  # more zeros than any padding: not a clean end
    with pytest.raises(BookieIOError, match=first.name):
        replayed(tmp_path)


def test_a_file_system_without_o_direct_gets_a_buffered_journal(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # some file systems (FUSE ones, tmpfs before Linux 6.6) refuse O_DIRECT with EINVAL at open
    real_open = os.open

    def refusing_open(path: object, flags: int, *args: object) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing_open)
    recs = [encode_record(ADD, 1, i, b"m" * 300) for i in range(50)]
    done, j = run_journal(tmp_path, recs, direct_io=True)
    assert done == list(range(50))
    assert j.direct_io is False, "a refused O_DIRECT must turn into a buffered journal, not a failure"
    (_, path), = journal_files(tmp_path)
    assert path.stat().st_size == j.durable_mark().offset  # no padding: written through the page cache
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(50))


def test_other_errors_opening_a_direct_journal_are_not_hidden(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def full_open(path: object, flags: int, *args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    j: Journal = Journal(tmp_path, lambda t: None, direct_io=True)
    j.replay(lambda r: None)
    monkeypatch.setattr(os, "open", full_open)
    with pytest.raises(OSError, match="No space"):
        j._roll()


class Recorder:
    """A replay target that records each call it gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def replay_add(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        self.calls.append(("add", ledger_id, entry_id, entry))

    def replay_fence(self, ledger_id: int) -> None:
        self.calls.append(("fence", ledger_id))

    def replay_master_key(self, ledger_id: int, key: bytes) -> None:
        self.calls.append(("key", ledger_id, key))


def test_typed_log_calls_replay_into_a_target_one_method_per_record_type(tmp_path: Path) -> None:
    async def main() -> None:
        durable: list[str] = []
        all_durable = asyncio.Event()

        def on_durable(completions: list[str]) -> None:
            durable.extend(completions)
            if len(durable) == 5:
                all_durable.set()

        j: Journal[str] = Journal(tmp_path, on_durable, sync=False)
        j.replay_into(Recorder())
        j.start(asyncio.get_running_loop())
        j.log_master_key(7, b"key", "key")
        j.log_add(7, 0, b"e0", "add")
        section = b"".join(struct.pack(">QI", eid, len(e)) + e for eid, e in [(1, b"e1"), (2, b"e2")])
        j.log_add_batch(7, 2, section, "batch")
        j.log_adds(7, [(3, b"e3"), (4, b"e4")], "adds")
        j.log_fence(7, "fence")
        await asyncio.wait_for(all_durable.wait(), 30)
        await asyncio.to_thread(j.close)
        assert durable == ["key", "add", "batch", "adds", "fence"]

    asyncio.run(main())
    target = Recorder()
    assert Journal(tmp_path, lambda t: None).replay_into(target) == 7
    assert target.calls == [("key", 7, b"key"), *(("add", 7, i, f"e{i}".encode()) for i in range(5)), ("fence", 7)]
