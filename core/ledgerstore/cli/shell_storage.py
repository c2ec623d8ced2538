"""Offline readers of a bookie's ledger storage, as BookKeeper's shell has them: ``readlogmetadata``
and ``activeledgers`` (entry logs of the ``entrylog`` engine) and ``ledger`` (one ledger's index,
``entrylog`` or ``rocksdb``).

The formats are the plugins' (``ledgerstore_entrylog.format``, ``ledgerstore_rocksdb.format``);
this module only reads them, through the plugins' own decoders, imported when a command needs them.

When they may run:

* ``readlogmetadata`` and ``activeledgers -logId`` read one entry log and its ledger map. A finished
  log and its map are never rewritten (compaction writes new logs and deletes old ones), and a log
  still being written is scanned up to its current end, where a record cut short reads as a torn
  tail. So they read without the directory lock, also while the bookie runs.
* ``ledger`` reads a ledger's index. While the bookie runs, the entrylog engine keeps index pages in
  its ledger cache, written to the file only at checkpoints, and RocksDB holds its database's LOCK.
  So ``ledger`` takes the bookie's directory lock and is refused, naming the PID, while it runs.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from ledgerstore.api.files import OsStorageFile, OsStorageFiles
from ledgerstore.cli.common import emit, handle_errors
from ledgerstore.cli.shell_local import (
    bookie_id_of,
    config_option,
    json_option,
    lock_bookie_dirs,
    with_bookie_store,
)
from ledgerstore.config import load_bookie_config
from ledgerstore.errors import ConfigError, NoSuchLedgerError
from ledgerstore.meta.ledgers import LedgerManager


def _optional(module: str, what: str) -> ModuleType:
    package = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith(package):
            raise
        raise ConfigError(f"{what} ({package}) is not installed here") from None


def _plugin_module(engine: str, name: str) -> ModuleType:
    return _optional(f"ledgerstore_{engine}.{name}", f"the {engine} storage plugin")


def _load(bookie_config: str) -> Any:
    return load_bookie_config(bookie_config)


def _need_entrylog(cfg: Any, tool: str) -> None:
    if cfg.storage != "entrylog":
        raise ConfigError(f"{tool} reads entry logs of the entrylog engine; this bookie uses storage = {cfg.storage!r}")


def _parse_log_id(text: str) -> int:
    try:
        return int(text, 0)  # decimal as BookKeeper's -logId, or 0x.. as in the file names
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a log id (decimal, or hex with 0x)", param_hint="-logId") from None


def _find_log(cfg: Any, log_id: str | None, log_file: str | None) -> Path:
    fmt = _plugin_module("entrylog", "format")
    if log_file:
        return Path(log_file)
    if log_id is None:
        raise click.UsageError("give -logId ID or -logFilename FILE")
    name: str = fmt.log_file_name(_parse_log_id(log_id))  # the plugin module is found at run time
    for d in cfg.ledger_dirs:
        path = Path(d) / "current" / name
        if path.exists():
            return path
    raise NoSuchLedgerError(f"no entry log {name} under {', '.join(cfg.ledger_dirs)}")


def read_log_metadata(path: Path) -> dict[str, Any]:
    """Which ledgers an entry log holds and how many record bytes each: from its ledger map when it
    has a good one, else by scanning the log (a log still being written, or one left by a crash)."""
    fmt = _plugin_module("entrylog", "format")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        log_id = fmt.decode_log_header(os.pread(fd, fmt.LOG_HEADER_SIZE, 0), path)
        map_path = path.with_suffix(".lmap")
        decoded = fmt.decode_ledger_map(map_path.read_bytes(), log_id) if map_path.exists() else None
        if decoded is not None:
            total, ledgers = decoded
            source, problem = "ledger map", ""
        else:
            log_file = OsStorageFile(os.dup(fd))
            try:
                scanner = _plugin_module("entrylog", "entrylog").LogScanner(log_file, size, path)
                ledgers, total = {}, 0
                for rec in scanner:
                    ledgers[rec.ledger_id] = ledgers.get(rec.ledger_id, 0) + rec.record_size
                    total += rec.record_size
                source, problem = "scan", scanner.error
            finally:
                log_file.close()
    finally:
        os.close(fd)
    return {"log": str(path), "log_id": log_id, "source": source, "total_size": total, "ledgers": ledgers,
            "damaged": problem}


def _indexed_here(cfg: Any, ledger_id: int) -> bool:
    fmt = _plugin_module("entrylog", "format")
    return any(fmt.index_path(Path(d) / "current", ledger_id).exists() for d in cfg.ledger_dirs)


_log_options = [
    click.option("-l", "--logId", "log_id", default=None, help="entry log id (decimal, or 0x.. hex as in file names)"),
    click.option("-f", "--logFilename", "log_file", type=click.Path(dir_okay=False, exists=True), default=None,
                 help="an entry log file"),
]


def _with_log_options(fn: Any) -> Any:
    for opt in reversed(_log_options):
        fn = opt(fn)
    return fn


@click.command("readlogmetadata")
@config_option
@_with_log_options
@json_option
@handle_errors
def readlogmetadata(bookie_config: str, log_id: str | None, log_file: str | None, as_json: bool) -> None:
    """An entry log's metadata: the ledgers in it with their sizes, its total size and the size
    still held by ledgers this bookie indexes (the rest is garbage for GC). Reads while the bookie
    runs too: finished logs are never rewritten."""
    cfg = _load(bookie_config)
    _need_entrylog(cfg, "readlogmetadata")
    md = read_log_metadata(_find_log(cfg, log_id, log_file))
    rows = [{"ledger_id": lid, "size": n, "indexed": _indexed_here(cfg, lid)} for lid, n in sorted(md["ledgers"].items())]
    remaining = sum(r["size"] for r in rows if r["indexed"])
    result = {k: v for k, v in md.items() if k != "ledgers"} | {"remaining_size": remaining, "ledgers": rows}
    if as_json:
        emit(result, True)
        return
    emit(rows, False, ["ledger_id", "size", "indexed"],
         title=f"entry log {md['log_id']} (0x{md['log_id']:x}, {md['log']}, from its {md['source']}): "
               f"{len(rows)} ledgers, total size {md['total_size']}, remaining size {remaining}"
               + (f"; DAMAGED: {md['damaged']}" if md["damaged"] else ""))


@click.command("activeledgers")
@click.option("--config", "bookie_config", type=click.Path(dir_okay=False, exists=True), default=None,
              help="the bookie's TOML config (with -logId: where its entry logs are)")
@_with_log_options
@click.option("-b", "--bookieid", "bookie_id", default=None, help="ledgers whose ensembles name this bookie")
@json_option
@click.pass_obj
@handle_errors
def activeledgers(sc: Any, bookie_config: str | None, log_id: str | None, log_file: str | None, bookie_id: str | None,
                  as_json: bool) -> None:
    """Active ledgers (present in the cluster metadata) in one entry log (``-logId``, with the
    bookie's --config), or on one bookie (``-bookieid``; default: the --config bookie's id)."""

    cfg = _load(bookie_config) if bookie_config else None
    if cfg is not None and sc.metadata is None and sc.config is None:
        sc.metadata = cfg.metadata
    if log_id is not None or log_file is not None:
        if cfg is None:
            raise click.UsageError("-logId needs --config bookie.toml (where the entry logs are)")
        _need_entrylog(cfg, "activeledgers")
        in_log = read_log_metadata(_find_log(cfg, log_id, log_file))["ledgers"]

        async def known(store: Any) -> set[int]:
            return {lid async for lid in LedgerManager(store).list()}

        alive = with_bookie_store(cfg, known)
        rows = [{"ledger_id": lid, "size": n} for lid, n in sorted(in_log.items()) if lid in alive]
        emit(rows, as_json, ["ledger_id", "size"], title=f"{len(rows)} active ledgers of {len(in_log)} in the entry log")
        return
    if bookie_id is None:
        if cfg is None:
            raise click.UsageError("give -logId ID (with --config) or -bookieid BOOKIE")
        bookie_id = bookie_id_of(cfg)

    async def on_bookie(client: Any) -> list[int]:
        out = []
        for lid in await client.list_ledgers():
            try:
                md = await client.ledger_metadata(lid)
            except NoSuchLedgerError:
                continue  # deleted meanwhile
            if bookie_id in md.bookies():
                out.append(lid)
        return out

    ids = sc.with_client(on_bookie)
    emit([{"ledger_id": lid} for lid in ids], as_json, ["ledger_id"], title=f"{len(ids)} active ledgers on {bookie_id}")


def _entrylog_index(cfg: Any, ledger_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    fmt = _plugin_module("entrylog", "format")
    index = _plugin_module("entrylog", "index")
    path = next((p for d in cfg.ledger_dirs if (p := fmt.index_path(Path(d) / "current", ledger_id)).exists()), None)
    if path is None:
        raise NoSuchLedgerError(f"ledger {ledger_id} has no index file on this bookie ({', '.join(cfg.ledger_dirs)})")
    files = OsStorageFiles()
    header, size = index.read_header(files, path)
    rows: list[dict[str, Any]] = []
    logs: dict[int, int] = {}
    try:
        n_pages = (size - fmt.INDEX_HEADER_SIZE + header.page_size - 1) // header.page_size
        slots = header.page_size // 8
        for page_no in range(max(n_pages, 0)):
            for i, slot in enumerate(index.read_page(files, path, page_no, header.page_size)):
                if not slot:
                    continue
                location = slot - 1
                log_id, offset = location >> 32, location & 0xFFFFFFFF
                rows.append({"entry_id": page_no * slots + i, "log_id": log_id, "offset": offset,
                             "size": _record_size(cfg, fmt, logs, log_id, offset)})
    finally:
        for fd in logs.values():
            if fd >= 0:
                os.close(fd)
    meta = {"ledger_id": ledger_id, "engine": "entrylog", "index_file": str(path), "fenced": header.fenced,
            "has_master_key": header.master_key is not None, "entries": len(rows)}
    return meta, rows


def _record_size(cfg: Any, fmt: ModuleType, logs: dict[int, int], log_id: int, offset: int) -> int | None:
    """The data length in the record header at ``offset`` of log ``log_id`` (None: log gone)."""
    if log_id not in logs:
        paths = [Path(d) / "current" / fmt.log_file_name(log_id) for d in cfg.ledger_dirs]
        path = next((p for p in paths if p.exists()), None)
        logs[log_id] = os.open(path, os.O_RDONLY) if path is not None else -1
    if logs[log_id] < 0:
        return None
    head = os.pread(logs[log_id], fmt.RECORD_HEADER_SIZE, offset)
    return int(fmt.RECORD_HEADER.unpack(head)[0]) if len(head) == fmt.RECORD_HEADER_SIZE else None


def _rocksdb_index(cfg: Any, ledger_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    fmt = _plugin_module("rocksdb", "format")
    rocksdict = _optional("rocksdict", "the rocksdb storage plugin's RocksDB binding")

    path = Path(cfg.ledger_dirs[0]) / "rocksdb"
    if not path.is_dir():
        raise NoSuchLedgerError(f"no rocksdb storage at {path}")
    db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only())
    try:
        state_key = fmt.ledger_key(fmt.STATE_PREFIX, ledger_id)
        raw_state = db.get(state_key)
        if raw_state is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored on this bookie ({path})")
        state = fmt.decode_state(state_key, raw_state)
        begin, end = fmt.entry_range(ledger_id)
        rows = []
        it = db.iter()
        it.seek(begin)
        while it.valid() and it.key() < end:
            _, entry_id = fmt.split_entry_key(it.key())
            rows.append({"entry_id": entry_id, "key": it.key().hex(), "size": len(it.value()) - fmt.HEADER_SIZE})
            it.next()
        del it
    finally:
        db.close()
    meta = {"ledger_id": ledger_id, "engine": "rocksdb", "database": str(path), "fenced": state.fenced,
            "has_master_key": state.master_key is not None, "entries": len(rows)}
    return meta, rows


@click.command("ledger")
@config_option
@click.argument("ledger_id", type=int)
@click.option("-m", "--meta", is_flag=True, help="print only the ledger's stored state (fenced, master key)")
@json_option
@handle_errors
def ledger_index(bookie_config: str, ledger_id: int, meta: bool, as_json: bool) -> None:
    """Dump one ledger's index on a stopped bookie: each entry's location (entrylog: log id and
    offset; rocksdb: key) and size. Refused, naming the PID, while the bookie runs."""
    cfg = _load(bookie_config)
    readers = {"entrylog": _entrylog_index, "rocksdb": _rocksdb_index}
    if cfg.storage not in readers:
        raise ConfigError(f"ledger reads the entrylog and rocksdb engines' indexes; this bookie uses {cfg.storage!r}")
    lock = lock_bookie_dirs(cfg, "ledger")
    try:
        info, rows = readers[cfg.storage](cfg, ledger_id)
    finally:
        lock.release()
    if as_json:
        emit(info if meta else info | {"index": rows}, True)
        return
    emit(info, False, title=f"ledger {ledger_id} on {bookie_id_of(cfg)}")
    if not meta:
        cols = ["entry_id", "log_id", "offset", "size"] if cfg.storage == "entrylog" else ["entry_id", "key", "size"]
        emit(rows, False, cols, title=f"{len(rows)} index entries")
