"""``shell recover`` and ``decommissionbookie``: re-replicate a bookie's ledgers from this process,
with a progress bar."""

from __future__ import annotations

import math
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from rich.progress import Progress

from ledgerstore.cli.common import (
    EXIT_NOT_FOUND,
    console,
    emit,
    err_console,
    handle_errors,
)
from ledgerstore.cli.shell_context import ShellContext, is_bookie_config, pass_ctx
from ledgerstore.cli.shell_local import (
    bookie_id_of,
    json_option,
)
from ledgerstore.config import AutoRecoveryConfig, load_bookie_config
from ledgerstore.errors import ConfigError
from ledgerstore.meta.ledgers import LedgerState
from ledgerstore.recovery.admin import BookieNotFoundError, decommission_bookie, recover_bookie

T = TypeVar("T")


def _recovery_settings(grace: float, rate: float | None) -> Any:
    """The copy settings of a recover or decommission run here; a rate that is not positive is
    refused in one line (omitting it means no throttle)."""
    settings = AutoRecoveryConfig(open_ledger_rereplication_grace_s=grace,
                                  rereplication_entries_per_s=math.inf if rate is None else rate)
    problems = settings.validate()
    if problems:
        raise ConfigError("; ".join(p.replace("'autorecovery.rereplication_entries_per_s'", "--entries-per-second")
                                    .replace("(omit it", "(omit the option") for p in problems))
    return settings


def _run_with_progress(sc: ShellContext, label: str, as_json: bool,
                       work: Callable[[Any, Callable[[int, int], None]], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=max(total, 1))

        try:
            return sc.with_client(lambda client: work(client, update))
        except BookieNotFoundError as exc:
            err_console.print(f"[red]not found:[/red] {exc}")
            sys.exit(EXIT_NOT_FOUND)


@click.command()
@click.argument("bookie_id")
@click.option("--open-ledger-grace", "grace", type=float, default=30.0, show_default=True,
              help="seconds an open ledger's writer gets to move off the bookie before it is fenced and closed")
@click.option("--entries-per-second", "rate", type=float, default=None, help="copy throttle (omit for none)")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="seconds")
@click.option("--delete-cookie", is_flag=True, help="delete the bookie's cookie afterwards")
@click.option("-q", "--query", is_flag=True, help="only list the ledgers with a fragment on the bookie")
@click.option("-dr", "--dryrun", is_flag=True, help="only list what would be re-replicated")
@click.option("-sk", "--skipOpenLedgers", "skip_open", is_flag=True,
              help="leave open ledgers alone (their writers keep them; they are not fenced and closed)")
@click.option("-l", "--ledger", "only_ledger", type=int, default=None, help="recover only this ledger")
@click.option("-f", "--force", is_flag=True,
              help="BookKeeper's 'recover without asking'; this command never asks, so runbooks' -f is accepted")
@json_option
@pass_ctx
@handle_errors
def recover(sc: ShellContext, bookie_id: str, grace: float, rate: float | None, timeout: float, delete_cookie: bool,
            query: bool, dryrun: bool, skip_open: bool, only_ledger: int | None, force: bool, as_json: bool) -> None:
    """Re-replicate every ledger fragment of a dead bookie, from this process (no auditor needed)."""

    def keep(md: Any) -> bool:
        return ((only_ledger is None or md.ledger_id == only_ledger)
                and not (skip_open and md.state is LedgerState.OPEN))

    if only_ledger is not None and delete_cookie:
        raise click.UsageError("-deleteCookie recovers the whole bookie: it does not go with -l")
    if query or dryrun:
        async def go(client: Any) -> list[dict[str, Any]]:
            rows = []
            for lid in await client.list_ledgers():
                md = await client.ledger_metadata(lid)
                firsts = [first for first, ens in md.ensembles if bookie_id in ens]
                if firsts and keep(md):
                    rows.append({"ledger_id": lid, "state": md.state.value, "fragments": len(firsts)})
            return rows

        rows = sc.with_client(go)
        emit(rows, as_json, ["ledger_id", "state", "fragments"],
             title=f"{len(rows)} ledgers with fragments on {bookie_id}" + (" (dry run: nothing copied)" if dryrun else ""))
        return

    selective = only_ledger is not None or skip_open
    r = _run_with_progress(sc, f"recovering {bookie_id}", as_json, lambda client, update: recover_bookie(
        client, bookie_id, _recovery_settings(grace, rate), timeout, update, delete_cookie,
        keep if selective else None))
    if as_json:
        emit(r, True)
    else:
        console.print(f"[green]recovered {bookie_id}[/green]: {r['ledgers']} ledgers, {r['entries_copied']:,} entries "
                      f"({r['bytes_copied']:,} bytes) copied in {r['seconds']}s")


@click.command()
@click.argument("bookie_id", required=False)
@click.option("--bookieid", "bookie_opt", default=None,
              help="the bookie to decommission (BookKeeper's -bookieid; default: the one --config names)")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="seconds")
@click.option("--local-worker", is_flag=True,
              help="also copy from this process (otherwise the cluster's auto-recovery workers do it)")
@click.option("--open-ledger-grace", "grace", type=float, default=30.0, show_default=True,
              help="for --local-worker: seconds an open ledger's writer gets before it is fenced and closed")
@click.option("--entries-per-second", "rate", type=float, default=None,
              help="for --local-worker: copy throttle (omit for none)")
@json_option
@pass_ctx
@handle_errors
def decommissionbookie(sc: ShellContext, bookie_id: str | None, bookie_opt: str | None, timeout: float,
                       local_worker: bool, grace: float, rate: float | None, as_json: bool) -> None:
    """Move every ledger off a bookie (alive or dead), then delete its cookie. A live bookie
    running auto-recovery turns read-only first; stop it once this is done. The bookie is named
    as an argument, by ``-bookieid``, or (as BookKeeper's shell does on the bookie's own host) by
    the bookie config given to ``--config``."""

    if bookie_id and bookie_opt and bookie_id != bookie_opt:
        raise click.UsageError(f"two bookies named: {bookie_id} and -bookieid {bookie_opt}")
    bookie_id = bookie_id or bookie_opt
    if bookie_id is None:
        if not (sc.config and is_bookie_config(sc.config)):
            raise click.UsageError("name the bookie: decommissionbookie -bookieid HOST:PORT (or --config bookie.toml)")

        bookie_id = bookie_id_of(load_bookie_config(sc.config))
    target = bookie_id

    r = _run_with_progress(sc, f"decommissioning {bookie_id}", as_json, lambda client, update: decommission_bookie(
        client, target, _recovery_settings(grace, rate), timeout, update, local_worker))
    if as_json:
        emit(r, True)
    else:
        console.print(f"[green]decommissioned {bookie_id}[/green]: {r['ledgers']} ledgers moved off it in "
                      f"{r['seconds']}s; cookie deleted" + ("" if r["autorecovery_enabled"] else
                                                            " (note: auto-recovery is disabled cluster-wide)"))
