"""Limbo ledgers: what a bookie that lost data it may have held does about it (BookKeeper's data
integrity checking, BP-41: ``dataIntegrityCheckingEnabled``, ``DataIntegrityCheckImpl``).

A bookie's "no such entry" is a vote: recovery closes a ledger short when enough bookies of an
entry's write quorum say it. That vote is sound only from a bookie that never had the entry. A
bookie that comes back under its old identity with empty or older directories (a replaced disk, a
restore from a backup, a reformat that kept the cookie) would vote for entries it acknowledged
and lost. So at start, before it serves anything, a bookie that finds it lost data
(:func:`lost_data`) lists from the metadata store every ledger whose fragments name it and puts
each **in limbo** (:class:`Limbo`), fencing the closed ones and the open ones whose last
fragment names it (:func:`fence_in_limbo`), so their writers stop adding here (the fences stay
after the repair). For a ledger in limbo the bookie still serves what it holds,
but where it would answer "no such entry" or a LAC it answers ``UNKNOWN``
(:class:`~ledgerstore.errors.LedgerStateUnknownError`), which recovery never counts as a vote.
Adds other than recovery adds are refused ``FENCED``. A ledger leaves limbo once the bookie
repaired it (``ledgerstore.bookie.repair``).

The set lives beside the storage engine, in the journal directory's ``limbo`` file, written
through the journal's file port atomically and durably (the simulation keeps it on its disks).
The decision that data was lost is written there first (``pending``), before the journal starts
(which creates files that would hide the loss from the next start), so a crash while the
ledgers are listed leads to listing them again, never to serving the empty disks.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from ledgerstore.api import MetadataStore
from ledgerstore.bookie.files import FileSystem
from ledgerstore.bookie.journal import LogMark, journal_files, read_mark, write_mark
from ledgerstore.errors import BookieIOError, LedgerStoreError
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata, LedgerState

__all__ = ["LEDGER_MARK_FILE", "LIMBO_FILE", "Limbo", "ledgers_to_check", "lost_data", "write_ledger_marks"]

#: the limbo file's name in the journal directory
LIMBO_FILE = "limbo"
#: the journal's checkpoint mark (``journal.write_mark``)
_MARK_FILE = "lastMark"
#: in each ledger directory: the journal position its storage was last checkpointed to
LEDGER_MARK_FILE = "lastMark"
#: in the journal directory: the ledger directories carry :data:`LEDGER_MARK_FILE`
LEDGER_MARKS_FLAG = "ledgerMarks"


def lost_data(journal_dir: Path, files: FileSystem, *, fresh_cookie: bool, restamped: bool,
              ledger_dirs: Sequence[Path] = ()) -> str | None:
    """Why the bookie must treat its directories as having lost data, or None when they hold what
    its cookie says. ``fresh_cookie``: the cookie was first written by this start (a new bookie
    has nothing to lose); ``restamped``: some or all directories had no cookie and it was written
    again (from the metadata store's, or the other directories'). A bookie that ran before keeps
    journal files or a checkpoint mark in its journal directory from its first start on: none
    there means the directory was wiped. And each checkpoint leaves its mark in every ledger
    directory too (:func:`write_ledger_marks`): a ledger directory whose mark is behind the
    journal's, or missing, was restored from an older copy or wiped; a journal that ends before
    a ledger directory's mark was."""
    if restamped:
        return "some of its directories had no cookie while the bookie's others or the metadata store have one " \
               "(disks wiped or replaced)"
    if fresh_cookie:
        return None
    if files.exists(journal_dir / LIMBO_FILE):
        return None  # already known; the file says what is in limbo
    journal = journal_files(journal_dir, files)
    if not journal and not files.exists(journal_dir / _MARK_FILE):
        return f"its journal directory {journal_dir} holds a cookie but no journal (wiped, or restored from a copy)"
    return _ledger_dirs_out_of_step(journal_dir, journal, ledger_dirs, files)


def _ledger_dirs_out_of_step(journal_dir: Path, journal: list[tuple[int, Path]], ledger_dirs: Sequence[Path],
                             files: FileSystem) -> str | None:
    """Why the ledger directories and the journal do not fit together, or None when they do."""
    mark = read_mark(journal_dir, files)
    marked = files.exists(journal_dir / LEDGER_MARKS_FLAG)
    for d in ledger_dirs:
        if not files.exists(d / LEDGER_MARK_FILE):
            if marked:  # (a bookie of a version that wrote no such marks has no flag)
                return (f"its ledger directory {d} lost the checkpoint mark every checkpoint leaves there "
                        "(wiped, or replaced keeping its cookie)")
            continue
        try:
            at = read_mark(d, files, name=LEDGER_MARK_FILE)
        except BookieIOError as exc:
            return f"its ledger directory's checkpoint mark cannot be read ({exc})"
        if at < mark:
            return (f"its ledger directory {d} was checkpointed up to journal position {_show(at)}, the journal's "
                    f"mark says {_show(mark)}: the directory was restored from an older copy")
        if not _journal_reaches(journal, at, files):
            return (f"its journal directory {journal_dir} ends before position {_show(at)}, up to which ledger "
                    f"directory {d} was checkpointed: the journal was restored from an older copy")
    return None


def _show(mark: LogMark) -> str:
    return f"{mark.file_id:x}:{mark.offset}"


def _journal_reaches(journal: list[tuple[int, Path]], mark: LogMark, files: FileSystem) -> bool:
    """Whether the journal's files reach ``mark`` (its file is there and holds a byte before the
    mark's offset, or a later file is)."""
    if mark.file_id == 0 and mark.offset == 0:
        return True
    for fid, path in journal:
        if fid > mark.file_id:
            return True
        if fid == mark.file_id:
            return mark.offset <= 0 or len(files.read(path, mark.offset - 1, 1)) == 1
    return False


def write_ledger_marks(journal_dir: Path, ledger_dirs: Sequence[Path], mark: LogMark, files: FileSystem) -> None:
    """Leave ``mark`` (the journal position the storage engine now holds everything up to) in
    every ledger directory, durably, before the journal's mark moves to it (BookKeeper keeps its
    ``lastMark`` in the ledger directories); then, once, the journal directory's flag that says
    the marks are there, so that a mark missing later means a directory that lost it."""
    for d in ledger_dirs:
        write_mark(d, mark, files, name=LEDGER_MARK_FILE)
    if not files.exists(journal_dir / LEDGER_MARKS_FLAG):
        files.replace(journal_dir / LEDGER_MARKS_FLAG, b"")


async def ledgers_to_check(store: MetadataStore, bookie_id: str,
                           held: Collection[int]) -> tuple[list[LedgerMetadata], list[int]]:
    """What a bookie that lost data must see to: the ledgers whose fragments name ``bookie_id``
    (in ledger id order; they go in limbo), and, of ``held`` (the ledgers its directories still
    hold something of), those that no longer name it and are not open (closed, or in recovery):
    a fence of theirs may be lost with the data (a ledger directory restored from an older copy
    keeps their keys but not a fence recorded since), and a writer that does not know of the
    close or of the auto-recovery's swap may still send them adds. Those are fenced here again."""
    mgr = LedgerManager(store)
    naming: list[LedgerMetadata] = []
    fence_only: list[int] = []
    async for _, md in mgr.read_many(mgr.list()):
        if md is None:
            continue
        if bookie_id in md.bookies():
            naming.append(md)
        elif md.ledger_id in held and md.state is not LedgerState.OPEN:
            fence_only.append(md.ledger_id)
    return sorted(naming, key=lambda md: md.ledger_id), sorted(fence_only)


def fence_in_limbo(md: LedgerMetadata, bookie_id: str) -> bool:
    """Whether a ledger put in limbo is also fenced here: every one but an open ledger whose last
    fragment does not name this bookie. An open one whose last fragment names it may still get
    its writer's adds (BookKeeper fences those); a closed one may have been fenced here before
    the data was lost, and a stale writer's add must find it fenced still, after the ledger left
    limbo too. An open ledger whose last fragment names other bookies was never fenced here
    (recovery fences the last fragment, which no longer changes once it began), and a later
    ensemble change may pick this bookie for it."""
    return md.is_closed or bookie_id in md.ensembles[-1][1]


class Limbo:
    """The bookie's ledgers in limbo (a set the read side checks) and their durable record."""

    def __init__(self, ledgers: set[int]) -> None:
        """``ledgers``: the set the read side and the ledger rules look in (shared, changed here)."""
        self.ledgers = ledgers
        #: ledgers put in limbo open, fenced again at each start until they leave limbo
        self.fenced: set[int] = set()
        #: data was found lost and the ledgers are not listed yet
        self.pending = False
        self._dir: Path | None = None
        self._files: FileSystem | None = None
        #: ledgers put in limbo since the bookie started, and repaired since (metrics)
        self.marked_total = 0
        self.repaired_total = 0

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self.ledgers

    def __len__(self) -> int:
        return len(self.ledgers)

    def open(self, directory: Path, files: FileSystem) -> None:
        """Read the limbo file of ``directory`` if there is one. Raises LedgerStoreError naming
        the file when it cannot be read (the bookie does not start on a limbo it cannot trust)."""
        self._dir, self._files = directory, files
        path = directory / LIMBO_FILE
        if not files.exists(path):
            return
        try:
            body: Any = json.loads(files.read(path))
            ledgers = {int(x) for x in body["ledgers"]}
            fenced = {int(x) for x in body.get("fenced", ())}
            pending = bool(body.get("pending", False))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerStoreError(f"{path}: unreadable limbo file ({exc}); restore it, or delete it and "
                                   "format the bookie (ledgerstore shell bookieformat)") from None
        self.ledgers |= ledgers
        self.fenced = fenced & ledgers
        self.pending = pending

    def _save(self) -> None:
        if self._dir is None or self._files is None:
            raise LedgerStoreError("the limbo file's directory is not open")
        path = self._dir / LIMBO_FILE
        self._files.makedirs(self._dir)
        if not self.ledgers and not self.pending:
            self._files.remove(path)
            return
        body = {"version": 1, "pending": self.pending, "ledgers": sorted(self.ledgers), "fenced": sorted(self.fenced)}
        self._files.replace(path, json.dumps(body).encode())

    def begin(self) -> None:
        """Record durably that data was lost, before anything else is written."""
        self.pending = True
        self._save()

    def mark(self, ledgers: Iterable[int], fenced: Iterable[int]) -> None:
        """Put ``ledgers`` in limbo (``fenced``: those of them to keep fenced), durably; the
        listing is complete."""
        new = set(ledgers) - self.ledgers
        self.ledgers |= new
        self.fenced |= set(fenced) & self.ledgers
        self.pending = False
        self.marked_total += len(new)
        self._save()

    def clear(self, ledger_id: int) -> None:
        """The ledger is repaired (or deleted): it leaves limbo, durably."""
        if ledger_id not in self.ledgers:
            return
        self.ledgers.discard(ledger_id)
        self.fenced.discard(ledger_id)
        self.repaired_total += 1
        self._save()
