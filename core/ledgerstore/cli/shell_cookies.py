"""``shell updatecookie`` and ``shell generatecookie``: a bookie's cookie, as BookKeeper's shell handles it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ledgerstore.bookie import cookie as cookies
from ledgerstore.bookie.dirlock import LOCK_FILE
from ledgerstore.cli.common import emit, handle_errors
from ledgerstore.cli.shell_local import (
    bookie_id_of,
    config_option,
    json_option,
    lock_bookie_dirs,
    with_bookie_store,
)
from ledgerstore.config import load_bookie_config
from ledgerstore.errors import CookieMismatchError, LedgerStoreError
from ledgerstore.meta.bookies import ClusterManager, CookieManager


def _expected_cookie(cfg: Any, instance_id: str | None) -> dict[str, Any]:
    # The fields a bookie checks at start-up (bookie/cookie_validation.py).
    return {"bookie_id": bookie_id_of(cfg), "instance_id": instance_id,
            "journal_dir": str(Path(cfg.journal_dir).resolve()),
            "ledger_dirs": [str(Path(d).resolve()) for d in cfg.ledger_dirs], "layout": 1}


@click.command()
@config_option
@click.option("-e", "--expandstorage", is_flag=True,
              help="the config lists new, empty ledger directories: write the cookie naming them all")
@click.option("--list", "list_", is_flag=True, help="print the local and the registered cookie")
@json_option
@handle_errors
def updatecookie(bookie_config: str, expandstorage: bool, list_: bool, as_json: bool) -> None:
    """Show a (stopped) bookie's cookie, or with ``-e`` rewrite it after ledger directories were
    added: in every directory and in the cluster. Refused while the bookie runs (directory lock)."""

    if expandstorage == list_:
        raise click.UsageError("give one of -e/--expandstorage or --list")
    cfg = load_bookie_config(bookie_config)
    bookie_id = bookie_id_of(cfg)
    dirs = cookies.cookie_dirs(Path(cfg.journal_dir), [Path(d) for d in cfg.ledger_dirs])
    remote = with_bookie_store(cfg, lambda store: CookieManager(store).get(bookie_id))
    if list_:
        local = [d for d in dirs if (d / cookies.COOKIE_FILE).exists()]
        found = json.loads((local[0] / cookies.COOKIE_FILE).read_text()) if local else None
        emit({"bookie_id": bookie_id, "local": found, "registered": remote}, as_json, title="cookie")
        return
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    lock = lock_bookie_dirs(cfg, "updatecookie")
    try:
        have = [d for d in dirs if (d / cookies.COOKIE_FILE).exists()]
        if not have or remote is None:
            raise LedgerStoreError(f"updatecookie refused: bookie {bookie_id} has no cookie yet; start it once first")
        old = json.loads((have[0] / cookies.COOKIE_FILE).read_text())
        if any(json.loads((d / cookies.COOKIE_FILE).read_text()) != old for d in have):
            raise CookieMismatchError(f"updatecookie refused: the cookies in {', '.join(map(str, have))} differ")
        added = [d for d in dirs if d not in have]
        missing = [p for p in old.get("ledger_dirs", []) if p not in {str(d.resolve()) for d in dirs}]
        if missing or old.get("journal_dir") != str(Path(cfg.journal_dir).resolve()):
            raise LedgerStoreError(f"updatecookie refused: expansion only adds ledger directories; the config drops "
                                   f"{missing or old.get('journal_dir')}")
        used = [str(p) for d in added for p in d.iterdir() if p.name != LOCK_FILE]
        if used:
            raise LedgerStoreError(f"updatecookie refused: the new directories are not empty: {', '.join(used[:5])}")
        new = {**_expected_cookie(cfg, old.get("instance_id")), cookies.INCARNATION: old.get(cookies.INCARNATION, "")}
        cookies.write_local(dirs, new)
        with_bookie_store(cfg, lambda store: CookieManager(store).put(bookie_id, {**new, "endpoint": remote.get("endpoint", "")}))
    finally:
        lock.release()
    emit({"bookie_id": bookie_id, "added": [str(d) for d in added], "ledger_dirs": new["ledger_dirs"]}, as_json,
         title="updatecookie")


@click.command()
@config_option
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the cookie to this file")
@json_option
@handle_errors
def generatecookie(bookie_config: str, output: str | None, as_json: bool) -> None:
    """The cookie the bookie that the config describes would carry in this cluster (nothing is written
    to the bookie or the cluster)."""

    cfg = load_bookie_config(bookie_config)
    cookie = _expected_cookie(cfg, with_bookie_store(cfg, lambda store: ClusterManager(store).instance_id()))
    if output:
        Path(output).write_text(json.dumps(cookie, sort_keys=True, indent=1))
    emit(cookie, as_json, title="cookie")
