"""The lock a running bookie (or an offline tool that writes) holds on each of its directories.

Every journal and ledger directory gets a file :data:`LOCK_FILE` holding the PID of its holder,
locked with ``flock(LOCK_EX)``. The kernel drops the lock when the holder's process ends, however
it ends (``kill -9`` included), so a stale file never blocks a restart: the next holder simply
takes the lock and writes its own PID. Whoever is refused reads the PID from the file to name
the holder. The lock is advisory: it stops our own tools, not ``rm -rf``; a running bookie
notices that separately (see :meth:`DirLock.lost`).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ledgerstore.errors import LedgerStoreError

LOCK_FILE = "bookie.lock"


class DirectoryLockedError(LedgerStoreError):
    """A directory is locked by another process (a running bookie or an offline tool)."""


def holder_of(directory: Path) -> str:
    """What the lock file of ``directory`` says about its holder (for messages)."""
    try:
        text = (directory / LOCK_FILE).read_text().strip()
    except OSError:
        return "an unknown process"
    return f"PID {text}" if text.isdigit() else "an unknown process"


class DirLock:
    """Exclusive locks on a set of directories, taken all or none by :meth:`acquire`."""

    def __init__(self, dirs: list[Path], what: str = "bookie") -> None:
        seen: dict[Path, None] = {}
        for d in dirs:
            seen.setdefault(Path(d).resolve(), None)
        self.dirs = list(seen)
        self.what = what
        #: directory -> (open descriptor of its lock file, the file's inode)
        self._held: dict[Path, tuple[int, int]] = {}

    def acquire(self) -> None:
        """Lock every directory (creating it if needed), or raise :class:`DirectoryLockedError`
        naming the directory and the PID of its holder, holding nothing."""
        try:
            for d in self.dirs:
                d.mkdir(parents=True, exist_ok=True)
                path = d / LOCK_FILE
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise DirectoryLockedError(
                        f"{d} is in use by {holder_of(d)} (a running bookie or an offline tool holds "
                        f"{path}); stop that process first") from None
                except BaseException:
                    os.close(fd)
                    raise
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self._held[d] = (fd, os.fstat(fd).st_ino)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Drop every lock held (the files stay: removing them would race with the next holder)."""
        for fd, _ in self._held.values():
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        self._held.clear()

    def lost(self) -> list[str]:
        """Why the locked directories are no longer ours, one line per directory: it vanished,
        or its lock file was removed or replaced (someone emptied it). Empty when all is well."""
        problems = []
        for d, (_, ino) in self._held.items():
            try:
                st = os.stat(d / LOCK_FILE)
            except FileNotFoundError:
                problems.append(f"{d} is gone" if not d.exists() else f"{d} was emptied (its lock file is gone)")
                continue
            except OSError as exc:
                problems.append(f"{d} is not readable: {exc}")
                continue
            if st.st_ino != ino:
                problems.append(f"{d} was emptied and recreated (its lock file was replaced)")
        return problems

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
