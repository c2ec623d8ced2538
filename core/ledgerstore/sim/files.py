"""Simulated files: a bookie machine's disks in memory, keeping only what was synced at a crash.

:class:`SimFileSystem` is both the :class:`~ledgerstore.bookie.files.FileSystem` the simulated
bookies' journals run on and the :class:`~ledgerstore.api.StorageFiles` their entry-log engines
run on. Each file holds its bytes and the length it was last synced to
(``fsync`` of the file; a new file's name and a replaced file are durable at once, as the
production file system makes them with the directory's fsync before returning). A file written
in place (an index page rewritten) keeps a copy of its bytes as of its last sync, which is
what a crash leaves. Names are durable at once (creations, removals and renames alike): the
simulation does not lose a name whose directory was not synced. Operations on the files of the
ledger directories (:attr:`SimFileSystem.engine_roots`) are named ``engine.<op>`` for faults
and hooks (``engine.write``, ``engine.sync``, ``engine.create``, ``engine.remove``), so a fault
aimed at the journal never meets the engine and the other way round; the engine's files
also meet the disk's :class:`~ledgerstore.sim.disk.DiskFaults` (failed writes, flipped bits on
reads of entry logs).
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

from ledgerstore.api.files import WriteBuffer
from ledgerstore.bookie.files import Buffer
from ledgerstore.sim.disk import DiskFaults

#: the operations a fault or a hook can be aimed at: the journal's, then the engine's
OPS = ("write", "sync", "create", "truncate", "remove", "replace",
       "engine.write", "engine.sync", "engine.create", "engine.remove")


class ProcessCrashed(OSError):
    """The operation's process crashed as it started it (a hook crashed it): nothing happened."""


@dataclasses.dataclass
class SimFile:
    """One file: its bytes and how many of them are synced."""

    data: bytearray = dataclasses.field(default_factory=bytearray)
    synced: int = 0
    #: the bytes as of the last sync, kept once a write changed bytes before ``synced`` (None:
    #: the first ``synced`` bytes of ``data`` are what was synced)
    durable: bytes | None = None

    def write_at(self, data: WriteBuffer, offset: int) -> int:
        """Write ``data`` at ``offset`` (zeros fill a hole), keeping what was synced; returns
        the bytes written (a buffer of 8-byte slots counts its bytes, as ``pwrite`` does)."""
        if offset < self.synced and self.durable is None:
            self.durable = bytes(self.data[: self.synced])
        data = memoryview(data).cast("B")
        end = offset + len(data)
        if offset > len(self.data):
            self.data += bytes(offset - len(self.data))
        self.data[offset:end] = data
        return len(data)

    def sync(self) -> None:
        """What was written is durable."""
        self.synced = len(self.data)
        self.durable = None

    def lose_unsynced(self, keep: int) -> None:
        """A crash: only the synced bytes stay (and, appended after them, ``keep - synced``
        bytes of the last write: a torn write)."""
        if self.durable is not None:
            self.data[:] = self.durable
            self.durable = None
        else:
            del self.data[keep:]
        self.synced = len(self.data)


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
            f.sync()

    def close(self) -> None:
        """Nothing to let go of."""


class SimStorageFile:
    """A file of the entry-log engine open by one process of the bookie: positional reads and
    writes on the machine's file of that name (a handle of a crashed process does nothing)."""

    def __init__(self, fs: SimFileSystem, path: Path) -> None:
        self.fs = fs
        self.path = path
        self.name = str(path)
        self.generation = fs.generation
        self.closed = False

    def _file(self) -> SimFile:
        if self.closed:
            raise OSError(errno.EBADF, "Bad file descriptor", self.name)
        f = self.fs.files.get(self.name)
        if f is None:  # removed while open: what the process still sees
            raise OSError(errno.ESTALE, "the file was removed while open (simulated)", self.name)
        return f

    def pread(self, size: int, offset: int, /) -> bytes:
        data = self._file().data
        raw = bytes(data[offset : offset + size])
        return self.fs.disk.maybe_flip(raw, self.fs) if self.name.endswith(".log") else raw

    def pwrite(self, data: WriteBuffer, offset: int, /) -> int:
        f = self._file()
        if self.generation != self.fs.generation:
            return memoryview(data).nbytes  # the process is gone: its write never happens
        self.fs.before("engine.write", self.path)
        self.fs.disk.maybe_fail_write(self.fs, self.name)
        n = f.write_at(data, offset)
        self.fs.last_write[self.name] = n
        return n

    def sync(self) -> None:
        f = self._file()
        if self.generation != self.fs.generation:
            return
        self.fs.before("engine.sync", self.path)
        f.sync()

    datasync = sync

    def size(self) -> int:
        return len(self._file().data)

    def truncate(self, size: int) -> None:
        f = self._file()
        if self.generation == self.fs.generation:
            if size < f.synced and f.durable is None:
                f.durable = bytes(f.data[: f.synced])
            del f.data[size:]
            if size > len(f.data):
                f.data += bytes(size - len(f.data))

    def cold(self, offset: int) -> bool:
        """Memory has no page cache to miss: always already cached."""
        return False

    def close(self) -> None:
        self.closed = True


class SimFileSystem:
    """One bookie machine's files, in memory (see the module's docstring)."""

    def __init__(self, rng: random.Random, engine_roots: tuple[Path, ...] = (),
                 disk: DiskFaults | None = None) -> None:
        self.rng = rng
        self.files: dict[str, SimFile] = {}
        #: directories known (made by ``makedirs``/``mkdir``, or holding a file)
        self.dirs: set[str] = set()
        #: the ledger directories: operations on files under them are the engine's
        self.engine_roots = tuple(str(r) + "/" for r in engine_roots)
        #: how the engine's files misbehave now (failed writes, flipped bits)
        self.disk = disk if disk is not None else DiskFaults()
        #: reads of entry logs answered with a flipped bit
        self.flipped = 0
        #: the process running on the disks: bumped by each crash
        self.generation = 0
        #: the size of the last write to each file (what a torn write may cut)
        self.last_write: dict[str, int] = {}
        #: op -> errno the next such operation fails with (one shot each)
        self.faults: dict[str, int] = {}
        #: op -> (action, when): ``action(path)`` is called as the next such operation on a path
        #: for which ``when(path)`` holds (any path if None) starts (one shot each)
        self.hooks: dict[str, tuple[Callable[[Path], object], Callable[[Path], bool] | None]] = {}
        #: operations that failed because they were told to
        self.failed = 0

    # --- faults ------------------------------------------------------------------------------

    def fail_next(self, op: str, code: int = errno.EIO) -> None:
        """Fail the next ``op`` (one of :data:`OPS`) with ``code`` (EIO, ENOSPC)."""
        self.faults[op] = code

    def on_next(self, op: str, action: Callable[[Path], object], when: Callable[[Path], bool] | None = None) -> None:
        """Call ``action(path)`` as the next ``op`` starts (before it takes effect), on a path
        for which ``when(path)`` holds when given."""
        self.hooks[op] = (action, when)

    def disarm(self) -> None:
        """Forget the faults and hooks not yet met."""
        self.faults.clear()
        self.hooks.clear()

    def before(self, op: str, path: Path) -> None:
        """Run the hook and the fault aimed at ``op`` (called by every operation). Raises
        :class:`ProcessCrashed` when the hook crashed the process, OSError for a fault."""
        armed = self.hooks.get(op)
        if armed is not None and (armed[1] is None or armed[1](path)):
            del self.hooks[op]
            generation = self.generation
            armed[0](path)
            if self.generation != generation:
                raise ProcessCrashed(errno.EIO, f"the process crashed as it started a {op}", str(path))
        code = self.faults.pop(op, None)
        if code is not None:
            self.failed += 1
            raise OSError(code, f"{os.strerror(code)} ({op}, simulated)", str(path))

    def crash(self, *, tear: bool = False) -> int:
        """The machine lost power (or the process died): every byte written and not synced is
        lost, except, with ``tear``, a random prefix of each journal file's last unsynced write (the
        engine's files lose all they did not sync). Handles opened before do nothing any more. Returns the bytes lost."""
        self.generation += 1
        lost = 0
        for name, f in self.files.items():
            keep = f.synced
            unsynced = len(f.data) - keep
            if tear and unsynced > 0 and f.durable is None and not self._engine_file(name):
                # a random prefix of the last write reached the platter, the rest did not
                first = max(keep, len(f.data) - self.last_write.get(name, unsynced))
                keep = first + self.rng.randrange(len(f.data) - first)
            before = len(f.data)
            f.lose_unsynced(keep)
            lost += max(0, before - len(f.data))
        self.last_write.clear()
        return lost

    def unsynced(self) -> int:
        """Bytes written and not yet synced, over every file."""
        return sum(len(f.data) - f.synced for f in self.files.values())

    def engine_snapshot(self) -> dict[str, bytes]:
        """The ledger directories' files as a crash now would leave them (their synced bytes),
        and their directories (empty bytes, names ending in ``/``): a copy to restore later."""
        out = {name: bytes(f.durable if f.durable is not None else f.data[: f.synced])
               for name, f in self.files.items() if self._engine_file(name)}
        out.update((d + "/", b"") for d in self.dirs if self._engine_file(d + "/"))
        return out

    def restore_engine(self, copy: dict[str, bytes]) -> None:
        """Put the ledger directories back as ``copy`` (:meth:`engine_snapshot`) has them, every
        file and directory of theirs not in it gone (an empty copy: the directories wiped)."""
        for name in [n for n in self.files if self._engine_file(n)]:
            del self.files[name]
        self.dirs -= {d for d in self.dirs if self._engine_file(d + "/")}
        for name, data in copy.items():
            if name.endswith("/"):
                self.dirs.add(name[:-1])
            else:
                self.files[name] = SimFile(bytearray(data), len(data))

    # --- the FileSystem port ------------------------------------------------------------------

    def listdir(self, directory: Path) -> list[str]:
        """The files and directories in ``directory`` (none if it does not exist)."""
        prefix = str(directory) + "/"
        names = {n[len(prefix):].split("/", 1)[0] for n in (*self.files, *self.dirs) if n.startswith(prefix)}
        return sorted(names)

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
        """Remove ``path`` if it exists (the journal's and the engine's ``remove`` alike)."""
        self.before(self._op("remove", path), path)
        self.files.pop(str(path), None)

    def replace(self, path: Path, data: bytes) -> None:
        self.before("replace", path)
        self.files[str(path)] = SimFile(bytearray(data), len(data))

    # --- the StorageFiles port (the entry-log engine) -------------------------------------------

    def _engine_file(self, name: str) -> bool:
        return any(name.startswith(r) for r in self.engine_roots)

    def _op(self, op: str, path: Path) -> str:
        return "engine." + op if self._engine_file(str(path)) else op

    def open(self, path: Path, *, write: bool = True, create: bool = False, exclusive: bool = False,
             truncate: bool = False) -> SimStorageFile:
        name = str(path)
        f = self.files.get(name)
        if f is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)
            self.before("engine.create", path)
            self.files[name] = SimFile()
        elif create and exclusive:
            raise FileExistsError(errno.EEXIST, "File exists", name)
        elif truncate:
            if f.synced and f.durable is None:
                f.durable = bytes(f.data[: f.synced])
            del f.data[:]
        return SimStorageFile(self, path)

    def is_dir(self, path: Path) -> bool:
        return str(path) in self.dirs

    def makedirs(self, directory: Path) -> None:
        """Create ``directory`` and its parents (the journal's directories are implied by names)."""
        for d in (directory, *directory.parents):
            self.dirs.add(str(d))

    def mkdir(self, directory: Path) -> None:
        name = str(directory)
        if name in self.dirs:
            raise FileExistsError(errno.EEXIST, "File exists", name)
        self.dirs.add(name)

    def size(self, path: Path) -> int:
        f = self.files.get(str(path))
        if f is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return len(f.data)

    def rename(self, src: Path, dst: Path) -> None:
        f = self.files.pop(str(src), None)
        if f is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(src))
        self.files[str(dst)] = f

    def sync_dir(self, directory: Path) -> None:
        """Names are durable at once here (see the module's docstring)."""


class SimProcessFiles:
    """One process's view of the machine's files (what its storage engine is given): once the
    process crashed, every operation fails with :class:`ProcessCrashed` and changes nothing, as
    a dead process does nothing more. Files it opened before do nothing either
    (:class:`SimStorageFile`)."""

    def __init__(self, fs: SimFileSystem) -> None:
        self.fs = fs
        self.generation = fs.generation

    def _alive(self, path: Path) -> SimFileSystem:
        if self.generation != self.fs.generation:
            raise ProcessCrashed(errno.EIO, "the process crashed", str(path))
        return self.fs

    def open(self, path: Path, *, write: bool = True, create: bool = False, exclusive: bool = False,
             truncate: bool = False) -> SimStorageFile:
        return self._alive(path).open(path, write=write, create=create, exclusive=exclusive, truncate=truncate)

    def listdir(self, directory: Path) -> list[str]:
        return self._alive(directory).listdir(directory)

    def is_dir(self, path: Path) -> bool:
        return self._alive(path).is_dir(path)

    def makedirs(self, directory: Path) -> None:
        self._alive(directory).makedirs(directory)

    def mkdir(self, directory: Path) -> None:
        self._alive(directory).mkdir(directory)

    def size(self, path: Path) -> int:
        return self._alive(path).size(path)

    def remove(self, path: Path) -> None:
        self._alive(path).remove(path)

    def rename(self, src: Path, dst: Path) -> None:
        self._alive(src).rename(src, dst)

    def sync_dir(self, directory: Path) -> None:
        self._alive(directory).sync_dir(directory)
