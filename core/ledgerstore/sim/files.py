"""Simulated files: a bookie machine's disks in memory, keeping only what was synced at a crash.

:class:`SimFileSystem` is the :class:`~ledgerstore.bookie.files.FileSystem` the simulated
bookies' journals run on. Each file holds its bytes and the length it was last synced to
(``fsync`` of the file; a new file's name and a replaced file are durable at once, as the
production file system makes them with the directory's fsync before returning).
:meth:`SimFileSystem.crash` drops every byte written but not synced, or, when told to tear,
keeps a random prefix of the last unsynced write (cut anywhere, most often inside a record), as
a torn write leaves it. It can be told to fail the next write with EIO or ENOSPC, or the next fsync, and to call
an action as an operation starts (a crash timed to a protocol step).

A handle opened by one process of the bookie does nothing once that process crashed: the disk
outlives the process, the process's writes do not.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
from collections.abc import Callable
from pathlib import Path

from ledgerstore.bookie.files import Buffer

#: the operations a fault or a hook can be aimed at
OPS = ("write", "sync", "create", "truncate", "remove", "replace")


class ProcessCrashed(OSError):
    """The operation's process crashed as it started it (a hook crashed it): nothing happened."""


@dataclasses.dataclass
class SimFile:
    """One file: its bytes and how many of them are synced."""

    data: bytearray = dataclasses.field(default_factory=bytearray)
    synced: int = 0


class SimJournalFile:
    """A file open for appending by one process of the bookie."""

    direct = False

    def __init__(self, fs: SimFileSystem, path: Path) -> None:
        self.fs = fs
        self.path = path
        self.generation = fs.generation

    def _alive(self, op: str) -> SimFile | None:
        if self.generation != self.fs.generation:
            return None  # the process that opened it is gone
        self.fs.before(op, self.path)
        return self.fs.files.get(str(self.path))

    def write(self, bufs: list[Buffer], size: int) -> None:
        f = self._alive("write")
        if f is not None:
            for b in bufs:
                f.data += b
            self.fs.last_write[str(self.path)] = size

    def sync(self) -> None:
        f = self._alive("sync")
        if f is not None:
            f.synced = len(f.data)

    def close(self) -> None:
        """Nothing to let go of."""


class SimFileSystem:
    """One bookie machine's files, in memory (see the module's docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.files: dict[str, SimFile] = {}
        #: the process running on the disks: bumped by each crash
        self.generation = 0
        #: the size of the last write to each file (what a torn write may cut)
        self.last_write: dict[str, int] = {}
        #: op -> errno the next such operation fails with (one shot each)
        self.faults: dict[str, int] = {}
        #: op -> action called with the path as the next such operation starts (one shot each)
        self.hooks: dict[str, Callable[[Path], object]] = {}
        #: operations that failed because they were told to
        self.failed = 0

    # --- faults ------------------------------------------------------------------------------

    def fail_next(self, op: str, code: int = errno.EIO) -> None:
        """Fail the next ``op`` (one of :data:`OPS`) with ``code`` (EIO, ENOSPC)."""
        self.faults[op] = code

    def on_next(self, op: str, action: Callable[[Path], object]) -> None:
        """Call ``action(path)`` as the next ``op`` starts (before it takes effect)."""
        self.hooks[op] = action

    def disarm(self) -> None:
        """Forget the faults and hooks not yet met."""
        self.faults.clear()
        self.hooks.clear()

    def before(self, op: str, path: Path) -> None:
        """Run the hook and the fault aimed at ``op`` (called by every operation). Raises
        :class:`ProcessCrashed` when the hook crashed the process, OSError for a fault."""
        hook = self.hooks.pop(op, None)
        if hook is not None:
            generation = self.generation
            hook(path)
            if self.generation != generation:
                raise ProcessCrashed(errno.EIO, f"the process crashed as it started a {op}", str(path))
        code = self.faults.pop(op, None)
        if code is not None:
            self.failed += 1
            raise OSError(code, f"{os.strerror(code)} ({op}, simulated)", str(path))

    def crash(self, *, tear: bool = False) -> int:
        """The machine lost power (or the process died): every byte written and not synced is
        lost, except, with ``tear``, a random prefix of each file's last unsynced write. Handles opened before do nothing any more. Returns the bytes lost."""
        self.generation += 1
        lost = 0
        for name, f in self.files.items():
            keep = f.synced
            unsynced = len(f.data) - keep
            if tear and unsynced > 0:
                # a random prefix of the last write reached the platter, the rest did not
                first = max(keep, len(f.data) - self.last_write.get(name, unsynced))
                keep = first + self.rng.randrange(len(f.data) - first)
            lost += len(f.data) - keep
            del f.data[keep:]
            f.synced = len(f.data)
        self.last_write.clear()
        return lost

    def unsynced(self) -> int:
        """Bytes written and not yet synced, over every file."""
        return sum(len(f.data) - f.synced for f in self.files.values())

    # --- the FileSystem port ------------------------------------------------------------------

    def makedirs(self, directory: Path) -> None:
        """Directories are implied by the files' names."""

    def listdir(self, directory: Path) -> list[str]:
        prefix = str(directory) + "/"
        return [n[len(prefix):] for n in self.files if n.startswith(prefix) and "/" not in n[len(prefix):]]

    def exists(self, path: Path) -> bool:
        return str(path) in self.files

    def read(self, path: Path, offset: int = 0, size: int = -1) -> bytes:
        f = self.files.get(str(path))
        if f is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return bytes(f.data[offset:] if size < 0 else f.data[offset : offset + size])

    def create(self, path: Path, header: bytes, *, direct: bool, buffer_size: int) -> SimJournalFile:
        self.before("create", path)
        self.files[str(path)] = SimFile(bytearray(header), len(header))
        return SimJournalFile(self, path)

    def truncate(self, path: Path, size: int) -> None:
        self.before("truncate", path)
        f = self.files[str(path)]
        del f.data[size:]
        f.synced = min(f.synced, len(f.data))

    def remove(self, path: Path) -> None:
        self.before("remove", path)
        self.files.pop(str(path), None)

    def replace(self, path: Path, data: bytes) -> None:
        self.before("replace", path)
        self.files[str(path)] = SimFile(bytearray(data), len(data))
