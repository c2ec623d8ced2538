"""``shell`` commands on one ledger or the list of them: ``listledgers``, ``ledgermetadata``,
``readledger`` and ``deleteledger``."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, TypeVar

import click

from ledgerstore.cli.common import console, emit, handle_errors, payload_text
from ledgerstore.cli.shell_bookie_read import read_from_bookie
from ledgerstore.cli.shell_context import ShellContext, pass_ctx
from ledgerstore.cli.shell_ledger_files import dump_ledger_metadata, restore_ledger_metadata
from ledgerstore.cli.shell_local import (
    json_option,
)

T = TypeVar("T")


@click.command()
@click.option("-m", "--meta", is_flag=True, help="print each ledger's metadata too")
@click.option("--bookieid", "bookie_id", default=None, help="only ledgers with this bookie in an ensemble")
@json_option
@pass_ctx
@handle_errors
def listledgers(sc: ShellContext, meta: bool, bookie_id: str | None, as_json: bool) -> None:
    """List ledger ids."""

    async def go(client: Any) -> list[dict[str, Any]]:
        out = []
        for lid in await client.list_ledgers():
            row: dict[str, Any] = {"ledger_id": lid}
            md: Any = await client.ledger_metadata(lid) if meta or bookie_id else None
            if bookie_id and not any(bookie_id in ens for _, ens in md.ensembles):
                continue
            if meta:
                row.update(state=md.state.value, last_entry_id=md.last_entry_id, length=md.length,
                           ensembles=len(md.ensembles), quorum=f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}")
            out.append(row)
        return out

    rows = sc.with_client(go)
    emit(rows, as_json, ["ledger_id", "state", "last_entry_id", "length", "quorum"] if meta else ["ledger_id"],
         title=f"{len(rows)} ledgers")


@click.command()
@click.option("-l", "--ledgerid", "ledger_id", type=int, required=True)
@click.option("--dumptofile", "dump_to", type=click.Path(dir_okay=False),
              help="write the ledger's stored metadata to this file (created with mode 0600)")
@click.option("--restorefromfile", "restore_from", type=click.Path(dir_okay=False, exists=True),
              help="write the metadata a --dumptofile file holds as this ledger's")
@click.option("--update", is_flag=True, help="with --restorefromfile: overwrite the ledger's metadata if it exists")
@json_option
@pass_ctx
@handle_errors
def ledgermetadata(sc: ShellContext, ledger_id: int, dump_to: str | None, restore_from: str | None, update: bool,
                   as_json: bool) -> None:
    """Print a ledger's metadata, dump it to a file or restore it from one (BookKeeper's
    ``-dumptofile`` / ``-restorefromfile [-update]``)."""

    if dump_to and restore_from:
        raise click.UsageError("give only one of -dumptofile and -restorefromfile")
    if update and not restore_from:
        raise click.UsageError("-update goes with -restorefromfile")
    if restore_from:
        md = sc.with_client(lambda c: restore_ledger_metadata(c, ledger_id, Path(restore_from), update))
    else:
        md = sc.with_client(lambda c: c.ledger_metadata(ledger_id))
        if dump_to:
            dump_ledger_metadata(md, Path(dump_to))
    emit(md.to_dict(), as_json, title=f"ledger {ledger_id}")


@click.command()
@click.option("-l", "--ledgerid", "ledger_id", type=int, required=True)
@click.option("-fe", "--firstentryid", "first", type=int, default=0, show_default=True)
@click.option("-le", "--lastentryid", "last", type=int, default=-1, help="default: the last entry")
@click.option("-p", "--password", default="", help="ledger password (text)")
@click.option("-r", "--recovery", "--force-recovery", "recovery", is_flag=True,
              help="open with recovery (fences an open ledger and closes it first)")
@click.option("--format", "fmt", type=click.Choice(["text", "hex", "base64"]), default=None,
              help="how payloads are printed: text (escaped; the default), hex or base64")
@click.option("-m", "--msg", is_flag=True, help="print each payload as text, escaped (BookKeeper's -msg)")
@click.option("-b", "--bookie", "bookie_id", default=None,
              help="read only from this bookie: the entries it should hold, straight from it (BookKeeper's -b)")
@json_option
@pass_ctx
@handle_errors
def readledger(sc: ShellContext, ledger_id: int, first: int, last: int, password: str, recovery: bool,
               fmt: str | None, msg: bool, bookie_id: str | None, as_json: bool) -> None:
    """Read entries of a ledger. Payloads are printed as data: as text with every control
    character and non-UTF-8 byte escaped (``\\x1b``, ``\\n``, ``\\xff``), or as hex or base64."""

    if msg and fmt not in (None, "text"):
        raise click.UsageError(f"-msg prints payloads as text: it does not go with --format {fmt}")

    async def go(client: Any) -> list[dict[str, Any]]:
        rh = await client.open_ledger(ledger_id, password.encode(), recovery=recovery)
        # Past the end stops at the last entry, as BookKeeper's readledger does.
        end = rh.last_add_confirmed if last < 0 else min(last, rh.last_add_confirmed)
        if bookie_id is not None:
            return await read_from_bookie(client, rh, bookie_id, first, end)
        return [{"entry_id": e.entry_id, "status": "ok", "entry": e}
                for e in (await rh.read(first, end) if end >= first else [])]

    found = sc.with_client(go)

    def show(p: bytes) -> str:
        if fmt == "hex":
            return p.hex()
        if fmt == "base64":
            return base64.b64encode(p).decode()
        return payload_text(p)

    rows = [{"entry_id": f["entry_id"], "lac": f["entry"].last_add_confirmed, "size": len(f["entry"].payload),
             "payload": show(f["entry"].payload)} if f["entry"] is not None else
            {"entry_id": f["entry_id"], "lac": None, "size": None, "payload": None} for f in found]
    if bookie_id is None:
        emit(rows, as_json, ["entry_id", "size", "payload"], title=f"ledger {ledger_id}: {len(rows)} entries")
        return
    for r, f in zip(rows, found, strict=True):
        r["status"] = f["status"]
    bad = sum(f["status"] != "ok" for f in found)
    if not as_json:  # an entry the bookie lacks has no size or payload: blank cells, not "None"
        rows = [{k: "" if v is None else v for k, v in r.items()} for r in rows]
    emit(rows, as_json, ["entry_id", "status", "size", "payload"],
         title=f"ledger {ledger_id} on {bookie_id}: {len(rows)} entries it should hold, {bad} missing or damaged")


@click.command()
@click.option("-l", "--ledgerid", "ledger_id", type=int, required=True)
@click.option("-f", "--force", is_flag=True, help="do not ask for confirmation")
@json_option
@pass_ctx
@handle_errors
def deleteledger(sc: ShellContext, ledger_id: int, force: bool, as_json: bool) -> None:
    """Delete a ledger."""
    if not force and not click.confirm(f"delete ledger {ledger_id}?", default=False):
        raise click.Abort()
    sc.with_client(lambda c: c.delete_ledger(ledger_id))
    if as_json:
        emit({"ledger_id": ledger_id, "deleted": True}, True)
    else:
        console.print(f"deleted ledger {ledger_id}")
