"""Index file I/O of the entrylog engine with thousands of ledgers open: a deterministic count.

An :class:`~ledgerstore_entrylog.engine.EntryLogStorage` on real files is driven directly (no
bookie, no client): ``--ledgers`` ledgers, adds going to each in turn, ``--turn`` entries of one
ledger per ``add_entries`` call, ``--turns`` rounds, ``--size`` bytes each, with a ledger cache of
``--page-limit`` bytes (8 MiB by default: 1,024 pages of 8 KB, fewer than the ledgers' tail
pages, so the cache thrashes as in ``docs/performance.md``'s ``many_ledgers`` section). The
engine's file port is the operating system's, wrapped to count what crosses it; the figures are
per 1,000 entries added: index file opens, write calls and bytes written to index files (and
the page reads), over the adds (the cache's evictions) and, apart, over the checkpoint that
follows. Counts do not depend on the machine's load, unlike a rate.

Usage::

    python benchmarks/index_io.py                                # 2,000 ledgers, 8 MiB cache
    python benchmarks/index_io.py --open-files 4096 --json       # handles for every ledger

To measure an older checkout, run this file with that checkout's interpreter (its editable
install puts its own engine on the path); ``--open-files`` is passed only when given::

    OLD/.venv/bin/python benchmarks/index_io.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ledgerstore.api import OS_STORAGE_FILES, StorageFile
from ledgerstore.api.files import WriteBuffer
from ledgerstore_entrylog.engine import EntryLogStorage


@dataclasses.dataclass
class Counts:
    """What crossed the file port for index files (``.idx``) and for every other file."""

    index_opens: int = 0
    index_writes: int = 0
    index_bytes: int = 0
    index_reads: int = 0
    index_syncs: int = 0
    other_writes: int = 0
    other_bytes: int = 0

    def minus(self, other: Counts) -> Counts:
        """The counts since ``other`` was taken."""
        return Counts(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))


class CountingFile:
    """A file of the OS port whose reads, writes and syncs are counted."""

    def __init__(self, inner: StorageFile, counts: Counts, index: bool) -> None:
        self._inner = inner
        self._counts = counts
        self._index = index

    def pread(self, size: int, offset: int, /) -> bytes:
        if self._index:
            self._counts.index_reads += 1
        return self._inner.pread(size, offset)

    def pwrite(self, data: WriteBuffer, offset: int, /) -> int:
        n = self._inner.pwrite(data, offset)
        if self._index:
            self._counts.index_writes += 1
            self._counts.index_bytes += n
        else:
            self._counts.other_writes += 1
            self._counts.other_bytes += n
        return n

    def sync(self) -> None:
        if self._index:
            self._counts.index_syncs += 1
        self._inner.sync()

    def datasync(self) -> None:
        self._inner.datasync()

    def size(self) -> int:
        return self._inner.size()

    def truncate(self, size: int) -> None:
        self._inner.truncate(size)

    def cold(self, offset: int) -> bool:
        return self._inner.cold(offset)

    def close(self) -> None:
        self._inner.close()


class CountingFiles:
    """The OS file port, counting the index files opened and wrapping every file opened."""

    def __init__(self) -> None:
        self.counts = Counts()
        self._os = OS_STORAGE_FILES

    def open(self, path: Path, *, write: bool = True, create: bool = False, exclusive: bool = False,
             truncate: bool = False) -> StorageFile:
        f = self._os.open(path, write=write, create=create, exclusive=exclusive, truncate=truncate)
        index = path.name.endswith(".idx")
        if index:
            self.counts.index_opens += 1
        return CountingFile(f, self.counts, index)

    def __getattr__(self, name: str) -> object:
        return getattr(self._os, name)


def per_thousand(c: Counts, entries: int) -> dict[str, float]:
    """The counts per 1,000 entries added."""
    return {k: round(v * 1000 / entries, 2) for k, v in dataclasses.asdict(c).items()}


def run(args: argparse.Namespace, root: Path) -> dict[str, object]:
    """Drive one engine as described in the module docstring; the counts of each phase."""
    files = CountingFiles()
    options: dict[str, object] = {"page_limit_bytes": args.page_limit, "flush_entrylog_bytes": 0}
    if args.open_files is not None:
        options["max_open_index_files"] = args.open_files
    engine = EntryLogStorage([root], files=files, **options)  # type: ignore[arg-type]
    engine.open()
    payload = bytes(range(256)) * (args.size // 256 + 1)
    payload = payload[: args.size]
    for lid in range(args.ledgers):
        engine.set_master_key(lid, b"k")
    engine.flush()
    start = dataclasses.replace(files.counts)
    t0 = time.perf_counter()
    for turn in range(args.turns):
        ids = range(turn * args.turn, (turn + 1) * args.turn)
        batch = [(e, payload) for e in ids]
        for lid in range(args.ledgers):
            engine.add_entries(lid, batch)
    adds_s = time.perf_counter() - t0
    entries = args.ledgers * args.turns * args.turn
    after_adds = dataclasses.replace(files.counts)
    engine.flush()
    after_flush = dataclasses.replace(files.counts)
    evictions = engine.stats().extra["dirty_evictions"]
    # every entry reads back from a reopened engine
    engine.close()
    reopened = EntryLogStorage([root], **options)  # type: ignore[arg-type]
    reopened.open()
    try:
        for lid in range(0, args.ledgers, max(1, args.ledgers // 50)):
            got = reopened.get_entries(lid, list(range(args.turns * args.turn)))
            assert all(g == payload for g in got), f"ledger {lid} did not read back"
    finally:
        reopened.close()
    return {
        "ledgers": args.ledgers,
        "entries": entries,
        "page_limit_bytes": args.page_limit,
        "max_open_index_files": args.open_files,
        "dirty_evictions": evictions,
        "adds_per_1000": per_thousand(after_adds.minus(start), entries),
        "checkpoint_per_1000": per_thousand(after_flush.minus(after_adds), entries),
        "adds_seconds": round(adds_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run once, print the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--ledgers", type=int, default=2000)
    p.add_argument("--turn", type=int, default=100, help="entries of one ledger per add_entries call")
    p.add_argument("--turns", type=int, default=5, help="rounds over the ledgers")
    p.add_argument("--size", type=int, default=100, help="bytes per entry")
    p.add_argument("--page-limit", type=int, default=8 * 1024 * 1024, help="page_limit_bytes")
    p.add_argument("--open-files", type=int, default=None, help="max_open_index_files (the engine's default if not given)")
    p.add_argument("--dir", type=Path, default=None, help="where the engine's files go (default: a temp dir)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for name in ("ledgers", "turn", "turns", "size", "page_limit"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    root = Path(tempfile.mkdtemp(prefix="index-io-", dir=args.dir))
    try:
        result = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return 0
    print(f"{result['ledgers']} ledgers, {result['entries']} entries, page_limit_bytes={result['page_limit_bytes']}, "
          f"max_open_index_files={result['max_open_index_files'] or 'default'}, "
          f"dirty evictions {result['dirty_evictions']}, adds {result['adds_seconds']} s (pid {os.getpid()})")
    for phase in ("adds_per_1000", "checkpoint_per_1000"):
        figures = result[phase]
        assert isinstance(figures, dict)
        print(f"  {phase.replace('_per_1000', '')} per 1,000 entries: "
              + ", ".join(f"{k} {v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
