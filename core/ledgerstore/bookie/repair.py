"""A bookie's repair of its limbo ledgers (BookKeeper's ``DataIntegrityCheckImpl``): it copies
what it should hold from the other replicas of each fragment, then takes the ledger out of limbo.

Ledger by ledger, in id order: a ledger whose metadata is gone, or whose fragments no longer name
this bookie, simply leaves limbo. An open one is recovered first, exactly as
``open_ledger(recovery=True)`` does (this bookie's own answers are UNKNOWN, no vote, so the
recovery needs the other replicas). Then, for every fragment naming this bookie, the entries of
its share are copied to it with the auto-recovery's fragment copy
(:meth:`~ledgerstore.recovery.worker.ReplicationWorker.copy`: read from the other bookies of each
entry's write set, digest verified, written with recovery adds, throttled by
``[bookie.autorecovery] rereplication_entries_per_s`` and ``replication_rate_by_bytes``), and
only then is the ledger cleared, durably. A ledger that cannot be repaired yet (its replicas are
down, its metadata holds no password) stays in limbo and is tried again every ``retry_s``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable

from ledgerstore.bookie.limbo import Limbo
from ledgerstore.client.client import Client
from ledgerstore.client.recovery import recover
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import LedgerStoreError, NoSuchLedgerError
from ledgerstore.recovery.stuck import NoPasswordError
from ledgerstore.recovery.worker import ReplicationWorker

__all__ = ["LimboRepair"]

log = logging.getLogger(__name__)

#: a ledger that could not be repaired is tried again after this long
RETRY_S = 5.0


class LimboRepair:
    """Repairs the limbo ledgers of one bookie until none is left (``await run()``)."""

    def __init__(self, bookie_id: str, limbo: Limbo, client: Callable[[], Awaitable[Client]],
                 settings: AutoRecoveryConfig, retry_s: float = RETRY_S,
                 on_cleared: Callable[[], None] | None = None) -> None:
        """``client`` starts the client the repair reads and writes through (closed at the end);
        ``on_cleared`` is called each time a ledger left limbo (the bookie publishes the count)."""
        self.bookie_id, self.limbo, self._client = bookie_id, limbo, client
        self._on_cleared = on_cleared
        #: the copy's throttle and batch size (``[bookie.autorecovery]``); the pause between passes
        self.settings, self.retry_s = settings, retry_s
        #: attempts that failed (a metric)
        self.failures = 0
        #: the auto-recovery's fragment copy, with the client once :meth:`run` started it
        self.worker: ReplicationWorker | None = None
        #: ledger -> the last reason its repair failed (logged once per change)
        self._failing: dict[int, str] = {}

    @property
    def entries_copied(self) -> int:
        """Entries copied to this bookie so far."""
        return self.worker.stats["entries"] if self.worker is not None else 0

    async def run(self) -> None:
        """Repair every limbo ledger, retrying the ones that fail, until none is left."""
        if not len(self.limbo):
            return
        client = await self._client()
        try:
            self.worker = ReplicationWorker(client, self.settings, f"limbo-{self.bookie_id}", only={self.bookie_id},
                                            obey_switch=False)
            while len(self.limbo):
                for lid in sorted(self.limbo.ledgers):
                    try:
                        await self.repair(client, lid)
                    except LedgerStoreError as exc:
                        self.failures += 1
                        if self._failing.get(lid) != str(exc):
                            log.warning("limbo ledger %d not repaired yet (retried every %.0fs): %s", lid,
                                        self.retry_s, exc)
                            self._failing[lid] = str(exc)
                if len(self.limbo):
                    await asyncio.sleep(self.retry_s)
            log.info("bookie %s: every limbo ledger repaired (%d entries copied)", self.bookie_id,
                     self.entries_copied)
        finally:
            await client.close()

    async def repair(self, client: Client, ledger_id: int) -> None:
        """Repair one ledger and take it out of limbo. Raises LedgerStoreError when it cannot yet."""
        assert self.worker is not None
        try:
            md = await client.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            md = None
        if md is not None and self.bookie_id in md.bookies():
            if md.password is None:
                raise NoPasswordError(f"ledger {ledger_id} has no password in its metadata, so this bookie cannot "
                                      "read its other replicas to repair itself")
            password = base64.b64decode(md.password)
            if not md.is_closed:
                md = await recover(client, md, password)
            copied = 0
            for first, last, ensemble in md.fragment_ranges():
                if self.bookie_id in ensemble:
                    copied += await self.worker.copy(md, password, first, last, ensemble,
                                                     ensemble.index(self.bookie_id), self.bookie_id, {self.bookie_id})
            log.info("limbo ledger %d repaired: %d entries copied to this bookie", ledger_id, copied)
        await asyncio.to_thread(self.limbo.clear, ledger_id)
        self._failing.pop(ledger_id, None)
        if self._on_cleared is not None:
            self._on_cleared()
