"""``shell`` tools run against a bookie's own directories, normally while it is stopped:
``localconsistencycheck``, ``lastmark``, ``listfilesondisc``, ``readjournal``, ``bookieformat``,
``initbookie`` and ``gc``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.progress import Progress

from ledgerstore.bookie.dirlock import LOCK_FILE
from ledgerstore.bookie.files import OS_FILES
from ledgerstore.bookie.http_auth import bearer_headers
from ledgerstore.bookie.journal import ADD, FENCE, MASTER_KEY, journal_files, read_mark, scan_file
from ledgerstore.bookie.limbo import Limbo
from ledgerstore.cli.common import console, emit, handle_errors, run_async
from ledgerstore.cli.shell_http import admin_request
from ledgerstore.cli.shell_local import (
    bookie_id_of,
    config_option,
    json_option,
    lock_bookie_dirs,
    with_bookie_store,
)
from ledgerstore.config import load_bookie_config
from ledgerstore.errors import BookieIOError, LedgerStoreError, NoSuchEntryError
from ledgerstore.meta.bookies import CookieManager
from ledgerstore.meta.ledgers import LedgerManager
from ledgerstore.plugins import build, create_metadata_store
from ledgerstore.proto.digest import parse_entry_header

T = TypeVar("T")


def _open_local(config_path: str, tool: str) -> tuple[Any, Any, Any]:
    """The bookie's config, its storage engine (opened) and the lock held on its directories."""

    cfg = load_bookie_config(config_path)
    lock = lock_bookie_dirs(cfg, tool)
    try:
        engine = build("storage", cfg.storage, [Path(d) for d in cfg.ledger_dirs], options=cfg.storage_options)
        engine.open()
    except BaseException:
        lock.release()
        raise
    return cfg, engine, lock


@click.command()
@config_option
@json_option
@handle_errors
def localconsistencycheck(bookie_config: str, as_json: bool) -> None:
    """Check that every entry the storage engine indexes is readable and checksum-valid."""

    _, engine, lock = _open_local(bookie_config, "localconsistencycheck")
    problems: list[str] = []
    checked = 0
    try:
        ledgers = list(engine.list_ledgers())
        with Progress(console=console, transient=True, disable=as_json) as progress:
            task = progress.add_task("checking ledgers", total=len(ledgers))
            for lid in ledgers:
                last = engine.last_entry_id(lid)
                for eid in range(last + 1):
                    try:
                        data = engine.get_entry(lid, eid)
                    except NoSuchEntryError:
                        continue  # striping: this bookie holds only its write sets' entries
                    except (BookieIOError, OSError) as exc:
                        problems.append(f"ledger {lid} entry {eid}: {exc}")
                        continue
                    checked += 1
                    try:
                        hl, he, _ = parse_entry_header(data)
                    except LedgerStoreError as exc:
                        problems.append(f"ledger {lid} entry {eid}: {exc}")
                        continue
                    if (hl, he) != (lid, eid):
                        problems.append(f"ledger {lid} entry {eid}: stored entry says ledger {hl} entry {he}")
                progress.advance(task)
    finally:
        engine.close()
        lock.release()
    result = {"ledgers": len(ledgers), "entries_checked": checked, "problems": problems, "ok": not problems}
    if as_json:
        emit(result, True)
    else:
        console.print(f"{'[green]consistent[/green]' if not problems else '[red]INCONSISTENT[/red]'}: "
                      f"{checked} entries in {len(ledgers)} ledgers checked, {len(problems)} problems")
        for p in problems[:50]:
            console.print(f"  {p}")
    if problems:
        raise SystemExit(1)


@click.command()
@config_option
@json_option
@handle_errors
def lastmark(bookie_config: str, as_json: bool) -> None:
    """Print the journal's LastLogMark (up to where the storage engine holds everything)."""

    cfg = load_bookie_config(bookie_config)
    mark = read_mark(Path(cfg.journal_dir))
    emit({"journal_file_id": mark.file_id, "offset": mark.offset}, as_json, title="LastLogMark")


@click.command()
@config_option
@json_option
@handle_errors
def limbo(bookie_config: str, as_json: bool) -> None:
    """Print the bookie's ledgers in limbo (it lost data it may have held of them) that it has
    not repaired yet; none once its repair is done. Reads the journal directory's limbo file,
    so it works whether the bookie runs or not."""

    cfg = load_bookie_config(bookie_config)
    found = Limbo(set())
    found.open(Path(cfg.journal_dir), OS_FILES)
    emit({"ledgers_in_limbo": len(found), "listing_pending": found.pending, "ledgers": sorted(found.ledgers),
          "fenced": sorted(found.fenced)}, as_json, title="Limbo")


@click.command()
@config_option
@click.option("-txn", "--journal", "journal", is_flag=True, help="the journal files")
@click.option("-log", "--entrylog", "entrylog", is_flag=True, help="the entry log files (*.log in the ledger directories)")
@click.option("-idx", "--index", "index", is_flag=True, help="the other ledger-storage files (indexes, RocksDB files)")
@json_option
@handle_errors
def listfilesondisc(bookie_config: str, journal: bool, entrylog: bool, index: bool, as_json: bool) -> None:
    """List the journal and ledger-storage files of a bookie (all of them, or the kinds asked for)."""

    cfg = load_bookie_config(bookie_config)
    wanted = {k for k, on in (("journal", journal), ("entrylog", entrylog), ("index", index)) if on} or {
        "journal", "entrylog", "index"}
    rows = []
    for kind, root in [("journal", cfg.journal_dir), *(("ledgers", d) for d in cfg.ledger_dirs)]:
        for p in sorted(Path(root).rglob("*")):
            if not p.is_file() or p.name == LOCK_FILE:
                continue
            what = "journal" if kind == "journal" else "entrylog" if p.suffix == ".log" else "index"
            if what in wanted:
                rows.append({"kind": kind, "type": what, "path": str(p), "bytes": p.stat().st_size})
    emit(rows, as_json, ["kind", "type", "path", "bytes"], title=f"{len(rows)} files")


@click.command()
@config_option
@click.option("--limit", default=0, help="print at most this many records (0: all)")
@json_option
@handle_errors
def readjournal(bookie_config: str, limit: int, as_json: bool) -> None:
    """Print the records of every journal file (type, ledger, entry, size, position)."""

    cfg = load_bookie_config(bookie_config)
    names = {ADD: "ADD", FENCE: "FENCE", MASTER_KEY: "MASTER_KEY"}
    rows = []
    for _, path in journal_files(Path(cfg.journal_dir)):
        for rec in scan_file(path):
            rows.append({"file": path.name, "type": names.get(rec.type, str(rec.type)), "ledger_id": rec.ledger_id,
                         "entry_id": rec.entry_id, "bytes": len(rec.data), "end_offset": rec.mark.offset})
            if limit and len(rows) >= limit:
                break
        if limit and len(rows) >= limit:
            break
    emit(rows, as_json, ["file", "type", "ledger_id", "entry_id", "bytes", "end_offset"], title=f"{len(rows)} journal records")


@click.command()
@config_option
@click.option("-n", "--nonInteractive", "non_interactive", is_flag=True,
              help="never ask: refuse if the directories hold data (unless -f)")
@click.option("-f", "--force", is_flag=True, help="erase existing data without asking")
@click.option("-d", "--delete-cookie", "--deleteCookie", "delete_cookie", is_flag=True,
              help="also delete the bookie's cookie from the cluster metadata")
@json_option
@handle_errors
def bookieformat(bookie_config: str, non_interactive: bool, force: bool, delete_cookie: bool, as_json: bool) -> None:
    """Erase a (stopped) bookie's journal and ledger directories so it can join afresh. Asks first
    when they hold data (``-n``: refuses instead, ``-f``: erases without asking). Refused, naming its
    PID, while the bookie (or another tool) holds them."""

    cfg = load_bookie_config(bookie_config)
    dirs = [Path(cfg.journal_dir), *(Path(d) for d in cfg.ledger_dirs)]
    lock = lock_bookie_dirs(cfg, "bookieformat")
    try:
        has_data = any(p.name != LOCK_FILE for d in dirs if d.exists() for p in d.iterdir())
        if has_data and not force:
            if non_interactive:
                raise LedgerStoreError(f"bookieformat refused: {', '.join(map(str, dirs))} hold data; pass -f to erase it")
            if not click.confirm(f"erase {', '.join(map(str, dirs))}?", default=False):
                raise click.Abort()
        for d in dirs:  # everything but the lock file we hold
            for p in list(d.iterdir()) if d.exists() else []:
                if p.name == LOCK_FILE:
                    continue
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
            d.mkdir(parents=True, exist_ok=True)
    finally:
        lock.release()
    if delete_cookie:
        with_bookie_store(cfg, lambda store: CookieManager(store).delete(bookie_id_of(cfg)))
    emit({"formatted": [str(d) for d in dirs], "cookie_deleted": delete_cookie}, as_json, title="bookieformat")


@click.command()
@config_option
@json_option
@handle_errors
def initbookie(bookie_config: str, as_json: bool) -> None:
    """Prepare a new bookie: check its journal and ledger directories are empty and no cookie is
    registered under its id, then create the directories (the bookie writes its cookie when it first
    starts). Refused, naming its PID, while a bookie or another tool holds the directories."""

    cfg = load_bookie_config(bookie_config)
    dirs = [Path(cfg.journal_dir), *(Path(d) for d in cfg.ledger_dirs)]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    lock = lock_bookie_dirs(cfg, "initbookie")
    try:
        used = [str(p) for d in dirs for p in d.iterdir() if p.name != LOCK_FILE]
        if used:
            raise LedgerStoreError(f"initbookie refused: not empty: {', '.join(used[:5])}; bookieformat it first")
        bookie_id = bookie_id_of(cfg)
        if with_bookie_store(cfg, lambda store: CookieManager(store).get(bookie_id)) is not None:
            raise LedgerStoreError(f"initbookie refused: a cookie is registered for {bookie_id}; "
                                   "bookieformat --delete-cookie (or decommission the old bookie) first")
    finally:
        lock.release()
    emit({"bookie_id": bookie_id, "initialised": [str(d) for d in dirs]}, as_json, title="initbookie")


@click.command("gc")
@click.option("--config", "bookie_config", type=click.Path(dir_okay=False, exists=True),
              help="a STOPPED bookie's config: collect offline")
@click.option("--http", "http_address", help="a RUNNING bookie's admin HTTP address host:port: ask it to collect")
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True), envvar="LEDGERSTORE_ADMIN_TOKEN_FILE",
              help="with --http: file holding the bookie's admin bearer token ([bookie.http] token_file)")
@click.option("--major", is_flag=True, help="also run major compaction")
@json_option
@handle_errors
def gc_command(bookie_config: str | None, http_address: str | None, token_file: str | None, major: bool,
               as_json: bool) -> None:
    """Garbage-collect deleted ledgers now and report what was reclaimed."""
    if http_address:
        result = admin_request(http_address, "PUT", f"/api/v1/bookie/gc?{'major=true' if major else 'minor=true'}",
                               bearer_headers(token_file), timeout=600)
    elif bookie_config:
        cfg, engine, lock = _open_local(bookie_config, "gc")
        try:
            async def orphans() -> list[int]:
                store = create_metadata_store(cfg.metadata, **cfg.metadata_options)
                await store.start()
                try:
                    mgr = LedgerManager(store)
                    known = {lid async for lid in mgr.list()}
                finally:
                    await store.close()
                return [lid for lid in engine.list_ledgers() if lid not in known]

            before = engine.stats().bytes_on_disk
            deleted = run_async(orphans())
            for lid in deleted:
                engine.delete_ledger(lid)
            engine.flush()
            after = engine.gc()
            compact = getattr(engine, "compact", None)
            if compact is not None:
                after = compact(cfg.major_compaction_threshold if major else cfg.minor_compaction_threshold)
            result = {"deleted_ledgers": deleted, "bytes_on_disk_before": before,
                      "bytes_on_disk_after": after.bytes_on_disk,
                      "reclaimed_bytes": max(0, before - after.bytes_on_disk)}
        finally:
            engine.close()
            lock.release()
    else:
        raise click.UsageError("give --http HOST:PORT of a running bookie or --config of a stopped one")
    if as_json:
        emit(result, True)
    else:
        console.print(f"gc: {len(result['deleted_ledgers'])} ledgers deleted, "
                      f"{result['reclaimed_bytes']:,} bytes reclaimed ({result['bytes_on_disk_before']:,} -> "
                      f"{result['bytes_on_disk_after']:,})")
