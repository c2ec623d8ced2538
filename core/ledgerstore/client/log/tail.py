"""Taking over a log's tail: the ledgers a new leader (or a deleter) recovers and closes before
it changes the log, and their recovery in log order. Used by :mod:`.writer` (opening a log as
its leader) and :mod:`.admin` (deleting a log)."""

from __future__ import annotations

import asyncio

from ledgerstore.client.log.base import LogClient
from ledgerstore.errors import LogError, NoSuchLedgerError
from ledgerstore.meta.logs import LogManager, LogMetadata

#: ledgers whose metadata a new leader reads at once while looking for ones to recover
RECOVERY_SCAN_BATCH = 32


async def unclosed(client: LogClient, md: LogMetadata) -> list[int]:
    """The log's ledgers that must be recovered before a new leader writes: the last two always
    (their writer may still be adding), and every older one whose metadata is not CLOSED. A writer
    never rolls past a ledger it failed to close, but a writer of an older release did, and a
    reader stops at such a ledger until someone closes it (DistributedLog likewise recovers every
    in-progress segment of a log, not only the last)."""
    ids = md.ledger_ids
    tail = ids[-2:]
    older = ids[:-2]
    found: list[int] = []
    for i in range(0, len(older), RECOVERY_SCAN_BATCH):
        chunk = older[i:i + RECOVERY_SCAN_BATCH]
        got = await asyncio.gather(*(client.ledger_metadata(lid) for lid in chunk), return_exceptions=True)
        for lid, lmd in zip(chunk, got, strict=True):
            if isinstance(lmd, NoSuchLedgerError):
                found.append(lid)  # _recover_ledgers tells a damaged list from a changed one
            elif isinstance(lmd, BaseException):
                raise lmd
            elif not lmd.is_closed:
                found.append(lid)
    return [*found, *tail]


async def fence_tail(client: LogClient, logs: LogManager, md: LogMetadata, password: bytes) -> bool:
    """Fence (recover and close) the last two ledgers. False if the list changed meanwhile."""
    return await recover_ledgers(client, logs, md, password, md.ledger_ids[-2:])


async def recover_ledgers(client: LogClient, logs: LogManager, md: LogMetadata, password: bytes,
                           ids: list[int]) -> bool:
    """Recover and close ``ids`` (ledgers of ``md``) in log order. False if the list changed meanwhile."""
    for lid in ids:
        try:
            await client.open_ledger(lid, password, recovery=True)
        except NoSuchLedgerError:
            fresh = await logs.read(md.name)
            if fresh is None or fresh.version != md.version:
                return False
            raise LogError(
                f"log {md.name!r} lists ledger {lid}, which does not exist: the log metadata is damaged") from None
    return True
