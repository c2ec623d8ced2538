"""What makes a running bookie the owner of its data, and the check that it still is.

A bookie locks its journal and ledger directories for as long as it runs (:mod:`dirlock`), so
``bookieformat`` and the other offline tools that write refuse to touch them. What the lock cannot
stop (``rm -rf``, a disk unmounted, a cookie rewritten by hand, the cookie in the metadata store
replaced) :meth:`Ownership.check` notices on every disk check: the directories, their lock files
and cookie files must still be the ones the bookie started with, and the metadata store must
still hold the same incarnation for its id. A bookie that fails the check has lost its data: it
stops taking writes, answers the auditor's replicas check with nothing, and asks the auditor for
one now so that every ledger it held is re-replicated.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ledgerstore.api import MetadataStore
from ledgerstore.bookie import cookie as cookies
from ledgerstore.bookie.dirlock import DirLock
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.bookies import CookieManager, identity
from ledgerstore.recovery.markers import UnderReplicationManager

log = logging.getLogger(__name__)


class Ownership:
    """The directory locks and the cookie of one running bookie."""

    def __init__(self, journal_dir: Path, ledger_dirs: list[Path]) -> None:
        self.dirs = cookies.cookie_dirs(journal_dir, ledger_dirs)
        self.lock = DirLock(self.dirs)
        #: the cookie the bookie runs with (set once the cookie check passed)
        self.cookie: dict[str, Any] | None = None
        #: why the bookie no longer owns its data; None while it does
        self.lost: str | None = None

    def acquire(self) -> None:
        """Lock the directories (DirectoryLockedError naming the holder's PID if in use)."""
        self.lock.acquire()

    def release(self) -> None:
        self.lock.release()

    async def check(self, store: MetadataStore | None, bookie_id: str) -> str | None:
        """Why the bookie's data is no longer its own, or None. Once lost, always lost: the
        data cannot come back under this process."""
        if self.lost is not None or self.cookie is None:
            return self.lost
        problems = self.lock.lost() or cookies.changed_under(self.dirs, self.cookie)
        if not problems and store is not None:
            try:
                remote = await CookieManager(store).get(bookie_id)
            except LedgerStoreError as exc:  # a metadata outage says nothing about our disks
                log.debug("cookie check skipped: %s", exc)
                remote = self.cookie
            if remote is None:
                problems = ["its cookie was deleted from the metadata store"]
            elif identity(remote) != identity(self.cookie):
                problems = [f"the metadata store now names incarnation {identity(remote)!r} for it, "
                            f"this process is {identity(self.cookie)!r}"]
        if problems:
            self.lost = "; ".join(problems)
        return self.lost

    @staticmethod
    async def ask_for_replicas_check(store: MetadataStore | None) -> None:
        """Ask the auditor to check at once which ledgers every bookie really holds."""
        if store is None:
            return
        try:
            await UnderReplicationManager(store).trigger_audit(replicas=True)
        except LedgerStoreError as exc:
            log.warning("could not ask the auditor for a replicas check: %s", exc)
