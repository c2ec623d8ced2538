"""The calls on logs as a whole: list them, delete one (fencing its tail first, so a live writer
stops) and truncate one (whole ledgers before a position)."""

from __future__ import annotations

import dataclasses

from ledgerstore.client.log.base import LogClient, log_manager
from ledgerstore.client.log.tail import fence_tail
from ledgerstore.errors import BadVersionError, LogError, NoSuchLedgerError
from ledgerstore.meta.logs import Position


async def list_logs(client: LogClient) -> list[str]:
    """Names of every log, sorted."""
    return await log_manager(client).list()


async def fence_and_delete_log(client: LogClient, name: str, password: bytes) -> None:
    """Delete a log: fence its tail (so a live writer stops), delete its key by CAS, then its ledgers."""
    logs = log_manager(client)
    while True:
        md = await logs.read(name)
        if md is None:
            raise LogError(f"log {name!r} does not exist")
        if not await fence_tail(client, logs, md, password):
            continue
        try:
            await logs.delete(md)
        except BadVersionError:
            continue
        break
    for lid in [*md.deleting, *md.ledger_ids]:
        await delete_quietly(client, lid)


async def delete_quietly(client: LogClient, ledger_id: int) -> None:
    """Delete a ledger of a log; one already gone is fine."""
    try:
        await client.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass  # already gone (an earlier, interrupted truncation or deletion got this far)


async def truncate_log(client: LogClient, name: str, before: Position | tuple[int, int] | str) -> list[int]:
    """Delete the whole ledgers that lie entirely before ``before`` and return their ids. The list
    is changed by CAS first (ledgers move to ``deleting``), then the ledgers are deleted, then
    ``deleting`` is cleared, so an interrupted truncation is finished by the next one. The last
    ledger of the log is never deleted."""
    pos = Position.coerce(before)
    logs = log_manager(client)
    while True:
        md = await logs.read(name)
        if md is None:
            raise LogError(f"log {name!r} does not exist")
        drop: list[int] = []
        for lid in md.ledger_ids[:-1]:
            if lid < pos.ledger_id:
                drop.append(lid)
            elif lid == pos.ledger_id:
                lmd = await client.ledger_metadata(lid)
                if lmd.is_closed and lmd.last_entry_id < pos.entry_id:
                    drop.append(lid)
                break
            else:
                break
        tb = md.truncated_before
        new_tb = pos if tb is None or pos > tb else tb
        if not drop and new_tb == tb and not md.deleting:
            return []
        candidate = dataclasses.replace(
            md, segments=[s for s in md.segments if s.ledger_id not in drop], truncated_before=new_tb,
            deleting=sorted({*md.deleting, *drop}))
        try:
            md = await logs.write(candidate)
        except BadVersionError:
            continue
        break
    for lid in md.deleting:
        await delete_quietly(client, lid)
    done = set(md.deleting)
    while True:
        try:
            await logs.write(dataclasses.replace(md, deleting=[x for x in md.deleting if x not in done]))
            break
        except BadVersionError:
            fresh = await logs.read(name)
            if fresh is None:
                break
            md = fresh
    return drop
