"""The production journal on simulated files, committed on a virtual-time loop: what a crash,
a torn write, a failed write and a failed fsync leave of it, and what it answers."""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ledgerstore.bookie.journal import ADD, Journal, LogMark, encode_record, journal_files, read_mark
from ledgerstore.errors import BookieIOError
from ledgerstore.sim.files import SimFileSystem
from ledgerstore.sim.loop import VirtualTimeLoop

DIR = Path("/sim/bookie-1/journal")
#: every fsync takes 10 ms of virtual time
FSYNC = 0.01


class _Bookie:
    """A journal as a bookie runs it, with what it answered and what it replayed."""

    def __init__(self, files: SimFileSystem, **options: object) -> None:
        self.answered: list[str] = []
        self.failed: list[tuple[list[str], BaseException]] = []
        self.journal: Journal[str] = Journal(DIR, self.answered.extend, files=files, commit_on_loop=lambda: FSYNC,
                                             on_failed=lambda c, e: self.failed.append((c, e)), **options)  # type: ignore[arg-type]
        self.replayed: list[tuple[int, bytes]] = []
        self.journal.replay(lambda rec: self.replayed.append((rec.entry_id, rec.data)))
        self.journal.start(asyncio.get_running_loop())

    def add(self, entry_id: int, data: bytes = b"x") -> None:
        self.journal.append(encode_record(ADD, 1, entry_id, data), f"e{entry_id}")


async def _synced_then(files: SimFileSystem, data: bytes) -> _Bookie:
    """A journal that made entry 0 (``b"synced"``) durable and then took entry 1 (``data``)."""
    b = _Bookie(files)
    b.add(0, b"synced")
    await asyncio.sleep(2 * FSYNC)
    b.add(1, data)
    return b


def _run(scenario: Callable[[SimFileSystem], Awaitable[None]]) -> SimFileSystem:
    files = SimFileSystem(random.Random(1))
    loop = VirtualTimeLoop()
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        runner.run(scenario(files))
    return files


def test_an_append_is_answered_only_once_its_group_is_synced() -> None:
    async def scenario(files: SimFileSystem) -> None:
        b = _Bookie(files)
        b.add(0)
        await asyncio.sleep(FSYNC / 2)
        assert b.answered == [] and files.unsynced() > 0  # written, its fsync still running
        await asyncio.sleep(FSYNC)
        assert b.answered == ["e0"] and files.unsynced() == 0

    _run(scenario)


def test_a_crash_between_a_write_and_its_fsync_loses_the_group_and_answers_nobody() -> None:
    async def scenario(files: SimFileSystem) -> None:
        b = await _synced_then(files, b"lost")
        lost: list[int] = []
        # the process dies as it calls fsync, before the disk took the group
        files.on_next("sync", lambda path: (b.journal.abort(), lost.append(files.crash())))
        await asyncio.sleep(2 * FSYNC)
        assert lost[0] > 0
        assert b.answered == ["e0"] and b.failed == []
        assert _Bookie(files).replayed == [(0, b"synced")]

    _run(scenario)


def test_a_torn_last_block_is_cut_off_at_replay_and_the_journal_goes_on() -> None:
    async def scenario(files: SimFileSystem) -> None:
        b = await _synced_then(files, b"y" * 3000)
        await asyncio.sleep(FSYNC / 2)
        b.journal.abort()
        files.crash(tear=True)
        (_, path), = journal_files(DIR, files)
        assert len(files.read(path)) > 100  # part of the torn record is on disk
        again = _Bookie(files)
        assert again.replayed == [(0, b"synced")]
        again.add(2)
        await asyncio.sleep(2 * FSYNC)
        assert again.answered == ["e2"]
        assert [e for e, _ in _Bookie(files).replayed] == [0, 2]

    _run(scenario)


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_a_failed_write_hands_the_group_back_and_no_later_append_is_taken(code: int) -> None:
    async def scenario(files: SimFileSystem) -> None:
        b = _Bookie(files)
        files.fail_next("write", code)
        b.add(0)
        await asyncio.sleep(2 * FSYNC)
        assert b.answered == [] and [c for c, _ in b.failed] == [["e0"]]
        assert isinstance(b.failed[0][1], OSError) and b.failed[0][1].errno == code
        with pytest.raises(BookieIOError, match="journal is failed"):
            b.add(1)

    _run(scenario)


def test_a_failed_fsync_is_never_acknowledged() -> None:
    async def scenario(files: SimFileSystem) -> None:
        b = _Bookie(files)
        files.fail_next("sync")
        b.add(0)
        await asyncio.sleep(2 * FSYNC)
        assert b.answered == [] and [c for c, _ in b.failed] == [["e0"]]
        assert b.journal.durable_mark().offset == 16  # only the file's header
        files.crash()
        assert _Bookie(files).replayed == []

    _run(scenario)


def test_replay_starts_at_the_checkpoint_mark_and_old_files_go() -> None:
    async def scenario(files: SimFileSystem) -> None:
        b = _Bookie(files, max_file_size=200, max_backups=1)
        for e in range(6):
            b.add(e, b"z" * 100)
            await asyncio.sleep(2 * FSYNC)
        assert len(journal_files(DIR, files)) == 6  # one group per file
        mark = b.journal.durable_mark()
        b.journal.checkpoint_done(LogMark(mark.file_id, mark.offset))
        assert read_mark(DIR, files) == mark
        assert len(journal_files(DIR, files)) == 2  # the mark's file and one backup
        b.add(6)
        await asyncio.sleep(2 * FSYNC)
        b.journal.abort()
        files.crash()
        assert _Bookie(files).replayed == [(6, b"x")]

    _run(scenario)


def test_a_clean_close_syncs_what_was_written_without_answering_it() -> None:
    async def scenario(files: SimFileSystem) -> None:
        b = _Bookie(files)
        b.add(0)
        b.add(1)
        await asyncio.sleep(FSYNC / 2)
        b.journal.close()
        files.crash()
        assert b.answered == []
        assert [e for e, _ in _Bookie(files).replayed] == [0, 1]

    _run(scenario)
