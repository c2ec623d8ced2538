"""Hook implementations, registered through the ``ledgerstore.hooks`` entry point.

ledgerstore loads this module in every process (client, bookie, CLI) that has the distribution
installed. Hooks run on lifecycle and ledger events, never once per entry, so logging here is
cheap. See ``ledgerstore.hookspecs`` for every hook and its arguments.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import click

from ledgerstore import hookimpl
from ledgerstore.api import BookieInfo
from ledgerstore_example_plugin.placement import RoundRobinPlacement

log = logging.getLogger("ledgerstore_example_plugin")


@hookimpl
def ledgerstore_ledger_created(ledger_id: int, metadata: Any) -> None:
    """Log every ledger this process creates, with its ensemble and quorums."""
    log.info(
        "ledger %d created on %s (ensemble %d, write quorum %d, ack quorum %d)",
        ledger_id,
        ",".join(metadata.ensembles[-1][1]),
        metadata.ensemble_size,
        metadata.write_quorum,
        metadata.ack_quorum,
    )


@hookimpl
def ledgerstore_ledger_closed(ledger_id: int, last_entry_id: int, recovered: bool) -> None:
    """Log every ledger this process closes, saying whether recovery closed it."""
    log.info("ledger %d closed at entry %d%s", ledger_id, last_entry_id, " by recovery" if recovered else "")


@click.command("placement-preview")
@click.argument("bookie_ids", nargs=-1, required=True)
@click.option("-n", "--ledgers", default=4, show_default=True, help="how many ensembles to show")
@click.option("-e", "--ensemble", default=3, show_default=True, help="ensemble size")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def placement_preview(bookie_ids: tuple[str, ...], ledgers: int, ensemble: int, as_json: bool) -> None:
    """Show the ensembles round-robin placement would choose among BOOKIE_IDS."""
    from ledgerstore.errors import LedgerStoreError

    policy = RoundRobinPlacement()
    bookies = [BookieInfo(bookie_id=b) for b in bookie_ids]
    try:
        chosen = [policy.new_ensemble(ensemble, ensemble, ensemble, bookies) for _ in range(ledgers)]
    except LedgerStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(chosen))
        return
    for i, ens in enumerate(chosen, 1):
        click.echo(f"ledger {i}: {', '.join(ens)}")
    click.echo(f"{ledgers} ensembles of {ensemble} over {len(bookie_ids)} bookies")


@hookimpl
def ledgerstore_cli_commands() -> list[click.Command]:
    """Add ``ledgerstore placement-preview`` to the command line."""
    return [placement_preview]
