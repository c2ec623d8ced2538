"""The journal hands back what it was given per append: on the event loop, once durable, or once
its writer failed (then no later append is accepted)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ledgerstore.bookie.files import OsFileSystem, OsJournalFile
from ledgerstore.bookie.journal import ADD, Journal, encode_record
from ledgerstore.errors import BookieIOError


def test_a_group_the_writer_could_not_write_is_handed_back_as_failed_and_no_later_append_is_taken(
        tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        durable: list[str] = []
        failed: asyncio.Future[tuple[list[str], BaseException]] = loop.create_future()
        files = _Opened()
        j: Journal[str] = Journal(tmp_path, durable.extend, on_failed=lambda c, e: failed.set_result((c, e)),
                                  sync=False, files=files)
        j.replay(lambda r: None)
        j.start(loop)
        # the journal file turns unwritable under the writer: its next group fails
        read_only = os.open(os.devnull, os.O_RDONLY)
        os.dup2(read_only, files.opened[-1].fd)
        os.close(read_only)
        j.append(encode_record(ADD, 1, 0, b"x"), "add-0")
        completions, exc = await asyncio.wait_for(failed, 10)
        assert completions == ["add-0"] and isinstance(exc, OSError)
        assert durable == []
        with pytest.raises(BookieIOError, match="journal is failed"):
            j.append(encode_record(ADD, 1, 1, b"x"), "add-1")
        await asyncio.to_thread(j.close)

    asyncio.run(main())


class _Opened(OsFileSystem):
    """The operating system's files, remembering the journal files it created."""

    def __init__(self) -> None:
        self.opened: list[OsJournalFile] = []

    def create(self, path: Path, header: bytes, *, direct: bool, buffer_size: int) -> OsJournalFile:
        self.opened.append(super().create(path, header, direct=direct, buffer_size=buffer_size))
        return self.opened[-1]


def test_an_aborted_journal_writes_and_answers_nothing_more(tmp_path: Path) -> None:
    """The process died (``Bookie.abort()``): the writer thread ends, what is appended after is
    neither written nor answered, and what was durable before replays."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        durable: list[str] = []
        first: asyncio.Future[None] = loop.create_future()

        def answered(tokens: list[str]) -> None:
            durable.extend(tokens)
            if not first.done():
                first.set_result(None)

        j: Journal[str] = Journal(tmp_path, answered)
        j.replay(lambda r: None)
        j.start(loop)
        j.log_add(1, 0, b"durable", "add-0")
        await asyncio.wait_for(first, 10)
        j.abort()
        j.log_add(1, 1, b"after", "add-1")
        await asyncio.sleep(0.2)
        assert durable == ["add-0"]

    asyncio.run(main())
    replayed: list[int] = []
    Journal(tmp_path, lambda t: None).replay(lambda r: replayed.append(r.entry_id))
    assert replayed == [0]
