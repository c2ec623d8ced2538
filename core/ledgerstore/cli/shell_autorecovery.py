"""``shell`` commands of auto-recovery: the under-replication markers (``listunderreplicated``,
``queryautorecoverystatus``), the auditor (``whoisauditor``, ``triggeraudit``, ``forceauditchecks``)
and the cluster-wide switches (``autorecovery``, ``lostbookierecoverydelay``)."""

from __future__ import annotations

import sys
import time
from typing import Any, TypeVar

import click

from ledgerstore.cli.common import EXIT_NOT_FOUND, console, emit, handle_errors
from ledgerstore.cli.shell_context import ShellContext, pass_ctx
from ledgerstore.cli.shell_local import (
    json_option,
)
from ledgerstore.errors import NoSuchKeyError
from ledgerstore.recovery.markers import LOST_BOOKIE_DELAY, UnderReplicationManager

T = TypeVar("T")


def _urm(client: Any) -> UnderReplicationManager:
    return UnderReplicationManager(client.store)


@click.command()
@click.option("-mr", "--missingreplica", "--missing", "missing_bookie", default=None,
              help="only ledgers missing this bookie")
@click.option("-emr", "--excludingmissingreplica", "excluded_bookie", default=None,
              help="leave out the ledgers missing this bookie")
@click.option("-pmr", "--printmissingreplica", "print_missing", is_flag=True, help="print each ledger's missing bookies")
@click.option("-prw", "--printreplicationworkerid", "print_worker", is_flag=True,
              help="print the auto-recovery worker that has claimed each ledger")
@click.option("-c", "--onlydisplayledgercount", "only_count", is_flag=True, help="print only how many ledgers")
@json_option
@pass_ctx
@handle_errors
def listunderreplicated(sc: ShellContext, missing_bookie: str | None, excluded_bookie: str | None, print_missing: bool,
                        print_worker: bool, only_count: bool, as_json: bool) -> None:
    """List the ledgers marked under-replicated (with ``--json``: every field of each marker)."""

    async def go(client: Any) -> list[dict[str, Any]]:
        return [m.to_dict() for m in await _urm(client).all()
                if (missing_bookie is None or missing_bookie in m.missing)
                and (excluded_bookie is None or excluded_bookie not in m.missing)]

    rows = sc.with_client(go)
    if only_count:
        if as_json:
            emit({"count": len(rows)}, True)
        else:
            console.print(f"{len(rows)} under-replicated ledgers")
        return
    for r in rows:
        r["missing"] = ",".join(r["missing"])
        r["owner"] = r["owner"] or ""
        r["since"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["since"]))
    if as_json:
        emit(rows, True)
        return
    # Why a ledger is stuck (the worker's reason and its failed attempts), when the marker says so.
    stuck = ["stuck_reason", "failures"] if any(r.get("stuck_reason") for r in rows) else []
    cols = (["ledger_id", "since"] + stuck + ["last_error"] + (["missing"] if print_missing else [])
            + (["owner"] if print_worker else []))
    emit(rows, False, cols, title=f"{len(rows)} under-replicated ledgers")


@click.command()
@json_option
@pass_ctx
@handle_errors
def whoisauditor(sc: ShellContext, as_json: bool) -> None:
    """Print the elected auditor (exit code 3 when no auto-recovery process is running)."""

    async def go(client: Any) -> dict[str, Any]:
        urm = _urm(client)
        return {"auditor": await urm.auditor(), "candidates": await urm.candidates()}

    r = sc.with_client(go)
    if as_json:
        emit(r, True)
    else:
        console.print(r["auditor"] or "no auditor: no auto-recovery process is running")
    if r["auditor"] is None:
        sys.exit(EXIT_NOT_FOUND)


def _trigger_audit(sc: ShellContext, replicas: bool, as_json: bool) -> None:
    async def go(client: Any) -> str | None:
        urm = _urm(client)
        await urm.trigger_audit(replicas=replicas)
        return await urm.auditor()

    auditor = sc.with_client(go)
    if as_json:
        emit({"triggered": True, "replicas": replicas, "auditor": auditor}, True)
    else:
        what = "audit and replicas check" if replicas else "audit"
        console.print(f"{what} triggered (auditor: {auditor or 'none running; it will run when one is elected'})")


@click.command()
@click.option("--replicas", is_flag=True, help="also ask every bookie which ledgers it holds (replicas check)")
@json_option
@pass_ctx
@handle_errors
def triggeraudit(sc: ShellContext, replicas: bool, as_json: bool) -> None:
    """Ask the auditor for a full check of every ledger now."""
    _trigger_audit(sc, replicas, as_json)


@click.command()
@click.option("-calc", "-apc", "--checkallledgerscheck", "--auditorperiodiccheck", "auditorperiodiccheck", is_flag=True,
              help="the full ledger check (always run)")
@click.option("-rc", "--replicascheck", is_flag=True, help="also the replicas check")
@json_option
@pass_ctx
@handle_errors
def forceauditchecks(sc: ShellContext, auditorperiodiccheck: bool, replicascheck: bool, as_json: bool) -> None:
    """Make the auditor run its checks at its next chance (BookKeeper's forceauditchecks)."""
    _trigger_audit(sc, replicascheck, as_json)


@click.command()
@click.option("-v", "--verbose", is_flag=True, help="also the missing bookies and the last error")
@json_option
@pass_ctx
@handle_errors
def queryautorecoverystatus(sc: ShellContext, verbose: bool, as_json: bool) -> None:
    """The ledgers auto-recovery is replicating now (claimed by a worker) or waiting to."""

    async def go(client: Any) -> list[dict[str, Any]]:
        return [m.to_dict() for m in await _urm(client).all()]

    rows = sc.with_client(go)
    for r in rows:
        r["status"] = f"in recovery by {r['owner']}" if r["owner"] else "waiting"
        r["missing"] = ",".join(r["missing"])
    cols = ["ledger_id", "status"] + (["missing", "last_error"] if verbose else [])
    emit(rows, as_json, cols, title=f"{len(rows)} ledgers under replication" if rows else "no ledgers under replication")


@click.command("autorecovery")
@click.option("-e/-d", "--enable/--disable", "enable", default=None, help="switch auto-recovery on or off cluster-wide")
@json_option
@pass_ctx
@handle_errors
def autorecovery_switch(sc: ShellContext, enable: bool | None, as_json: bool) -> None:
    """Show, enable or disable auto-recovery (auditor marking and worker re-replication)."""

    async def go(client: Any) -> bool:
        urm = _urm(client)
        if enable is not None:
            await urm.set_enabled(enable)
        return await urm.is_enabled()

    enabled = sc.with_client(go)
    if as_json:
        emit({"enabled": enabled}, True)
    else:
        console.print(f"auto-recovery is {'enabled' if enabled else 'disabled'}")


@click.command()
@click.option("-g", "--get", "get", is_flag=True, help="print the delay (also what the command does without flags)")
@click.option("-s", "--set", "seconds", type=float, default=None, help="new delay in seconds (cluster-wide)")
@click.option("--clear", is_flag=True, help="forget the cluster-wide value: each process's config rules")
@json_option
@pass_ctx
@handle_errors
def lostbookierecoverydelay(sc: ShellContext, get: bool, seconds: float | None, clear: bool, as_json: bool) -> None:
    """Show or set how long a bookie must be gone before its ledgers are re-replicated."""

    if seconds is not None and not seconds >= 0:  # NaN included
        raise click.BadParameter("must be >= 0", param_hint="--set")
    if sum((get, seconds is not None, clear)) > 1:
        raise click.UsageError("give only one of -get, -set and --clear")

    async def go(client: Any) -> float | None:
        urm = _urm(client)
        if clear:
            try:
                await client.store.delete(LOST_BOOKIE_DELAY)
            except NoSuchKeyError:
                pass
        if seconds is not None:
            await urm.set_lost_bookie_delay(seconds)
        return await urm.lost_bookie_delay()

    value = sc.with_client(go)
    if as_json:
        emit({"lost_bookie_recovery_delay_s": value}, True)
    else:
        console.print("lost bookie recovery delay: " + (f"{value:g}s" if value is not None
                                                        else "not set cluster-wide (each process's config rules)"))
