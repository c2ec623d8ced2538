"""The journal: group commit, replay from the mark, torn tails, corruption, rolling."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest

from ledgerstore.bookie.journal import (
    ADD,
    ADD_BATCH,
    FENCE,
    Journal,
    LogMark,
    Record,
    encode_record,
    journal_files,
    read_mark,
)
from ledgerstore.errors import BookieIOError


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


def test_torn_tail_is_truncated_not_read(tmp_path: Path) -> None:
    run_journal(tmp_path, [encode_record(ADD, 1, i, b"p" * 50) for i in range(20)])
    (_, path), = journal_files(tmp_path)
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(encode_record(ADD, 1, 20, b"p" * 50)[:30])  # a torn write
    got = replayed(tmp_path)
    assert [r.entry_id for r in got] == list(range(20))
    assert path.stat().st_size == size, "the torn tail must be cut off"


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
    run_journal(tmp_path, [_batch(1, [(i, b"k" * 40) for i in range(10)])])
    (_, path), = journal_files(tmp_path)
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(_batch(1, [(i, b"k" * 40) for i in range(10, 20)])[:-7])
    assert [r.entry_id for r in replayed(tmp_path)] == list(range(10))
    assert path.stat().st_size == size


def test_batch_record_whose_entries_overrun_it_is_an_error(tmp_path: Path) -> None:
    # a checksummed record that lies about its entries cannot come from a torn write
    section = struct.pack(">QI", 0, 500) + b"short"
    run_journal(tmp_path, [encode_record(ADD_BATCH, 1, 1, section)])
    with pytest.raises(BookieIOError, match="overruns the record"):
        replayed(tmp_path)
