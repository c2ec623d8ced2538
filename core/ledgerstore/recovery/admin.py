"""Operator actions on top of the markers and workers: recover a dead bookie from this process,
and decommission a bookie (dead or alive) through the cluster's workers. Used by the shell.

Both ask placement first whether every ledger naming the bookie can get a replacement, and
refuse at once, naming the ledgers and why, when one cannot (a 3-bookie cluster with E=3
ledgers); while draining they give up as soon as a worker finds a ledger stuck for want of
bookies, instead of waiting out their timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ledgerstore.client.client import Client
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import LedgerStoreError, NoSuchLedgerError, NotEnoughBookiesError
from ledgerstore.meta.bookies import CookieManager
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.recovery.markers import Marker, UnderReplicationManager
from ledgerstore.recovery.stuck import NOT_ENOUGH_BOOKIES, no_replacement
from ledgerstore.recovery.worker import ReplicationWorker

#: ``progress(done, total)``: ledgers no longer referencing the bookie out of those that did
Progress = Callable[[int, int], None]


class BookieNotFoundError(LedgerStoreError):
    """No ledger, cookie or registration names the bookie."""


class PlacementShortfallError(LedgerStoreError):
    """Placement cannot move some ledgers off the bookie: the action could never finish."""


#: which ledgers an operator action covers, from their metadata (``recover -l`` / ``-sk``)
LedgerFilter = Callable[["LedgerMetadata"], bool]


async def ledgers_referencing(client: Client, bookie_id: str, keep: LedgerFilter | None = None) -> list[int]:
    """Ids of the ledgers whose metadata names ``bookie_id`` in any fragment (and that ``keep``
    accepts, when given)."""
    out = []
    async for lid in client.ledgers.list():
        try:
            md = await client.ledgers.read(lid)
        except NoSuchLedgerError:
            continue
        if bookie_id in md.bookies() and (keep is None or keep(md)):
            out.append(lid)
    return out


async def _markers_naming(urm: UnderReplicationManager, bookie_id: str) -> dict[int, Marker]:
    return {m.ledger_id: m for m in await urm.all() if bookie_id in m.missing}


async def placement_shortfall(client: Client, bookie_id: str, ledger_ids: list[int]) -> dict[int, str]:
    """``{ledger id: why}`` for the ledgers among ``ledger_ids`` one of whose fragments naming
    ``bookie_id`` has no replacement for it among the other writable bookies (as the workers
    choose: outside the fragment's ensemble and away from bookies being decommissioned)."""
    store = client.store
    assert store is not None, "the client is not started"
    bookies = [b for b in await client.bookie_infos(max_age=0) if b.bookie_id != bookie_id]
    exclude = frozenset({bookie_id} | await UnderReplicationManager(store).decommissioning())
    out: dict[int, str] = {}
    for lid in ledger_ids:
        try:
            md = await client.ledgers.read(lid)
        except NoSuchLedgerError:
            continue
        for _first, ensemble in md.ensembles:
            if bookie_id not in ensemble:
                continue
            index = list(ensemble).index(bookie_id)
            try:
                client.placement.replace_bookie(list(ensemble), md.write_quorum, md.ack_quorum, index, bookies,
                                                exclude)
            except NotEnoughBookiesError as exc:
                out[lid] = str(no_replacement(lid, ensemble, index, bookies, exclude, exc))
                break
    return out


def _shortfall_error(what: str, bookie_id: str, why: dict[int, str]) -> PlacementShortfallError:
    ids = sorted(why)
    shown = ", ".join(map(str, ids[:20])) + (", ..." if len(ids) > 20 else "")
    return PlacementShortfallError(
        f"{what} of bookie {bookie_id} cannot finish: {len(ids)} ledger{'s' if len(ids) > 1 else ''} ({shown}) "
        f"{'have' if len(ids) > 1 else 'has'} no replacement for it; "
        f"ledger {ids[0]}: {why[ids[0]]}. Add writable bookies (or see docs/autorecovery.md on sizing E), "
        "then try again")


async def _drain(client: Client, urm: UnderReplicationManager, bookie_id: str, timeout: float,
                 progress: Progress | None, what: str, keep: LedgerFilter | None = None) -> dict[str, Any]:
    """Mark every ledger naming the bookie (that ``keep`` accepts), again and again (new ones may
    appear under a write load), until none does and no marker names it (none of those ledgers')."""
    t0 = time.monotonic()
    seen: set[int] = set()
    while True:
        refs = await ledgers_referencing(client, bookie_id, keep)
        seen |= set(refs)
        for lid in refs:
            await urm.mark(lid, {bookie_id})
        markers = await _markers_naming(urm, bookie_id)
        pending = set(markers)
        if keep is not None:  # the ledgers left out are not waited for, whoever marked them
            pending &= seen
        stuck = {lid: markers[lid].last_error for lid in pending if markers[lid].stuck_reason == NOT_ENOUGH_BOOKIES}
        if stuck:  # placement changed under us (a bookie went away): no point waiting
            raise _shortfall_error(what, bookie_id, stuck)
        left = set(refs) | pending
        if progress is not None:
            progress(len(seen - left), len(seen))
        if not left:
            return {"bookie_id": bookie_id, "ledgers": len(seen), "seconds": round(time.monotonic() - t0, 3)}
        if time.monotonic() - t0 > timeout:
            raise LedgerStoreError(
                f"{what} of bookie {bookie_id} did not finish within {timeout:.0f}s: {len(left)} ledgers still name it "
                f"(e.g. {sorted(left)[:5]}); see `ledgerstore shell listunderreplicated` for their errors")
        await asyncio.sleep(0.5)


async def recover_bookie(client: Client, bookie_id: str, settings: AutoRecoveryConfig, timeout: float = 3600.0,
                         progress: Progress | None = None, delete_cookie: bool = False,
                         keep: LedgerFilter | None = None) -> dict[str, Any]:
    """Re-replicate everything a dead bookie held (only the ledgers ``keep`` accepts, when given),
    with a worker in this process (no auditor needed). The bookie must be down: a live one is
    decommissioned instead."""
    store = client.store
    assert store is not None, "the client is not started"
    urm = UnderReplicationManager(store)
    if bookie_id in {b.bookie_id for b in await client.bookie_infos(max_age=0)}:
        raise LedgerStoreError(f"bookie {bookie_id} is registered (alive): stop it first, or use decommissionbookie")
    cookies = CookieManager(store)
    refs = await ledgers_referencing(client, bookie_id, keep)
    if await cookies.get(bookie_id) is None and not refs and not await ledgers_referencing(client, bookie_id):
        raise BookieNotFoundError(f"no cookie and no ledger names bookie {bookie_id}")
    short = await placement_shortfall(client, bookie_id, refs)
    if short:
        raise _shortfall_error("recovery", bookie_id, short)
    worker = ReplicationWorker(client, settings, f"recover-{socket.gethostname()}-{os.getpid()}",
                               only={bookie_id}, obey_switch=False)
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        result = await _drain(client, urm, bookie_id, timeout, progress, "recovery", keep)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if delete_cookie:
        await cookies.delete(bookie_id)
    result.update(entries_copied=worker.stats["entries"], bytes_copied=worker.stats["bytes"],
                  cookie_deleted=delete_cookie)
    return result


async def decommission_bookie(client: Client, bookie_id: str, settings: AutoRecoveryConfig, timeout: float = 3600.0,
                              progress: Progress | None = None, local_worker: bool = False) -> dict[str, Any]:
    """Move every ledger off ``bookie_id`` (alive or dead) and delete its cookie.

    The bookie is listed under ``/underreplication/decommission`` (a bookie running auto-recovery
    turns itself read-only when it sees that); every ledger naming it is marked until none does;
    the cluster's workers (and, with ``local_worker``, one in this process) do the copying. On
    timeout or interruption the decommission is called off."""
    store = client.store
    assert store is not None, "the client is not started"
    urm = UnderReplicationManager(store)
    cookies = CookieManager(store)
    registered = bookie_id in {b.bookie_id for b in await client.bookie_infos(max_age=0)}
    refs = await ledgers_referencing(client, bookie_id)
    if not registered and await cookies.get(bookie_id) is None and not refs:
        raise BookieNotFoundError(f"no registration, cookie or ledger names bookie {bookie_id}")
    short = await placement_shortfall(client, bookie_id, refs)
    if short:  # before anything is changed: the bookie is not turned read-only for nothing
        raise _shortfall_error("decommissioning", bookie_id, short)
    await urm.start_decommission(bookie_id)
    task = None
    if local_worker:
        worker = ReplicationWorker(client, settings, f"decommission-{socket.gethostname()}-{os.getpid()}",
                                   only={bookie_id}, obey_switch=False)
        task = asyncio.get_running_loop().create_task(worker.run())
    ok = False
    try:
        result = await _drain(client, urm, bookie_id, timeout, progress, "decommissioning")
        ok = True
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if ok:
            await cookies.delete(bookie_id)
        await urm.end_decommission(bookie_id)
    result.update(was_registered=registered, cookie_deleted=True,
                  autorecovery_enabled=await urm.is_enabled())
    return result
