"""The storage engines' files are opened with the kernel's read-ahead off: reading an entry log
from its start through the port caches what was read and nothing beyond it, where the same
reads on a plainly opened file make the kernel read ahead (``docs/performance.md``, "Catch-up
reads beside writers": a catch-up reader's read-ahead queued in front of the journal's fsyncs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledgerstore.api.files import OS_STORAGE_FILES, OsStorageFile

SIZE = 8 * 1024 * 1024
READ = 256 * 1024  # read sequentially, 4 KiB at a time
AHEAD = READ + 8 * 1024  # a page the kernel's read-ahead would have brought in by then


def cold_file(path: Path) -> None:
    """``SIZE`` bytes on the device, none of them in the page cache."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, os.urandom(SIZE))
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_start(f: OsStorageFile) -> None:
    for offset in range(0, READ, 4096):
        assert len(f.pread(4096, offset)) == 4096


@pytest.mark.skipif(not hasattr(os, "POSIX_FADV_RANDOM") or not hasattr(os, "RWF_NOWAIT"),
                    reason="needs posix_fadvise and preadv(RWF_NOWAIT)")
def test_an_engine_file_is_read_without_the_kernels_readahead(tmp_path: Path) -> None:
    plain_path, port_path = tmp_path / "plain", tmp_path / "port"
    cold_file(plain_path)
    cold_file(port_path)

    # the control: a file opened plainly, read the same way, is read ahead by the kernel
    plain = OsStorageFile(os.open(plain_path, os.O_RDONLY))
    try:
        if not plain.cold(0):
            pytest.skip("this file system keeps the file cached after POSIX_FADV_DONTNEED")
        read_start(plain)
        if plain.cold(AHEAD):
            pytest.skip("the kernel reads nothing ahead here (read_ahead_kb is 0?): nothing to turn off")
    finally:
        plain.close()

    f = OS_STORAGE_FILES.open(port_path, write=False)
    try:
        assert isinstance(f, OsStorageFile)
        read_start(f)
        assert not f.cold(READ - 4096)  # what was read is cached
        assert f.cold(AHEAD)  # and nothing was read ahead of it
    finally:
        f.close()
