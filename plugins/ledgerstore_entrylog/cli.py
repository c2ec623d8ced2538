"""``ledgerstore shell readlog``: contributed by the entrylog plugin through the
``ledgerstore_shell_commands`` hook (core knows nothing of entry-log files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import ledgerstore
from ledgerstore.api import OS_STORAGE_FILES
from ledgerstore_entrylog.entrylog import LogScanner
from ledgerstore_entrylog.format import LOG_HEADER_SIZE, decode_log_header, log_file_name, parse_log_file_name


def _find_log(ledger_dirs: list[str], log: str) -> Path:
    p = Path(log)
    if p.exists():
        return p
    try:
        log_id = int(log, 16)  # ids are hex, as in the file names
    except ValueError:
        raise click.BadParameter(f"{log!r} is neither a file nor an entry log id") from None
    for d in ledger_dirs:
        for candidate in Path(d).rglob(log_file_name(log_id)):
            return candidate
    raise click.BadParameter(f"no entry log {log_file_name(log_id)} under {', '.join(ledger_dirs)}")


@click.command()
@click.option("--config", "bookie_config", type=click.Path(dir_okay=False, exists=True),
              help="the bookie's TOML config (to find the log by id)")
@click.option("-l", "--ledgerid", "ledger_id", type=int, default=None, help="only this ledger's records")
@click.option("--limit", default=0, help="print at most this many records (0: all)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.argument("log")
def readlog(bookie_config: str | None, ledger_id: int | None, limit: int, as_json: bool, log: str) -> None:
    """Print the records of an entry log (LOG: a path, or an entry log id in hex)."""
    dirs: list[str] = []
    if bookie_config:
        from ledgerstore.config import load_bookie_config

        dirs = load_bookie_config(bookie_config).ledger_dirs
    path = _find_log(dirs, log)
    f = OS_STORAGE_FILES.open(path, write=False)
    try:
        size = f.size()
        log_id = decode_log_header(f.pread(LOG_HEADER_SIZE, 0), path)
        scanner = LogScanner(f, size, path)
        rows: list[dict[str, Any]] = []
        for rec in scanner:
            if ledger_id is not None and rec.ledger_id != ledger_id:
                continue
            rows.append({"offset": rec.offset, "ledger_id": rec.ledger_id, "entry_id": rec.entry_id,
                         "bytes": len(rec.data)})
            if limit and len(rows) >= limit:
                break
    finally:
        f.close()
    summary = {"log": str(path), "log_id": log_id, "records": rows, "clean": scanner.clean, "error": scanner.error}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"entry log {path} (id {log_id:x}, {parse_log_file_name(path.name)}): {len(rows)} records"
                   + ("" if scanner.clean else f"; DAMAGED: {scanner.error}"))
        for r in rows:
            click.echo(f"  offset {r['offset']:>10}  ledger {r['ledger_id']:>8}  entry {r['entry_id']:>8}  {r['bytes']} bytes")
    if not scanner.clean:
        raise SystemExit(1)


@ledgerstore.hookimpl
def ledgerstore_shell_commands() -> list[Any]:
    return [readlog]
