"""``shell clusterinfo``, ``cookie_get`` and ``cookie_delete``: BookKeeper's cluster summary and its
cookie commands (``bookkeeper shell cookie_get BOOKIE``, ``cookie_delete [-f] BOOKIE``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ledgerstore.cli.common import EXIT_NOT_FOUND, console, emit, err_console, handle_errors
from ledgerstore.cli.shell_local import json_option
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import CookieManager
from ledgerstore.recovery.markers import UnderReplicationManager


async def cluster_info(client: Any) -> dict[str, Any]:
    """BookKeeper's ``ClusterInfo``, field for field: the auditor, whether any ledger is
    under-replicated, the replication switch, and the bookies by state. As BookKeeper counts,
    every bookie with a cookie is one of the cluster's; those not registered are unavailable."""

    urm = UnderReplicationManager(client.store)
    auditor = await urm.auditor()
    registered = await client.list_bookies(None)
    writable = sum(not b.read_only for b in registered)
    known = set(await client.store.children(layout.COOKIES)) | {b.bookie_id for b in registered}
    return {"auditorElected": auditor is not None, "auditorId": auditor or "",
            "clusterUnderReplicated": bool(await urm.ledger_ids()),
            "ledgerReplicationEnabled": await urm.is_enabled(), "totalBookiesCount": len(known),
            "writableBookiesCount": writable, "readonlyBookiesCount": len(registered) - writable,
            "unavailableBookiesCount": len(known) - len(registered)}


@click.command("clusterinfo")
@json_option
@click.pass_obj
@handle_errors
def clusterinfo(sc: Any, as_json: bool) -> None:
    """The cluster at a glance, as BookKeeper's clusterinfo: auditor, under-replication, bookie counts."""
    emit(sc.with_client(cluster_info), as_json, title="cluster info")


@click.command("cookie_get")
@click.argument("bookie_id")
@json_option
@click.pass_obj
@handle_errors
def cookie_get(sc: Any, bookie_id: str, as_json: bool) -> None:
    """Print the cookie registered for a bookie (exit 3 when it has none)."""

    cookie = sc.with_client(lambda client: CookieManager(client.store).get(bookie_id))
    if cookie is None:
        err_console.print(f"not found: no cookie is registered for bookie {bookie_id}", markup=False)
        sys.exit(EXIT_NOT_FOUND)
    emit(cookie, as_json, title=f"cookie of {bookie_id}")


@click.command("cookie_delete")
@click.argument("bookie_id")
@click.option("-f", "--force", is_flag=True, help="do not ask for confirmation")
@json_option
@click.pass_obj
@handle_errors
def cookie_delete(sc: Any, bookie_id: str, force: bool, as_json: bool) -> None:
    """Delete the cookie registered for a bookie (so a formatted bookie can join under its id).
    Refused while the bookie is registered; exit 3 when it has no cookie."""

    async def check(client: Any) -> bool:
        if bookie_id in {b.bookie_id for b in await client.list_bookies(None)}:
            raise LedgerStoreError(f"cookie_delete refused: {bookie_id} is registered (running); stop it first")
        return await CookieManager(client.store).get(bookie_id) is not None

    if not sc.with_client(check):
        err_console.print(f"not found: no cookie is registered for bookie {bookie_id}", markup=False)
        sys.exit(EXIT_NOT_FOUND)
    if not force and not click.confirm(f"delete the cookie of {bookie_id}?", default=False):
        raise click.Abort()
    sc.with_client(lambda client: CookieManager(client.store).delete(bookie_id))
    if as_json:
        emit({"bookie_id": bookie_id, "cookie_deleted": True}, True)
    else:
        console.print(f"deleted the cookie of {bookie_id}", markup=False)
