"""The journal's file port: every file operation of :mod:`ledgerstore.bookie.journal` goes
through a :class:`FileSystem`.

:class:`OsFileSystem` is the production one: journal files written with ``O_DIRECT`` where the
file system allows it (:class:`DirectWriter`), else through the page cache with one ``writev``
per group; ``fdatasync`` per group; new files and the LastLogMark made durable with their
directory. The port is crossed once per group and once per file, never per entry.

The simulation's file system (``ledgerstore.sim.files``) keeps files in memory with the length
each was synced to, so a crash keeps only what was synced, and can fail a write or an fsync.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

#: what a record's parts may be: a request frame's entry section is a view of the frame
Buffer = bytes | memoryview
#: the unit of an O_DIRECT write: its file offset, length and buffer address are multiples of it
#: (4 KiB covers devices of 512-byte and of 4 KiB logical blocks)
DIRECT_ALIGN = 4096
_ZEROS = bytes(DIRECT_ALIGN)
_IOV_MAX = 1024


class JournalFile(Protocol):
    """One journal file open for appending (what :meth:`FileSystem.create` returns)."""

    #: True when written with O_DIRECT (whole blocks; the file ends in zeros up to a block)
    direct: bool

    def write(self, bufs: list[Buffer], size: int) -> None:
        """Append ``bufs`` (``size`` bytes in all) in as few system calls as it can. Raises OSError."""

    def sync(self) -> None:
        """Make what was written durable (``fdatasync``). Raises OSError."""

    def close(self) -> None:
        """Let go of the file (nothing is synced)."""


class FileSystem(Protocol):
    """The file operations of the journal: its files, its directory and its LastLogMark."""

    def makedirs(self, directory: Path) -> None:
        """Create ``directory`` (and its parents) if it does not exist."""

    def listdir(self, directory: Path) -> list[str]:
        """The names in ``directory`` (none if it does not exist)."""

    def exists(self, path: Path) -> bool:
        """Whether ``path`` exists."""

    def read(self, path: Path, offset: int = 0, size: int = -1) -> bytes:
        """``size`` bytes of ``path`` from ``offset`` (-1: to its end). Raises OSError."""

    def create(self, path: Path, header: bytes, *, direct: bool, buffer_size: int) -> JournalFile:
        """A new, empty ``path`` holding ``header``, durable with its name before this returns.
        ``direct`` asks for O_DIRECT writes (the file's ``direct`` says whether it got them);
        ``buffer_size`` is the size of the groups it is written in. Raises OSError."""

    def truncate(self, path: Path, size: int) -> None:
        """Cut ``path`` to ``size`` bytes, durably (a torn tail repaired). Raises OSError."""

    def remove(self, path: Path) -> None:
        """Remove ``path`` if it exists."""

    def replace(self, path: Path, data: bytes) -> None:
        """Make ``path`` hold ``data``, atomically and durably: after a crash it holds either its
        old bytes or ``data`` (write a temporary file, sync it, rename it, sync the directory).
        Raises OSError."""


class DirectWriter:
    """Writes one journal file with ``O_DIRECT``: from an aligned buffer, in whole blocks.

    The buffer starts at the file's last partly written block (``block``) and holds ``fill``
    bytes of it. A group is copied after them, padded with zeros to the next block and written
    in one ``pwrite``; the last, partly filled block then moves to the front of the buffer and
    is written again, whole, with the next group. Rewriting those bytes with the same bytes
    keeps what an earlier group made durable intact even if this write is torn.

    The page cache is not used: the group goes from the buffer to the device, and the bookie's
    entry-log writes keep the memory the journal would otherwise fill. The buffer holds a group
    (``max_group_bytes`` plus two blocks: about 520 KiB by default); a larger group, which one
    large record makes, grows it until a group fits the usual size again.
    """

    __slots__ = ("fd", "buf", "block", "fill", "capacity")

    def __init__(self, fd: int, capacity: int = 1 << 20) -> None:
        self.fd = fd
        #: the buffer's usual size; a larger group grows it for as long as groups stay large
        self.capacity = _round_up(max(capacity, 2 * DIRECT_ALIGN), DIRECT_ALIGN)
        self.buf = mmap.mmap(-1, self.capacity)
        #: file offset of ``buf[0]`` (a multiple of DIRECT_ALIGN)
        self.block = 0
        #: bytes of ``buf`` that hold file data
        self.fill = 0

    def write(self, bufs: list[Buffer], size: int) -> None:
        """Write ``bufs`` (``size`` bytes in all) after what the file holds. Raises OSError."""
        pos = self.fill
        end = pos + size
        if end + DIRECT_ALIGN > len(self.buf):
            self._resize(end + DIRECT_ALIGN)
        elif len(self.buf) > self.capacity and end + DIRECT_ALIGN <= self.capacity:
            self._resize(self.capacity)  # a large group has passed: give its memory back
        buf = self.buf
        for b in bufs:
            n = len(b)
            buf[pos : pos + n] = b
            pos += n
        padded = _round_up(end, DIRECT_ALIGN)
        buf[end:padded] = _ZEROS[: padded - end]
        done = 0
        with memoryview(buf) as view:
            while done < padded:
                n = os.pwrite(self.fd, view[done:padded], self.block + done)
                if n <= 0 or n % 512:
                    raise OSError(errno.EIO, f"journal: a direct write of {padded - done} bytes wrote {n}")
                done += n
        whole = end - end % DIRECT_ALIGN
        if whole:
            buf[: end - whole] = buf[whole:end]
            self.block += whole
        self.fill = end - whole

    def _resize(self, need: int) -> None:
        other = mmap.mmap(-1, _round_up(need, DIRECT_ALIGN))
        other[: self.fill] = self.buf[: self.fill]
        self.buf.close()
        self.buf = other

    def close(self) -> None:
        self.buf.close()


def _round_up(n: int, unit: int) -> int:
    return (n + unit - 1) // unit * unit


class OsJournalFile:
    """A journal file on the operating system's file system."""

    __slots__ = ("fd", "direct", "_writer")

    def __init__(self, fd: int, writer: DirectWriter | None) -> None:
        self.fd = fd
        self._writer = writer
        self.direct = writer is not None

    def write(self, bufs: list[Buffer], size: int) -> None:
        if self._writer is not None:
            self._writer.write(bufs, size)
            return
        # one system call for the whole group, without joining it first (up to the iovec limit)
        n = os.writev(self.fd, bufs) if len(bufs) <= _IOV_MAX else 0
        if n < size:
            view = memoryview(b"".join(bufs))[n:]
            while view:
                view = view[os.write(self.fd, view):]

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class OsFileSystem:
    """The production :class:`FileSystem`: the operating system's files."""

    def makedirs(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)

    def listdir(self, directory: Path) -> list[str]:
        return [p.name for p in directory.iterdir()] if directory.exists() else []

    def exists(self, path: Path) -> bool:
        return path.exists()

    def read(self, path: Path, offset: int = 0, size: int = -1) -> bytes:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(size)

    def create(self, path: Path, header: bytes, *, direct: bool, buffer_size: int) -> OsJournalFile:
        file = _open_direct(path, header, buffer_size) if direct else None
        if file is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            os.write(fd, header)
            file = OsJournalFile(fd, None)
        os.fsync(file.fd)
        fsync_dir(path.parent)
        return file

    def truncate(self, path: Path, size: int) -> None:
        with open(path, "r+b") as fh:
            fh.truncate(size)
            fh.flush()
            os.fsync(fh.fileno())

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def replace(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)


def _open_direct(path: Path, header: bytes, buffer_size: int) -> OsJournalFile | None:
    """Create ``path`` for O_DIRECT writes and write its header; None when the file system
    refuses O_DIRECT with EINVAL, as some FUSE file systems and tmpfs before Linux 6.6 do."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:  # not Linux
        return None
    fd = -1
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
        writer = DirectWriter(fd, buffer_size)
        try:
            writer.write([header], len(header))
        except BaseException:
            writer.close()
            raise
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        if exc.errno != errno.EINVAL:
            raise
        log.info("journal %s: the file system refuses O_DIRECT (%s); writing through the page cache", path.parent, exc)
        return None
    return OsJournalFile(fd, writer)


def fsync_dir(directory: Path) -> None:
    """Make the names in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: the file system production bookies use
OS_FILES: FileSystem = OsFileSystem()
