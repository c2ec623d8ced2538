"""The open index files of the entrylog engine: a bounded cache of descriptors, least recently
used closed first (BookKeeper's ``openFileLimit``), so that a ledger cache evicting and reloading
the pages of thousands of ledgers does not open and close an index file for each page.

At most ``limit`` files are open at once, whatever the number of ledgers. The cache is used
under the engine lock only (:mod:`~ledgerstore_entrylog.state`), so a descriptor is never shared
between threads: the checkpoint, which syncs without the lock, opens index files of its own, and
syncing one of them covers every descriptor's writes to that file. Nothing here syncs.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from ledgerstore.api import StorageFile, StorageFiles

__all__ = ["IndexFileHandles"]


class IndexFileHandles:
    """At most ``limit`` index files open for reading and writing, by path. Lock held."""

    def __init__(self, files: StorageFiles, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_open_index_files={limit} must be at least 1")
        self._files = files
        #: the bound on open files
        self.limit = limit
        self._open: OrderedDict[Path, StorageFile] = OrderedDict()
        #: index files opened since the engine was built
        self.opens = 0

    def __len__(self) -> int:
        return len(self._open)

    def get(self, path: Path, *, create: bool) -> StorageFile:
        """The open file at ``path`` (opened for reading and writing, created when ``create``),
        closing the least recently used one first when ``limit`` are open. Raises OSError
        (FileNotFoundError without ``create`` for a file that does not exist)."""
        f = self._open.get(path)
        if f is not None:
            self._open.move_to_end(path)
            return f
        while len(self._open) >= self.limit:
            _, old = self._open.popitem(last=False)
            old.close()
        f = self._files.open(path, create=create)
        self.opens += 1
        self._open[path] = f
        return f

    def drop(self, path: Path) -> None:
        """Close the file at ``path`` if it is open (before it is deleted, or after an error
        left its state unknown)."""
        f = self._open.pop(path, None)
        if f is not None:
            f.close()

    def close_all(self) -> None:
        """Close every open file."""
        while self._open:
            _, f = self._open.popitem(last=False)
            f.close()
