"""``shell updatebookieinledger`` and ``shell updateledgers``: rewrite a bookie id in ledger
metadata, as BookKeeper's shell does after a bookie's address changed with its data kept.

Both refuse, as BookKeeper does, while the source id is registered (the bookie still runs under
it) and when the destination is not a registered bookie. Each ledger is rewritten by
compare-and-set through the ledger manager, so a concurrent change (an ensemble change, a close)
is re-read and redone, never overwritten, and the manager refuses an ensemble naming a bookie twice.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import click

from ledgerstore.cli.common import emit, err_console, handle_errors
from ledgerstore.cli.shell_local import bookie_id_of, json_option
from ledgerstore.config import load_bookie_config
from ledgerstore.errors import BadVersionError, ConfigError, LedgerStoreError, NoSuchLedgerError

#: tries per ledger when its metadata keeps changing under the rewrite
CAS_TRIES = 5


async def _check_ids(client: Any, src: str, dest: str, tool: str) -> None:
    if src == dest:
        raise LedgerStoreError(f"{tool} refused: source and destination are the same bookie {src}")
    registered = {b.bookie_id for b in await client.list_bookies(None)}
    if src in registered:
        raise LedgerStoreError(f"{tool} refused: {src} is registered (running); stop it first")
    if dest not in registered:
        raise LedgerStoreError(f"{tool} refused: {dest} is not a registered bookie; start it under that id first")


async def _rewrite_one(client: Any, ledger_id: int, src: str, dest: str) -> bool:
    """Replace ``src`` by ``dest`` in one ledger's ensembles by CAS; False if it does not name ``src``."""

    for _ in range(CAS_TRIES):
        try:
            md = await client.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            return False  # deleted meanwhile
        if src not in md.bookies():
            return False
        md.ensembles = [(first, [dest if b == src else b for b in ens]) for first, ens in md.ensembles]
        try:
            await client.ledgers.write(md)
        except BadVersionError:
            continue
        return True
    raise LedgerStoreError(f"ledger {ledger_id}: its metadata kept changing; run the command again")


T = TypeVar("T")


class ClientRunner(Protocol):
    """What these commands use of the shell's context object."""

    def with_client(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``fn(client)`` with a connected client and return its result."""
        ...


def rewrite_bookie_id(ctx_obj: ClientRunner, src: str, dest: str, tool: str, per_second: float, limit: int,
                      print_every: float, quiet: bool) -> list[int]:
    """Rewrite ``src`` to ``dest`` in every ledger naming it (at most ``limit``, -1: all), at most
    ``per_second`` ledgers a second (0: no limit), telling progress every ``print_every`` seconds."""

    async def go(client: Any) -> list[int]:
        await _check_ids(client, src, dest, tool)
        updated: list[int] = []
        t0 = last_print = time.monotonic()
        for lid in await client.list_ledgers():
            if 0 <= limit <= len(updated):
                break
            if per_second > 0:  # BookKeeper's -updatespersec: pace the metadata writes
                await asyncio.sleep(max(0.0, t0 + len(updated) / per_second - time.monotonic()))
            if await _rewrite_one(client, lid, src, dest):
                updated.append(lid)
            if not quiet and print_every > 0 and time.monotonic() - last_print >= print_every:
                last_print = time.monotonic()
                err_console.print(f"{tool}: {len(updated)} ledgers updated so far")
        return updated

    return ctx_obj.with_client(go)


def _update_options(fn: Any) -> Any:
    """BookKeeper's pacing flags, and -f / --json."""
    fn = json_option(fn)
    fn = click.option("-f", "--force", is_flag=True, help="do not ask for confirmation")(fn)
    fn = click.option("-v", "--verbose", is_flag=True, help="print progress (every -printprogress seconds)")(fn)
    fn = click.option("-p", "--printprogress", "print_every", type=float, default=10.0, show_default=True,
                      help="with -v: print progress every this many seconds")(fn)
    fn = click.option("-l", "--limit", type=int, default=-1, show_default=True,
                      help="update at most this many ledgers (-1: all)")(fn)
    fn = click.option("-s", "--updatespersec", "per_second", type=click.FloatRange(min=0), default=5.0,
                      show_default=True, help="ledgers updated per second (0: no limit)")(fn)
    return fn


def _confirm_and_rewrite(sc: Any, src: str, dest: str, tool: str, per_second: float, limit: int, print_every: float,
                         force: bool, as_json: bool) -> None:
    if not force and not click.confirm(f"replace {src} by {dest} in the ledgers' ensembles?", default=False):
        raise click.Abort()
    updated = rewrite_bookie_id(sc, src, dest, tool, per_second, limit, print_every, as_json)
    emit({"src": src, "dest": dest, "updated_ledgers": updated}, as_json,
         title=f"{src} replaced by {dest} in {len(updated)} ledgers")


@click.command("updatebookieinledger")
@click.option("-sb", "--srcBookie", "src", required=True, help="the bookie id to replace (a stopped bookie)")
@click.option("-db", "--destBookie", "dest", required=True, help="the registered bookie id to put in its place")
@_update_options
@click.pass_obj
@handle_errors
def updatebookieinledger(sc: Any, src: str, dest: str, per_second: float, limit: int, print_every: float,
                         verbose: bool, force: bool, as_json: bool) -> None:
    """Replace a bookie id by another in every ledger's ensembles (after a bookie's address changed,
    with its data moved as is). Refused while the source is registered (running) and when the
    destination is not a registered bookie."""
    _confirm_and_rewrite(sc, src, dest, "updatebookieinledger", per_second, limit, print_every if verbose else 0,
                         force, as_json)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _other_form(bookie_id: str, want: str) -> str:
    """The id the bookie had before its config switched to the ``want`` form (``hostname``: the
    id is host-name based now and was IP based; ``ip``: the reverse)."""

    host, _, port = bookie_id.rpartition(":")
    if (want == "ip") != _is_ip(host):
        # BookKeeper's check: the option must say what the config now uses (useHostNameAsBookieID).
        raise ConfigError(f"-bookieid {want} expects the bookie's config to give an {'IP address' if want == 'ip' else 'host name'}"
                          f", but its id is {bookie_id}")
    try:
        old = socket.gethostbyname(host) if want == "hostname" else socket.gethostbyaddr(host)[0]
    except OSError as exc:
        raise ConfigError(f"cannot resolve {host} to its {'address' if want == 'hostname' else 'host name'}: {exc}") from None
    return f"{old}:{port}"


@click.command("updateledgers")
@click.option("--config", "bookie_config", type=click.Path(dir_okay=False, exists=True), required=True,
              help="the bookie's TOML config: its id now")
@click.option("-b", "--bookieid", "form", type=click.Choice(["hostname", "ip"]), required=True,
              help="the form the bookie's id now has; ledgers naming the other form are updated")
@_update_options
@click.pass_obj
@handle_errors
def updateledgers(sc: Any, bookie_config: str, form: str, per_second: float, limit: int, print_every: float,
                  verbose: bool, force: bool, as_json: bool) -> None:
    """After a bookie's id switched between its IP address and its host name (and it was restarted
    under the new id): rewrite the old id to the new one in every ledger's ensembles."""

    cfg = load_bookie_config(bookie_config)
    dest = bookie_id_of(cfg)
    src = _other_form(dest, form)
    if sc.metadata is None and sc.config is None:
        sc.metadata = cfg.metadata
    _confirm_and_rewrite(sc, src, dest, "updateledgers", per_second, limit, print_every if verbose else 0,
                         force, as_json)
