"""The storage engines' file port: the file operations an engine that keeps its own files makes.

A storage engine plugin that reads and writes files in its ledger directories does it through a
:class:`StorageFiles`, so that the same engine runs over the operating system's files
(:class:`OsStorageFiles`, :data:`OS_STORAGE_FILES`, what production bookies use) and over the
simulation's in-memory files (``ledgerstore.sim.files.SimFileSystem``, which keeps only what was
synced at a crash). The journal's own port is :mod:`ledgerstore.bookie.files`.

The port is what BookKeeper's entry logger and index files need, and no more: positional reads
and writes on an open file, its size, sync and truncate; and on names: list, make directories,
remove, rename, and sync a directory so that creations and removals in it are durable. Reading
ahead is a capability: :meth:`StorageFile.cold` says whether a read would wait for the device
(``preadv`` with ``RWF_NOWAIT`` where the kernel has it); a file system that cannot tell answers
False ("already cached"), and the engine then reads nothing ahead. Reading ahead is the engine's
alone: the operating system's files are opened with the kernel's own read-ahead off
(``POSIX_FADV_RANDOM``), so how much a bookie's reads queue in front of its journal's fsyncs is
bounded by the engine's chunks, not by the machine's ``read_ahead_kb``.

Errors are :class:`OSError`, as the operating system reports them (``FileNotFoundError``,
``FileExistsError``, EIO, ENOSPC): the engine turns them into its own errors, naming the file.

Cost: the port is crossed per buffer of entries written (the entry log's write buffer, an
index page, a sync), never per entry added; a read crosses it once per window of records or per
record read alone. The operating system's file calls ``os.pread``/``os.pwrite``/``os.fsync``
through the ``os`` module at each call, so a test that patches them sees the engine's calls.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

__all__ = ["OS_STORAGE_FILES", "OsStorageFile", "OsStorageFiles", "StorageFile", "StorageFiles"]

#: what a positional write takes
WriteBuffer = bytes | bytearray | memoryview


class StorageFile(Protocol):
    """One open file of a storage engine (what :meth:`StorageFiles.open` returns)."""

    def pread(self, size: int, offset: int, /) -> bytes:
        """Up to ``size`` bytes from ``offset`` (fewer at the end of the file). Raises OSError."""

    def pwrite(self, data: WriteBuffer, offset: int, /) -> int:
        """Write ``data`` at ``offset``; returns the bytes written (a short write is possible, as
        with ``pwrite(2)``). Raises OSError (ENOSPC for a full disk)."""

    def sync(self) -> None:
        """Make what was written to the file durable (``fsync``). Raises OSError."""

    def datasync(self) -> None:
        """Make the file's data and size durable, not its times (``fdatasync``). Raises OSError."""

    def size(self) -> int:
        """The file's size in bytes. Raises OSError."""

    def truncate(self, size: int) -> None:
        """Cut (or extend with zeros) the file to ``size`` bytes, not yet durable. Raises OSError."""

    def cold(self, offset: int) -> bool:
        """Whether reading at ``offset`` would wait for the device (the page is not cached);
        False where that cannot be told. Never raises."""

    def close(self) -> None:
        """Let go of the file (nothing is synced). Idempotent."""


class StorageFiles(Protocol):
    """The names and files of a storage engine's directories."""

    def open(self, path: Path, *, write: bool = True, create: bool = False, exclusive: bool = False,
             truncate: bool = False) -> StorageFile:
        """Open ``path`` for reading (and writing with ``write``); ``create`` makes it if it does
        not exist (``exclusive``: FileExistsError if it does), ``truncate`` empties it. The new
        name is durable only once its directory is synced. Raises OSError (FileNotFoundError)."""

    def listdir(self, directory: Path) -> list[str]:
        """The names in ``directory``. Raises OSError (FileNotFoundError)."""

    def is_dir(self, path: Path) -> bool:
        """Whether ``path`` is a directory."""

    def makedirs(self, directory: Path) -> None:
        """Create ``directory`` and its parents if they do not exist. Raises OSError."""

    def mkdir(self, directory: Path) -> None:
        """Create ``directory`` (its parent exists). Raises OSError (FileExistsError)."""

    def size(self, path: Path) -> int:
        """The size of ``path`` in bytes. Raises OSError (FileNotFoundError)."""

    def remove(self, path: Path) -> None:
        """Remove the file ``path``, not yet durably. Raises OSError (FileNotFoundError)."""

    def rename(self, src: Path, dst: Path) -> None:
        """Rename ``src`` to ``dst`` (replacing it) atomically, not yet durably. Raises OSError."""

    def sync_dir(self, directory: Path) -> None:
        """Make the creations, removals and renames in ``directory`` durable. Raises OSError
        (FileNotFoundError when the directory is gone)."""


_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_FADV_RANDOM = getattr(os, "POSIX_FADV_RANDOM", None)


def _no_kernel_readahead(fd: int) -> None:
    """Turn the kernel's read-ahead off for ``fd`` (``POSIX_FADV_RANDOM``) where it can be.

    The engines read what they need in bounded chunks (a window of records, a 1 MiB chunk of
    an entry log read ahead, a 4 MiB chunk of a compaction scan). On top of those the kernel
    reads ahead up to the device's ``read_ahead_kb`` per sequential stream, 8 MiB on some
    machines: a catch-up reader's streams then queue tens of MiB of reads in the device ahead
    of the journal's next fsync, and every writer of the bookie waits behind them
    (``docs/performance.md``, "Catch-up reads beside writers")."""
    if _FADV_RANDOM is None:
        return
    with contextlib.suppress(OSError):  # a file system without it reads ahead as before
        os.posix_fadvise(fd, 0, 0, _FADV_RANDOM)


class OsStorageFile:
    """A file of the operating system, by its descriptor."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def pread(self, size: int, offset: int, /) -> bytes:
        """``os.pread``."""
        return os.pread(self.fd, size, offset)

    def pwrite(self, data: WriteBuffer, offset: int, /) -> int:
        """``os.pwrite``."""
        return os.pwrite(self.fd, data, offset)

    def sync(self) -> None:
        """``os.fsync``."""
        os.fsync(self.fd)

    def datasync(self) -> None:
        """``os.fdatasync``."""
        os.fdatasync(self.fd)

    def size(self) -> int:
        """The file's size (``fstat``)."""
        return os.fstat(self.fd).st_size

    def truncate(self, size: int) -> None:
        """``ftruncate``."""
        os.ftruncate(self.fd, size)

    def cold(self, offset: int) -> bool:
        """One byte read with ``RWF_NOWAIT``: EAGAIN means the page is not cached."""
        if not _RWF_NOWAIT or self.fd < 0:
            return False
        try:
            os.preadv(self.fd, [bytearray(1)], offset, _RWF_NOWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def close(self) -> None:
        """Close the descriptor once."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class OsStorageFiles:
    """The production :class:`StorageFiles`: the operating system's files."""

    def open(self, path: Path, *, write: bool = True, create: bool = False, exclusive: bool = False,
             truncate: bool = False) -> OsStorageFile:
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT | (os.O_EXCL if exclusive else 0)
        if truncate:
            flags |= os.O_TRUNC
        fd = os.open(path, flags, 0o644)
        _no_kernel_readahead(fd)
        return OsStorageFile(fd)

    def listdir(self, directory: Path) -> list[str]:
        return os.listdir(directory)

    def is_dir(self, path: Path) -> bool:
        return path.is_dir()

    def makedirs(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)

    def mkdir(self, directory: Path) -> None:
        directory.mkdir()

    def size(self, path: Path) -> int:
        return os.stat(path).st_size

    def remove(self, path: Path) -> None:
        os.unlink(path)

    def rename(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def sync_dir(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: the file system production storage engines use
OS_STORAGE_FILES: StorageFiles = OsStorageFiles()
