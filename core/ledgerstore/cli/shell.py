"""``ledgerstore shell``: BookKeeper-shell-style administration commands."""

from __future__ import annotations

import base64
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.progress import Progress

from ledgerstore.cli.common import console, emit, handle_errors, payload_text, run_async
from ledgerstore.cli.shell_cluster import clusterinfo, cookie_delete, cookie_get
from ledgerstore.cli.shell_cookies import generatecookie, updatecookie
from ledgerstore.cli.shell_health import HEALTH_CHECK_DISABLED, healthcheck
from ledgerstore.cli.shell_ledgers import updatebookieinledger, updateledgers
from ledgerstore.cli.shell_local import (
    bookie_id_of,
    config_option,
    json_option,
    lock_bookie_dirs,
    with_bookie_store,
)
from ledgerstore.cli.shell_metadata import metadata_copy, metadata_export, metadata_import
from ledgerstore.cli.shell_storage import activeledgers, ledger_index, readlogmetadata
from ledgerstore.recovery.markers import UnderReplicationManager

T = TypeVar("T")


def _is_bookie_config(path: str) -> bool:
    """True for a TOML file with a ``[bookie]`` table and no ``[client]`` one."""
    import tomllib

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the client config loader reports the problem with its own message
    return "bookie" in doc and "client" not in doc


class ShellContext:
    def __init__(self, metadata: str | None, config: str | None) -> None:
        self.metadata = metadata
        self.config = config

    def client_kwargs(self) -> dict[str, Any]:
        from ledgerstore.errors import ConfigError

        if self.config and _is_bookie_config(self.config):
            # As BookKeeper's shell does with bk_server.conf: a bookie's config names the metadata store.
            from ledgerstore.config import load_bookie_config

            return {"metadata": self.metadata or load_bookie_config(self.config).metadata}
        if self.config:
            from ledgerstore.config import load_client_config

            return {"config": load_client_config(self.config, **({"metadata": self.metadata} if self.metadata else {}))}
        if not self.metadata:
            raise ConfigError("no metadata store: pass --metadata URI, --config client.toml or set LEDGERSTORE_METADATA")
        return {"metadata": self.metadata}

    def with_client(self, fn: Callable[[Any], Awaitable[T]], *, need_cluster: bool = True) -> T:
        """Run ``fn(client)``. Unless ``need_cluster`` is false (the commands that create or erase
        a cluster), a metadata URI holding no cluster fails in one line and nothing is created."""
        from ledgerstore.aio import Client
        from ledgerstore.cli.common import cluster_client

        async def go() -> T:
            if need_cluster:
                async with cluster_client(**self.client_kwargs()) as client:
                    return await fn(client)
            async with Client(**self.client_kwargs(), need_cluster=False) as client:
                return await fn(client)

        return run_async(go())


# BookKeeper's shell spells long options with one dash (``-ledgerid 4``, ``-deleteCookie``); these are
# rewritten to our double-dash names before click parses, so both spellings work.
BOOKKEEPER_LONG_FLAGS = {
    "ledgerid": "--ledgerid", "bookieid": "--bookieid", "firstentryid": "--firstentryid",
    "lastentryid": "--lastentryid", "deletecookie": "--delete-cookie", "force": "--force",
    "readwrite": "--readwrite", "readonly": "--readonly", "all": "--all", "hostnames": "--hostnames",
    "meta": "--meta", "instanceid": "--instanceid", "replicascheck": "--replicascheck",
    "recovery": "--recovery", "password": "--password", "missing": "--missing", "query": "--query",
    "dryrun": "--dryrun", "verbose": "--verbose", "noninteractive": "--nonInteractive", "limit": "--limit",
    "srcbookie": "--srcBookie", "destbookie": "--destBookie", "expandstorage": "--expandstorage", "list": "--list",
    "output": "--output", "skipopenledgers": "--skipOpenLedgers", "ledger": "--ledger",
    "updatespersec": "--updatespersec", "printprogress": "--printprogress", "enable": "--enable",
    "disable": "--disable", "status": "--status", "logid": "--logId", "logfilename": "--logFilename",
    "ensemble": "--ensemble", "writequorum": "--writeQuorum", "ackquorum": "--ackQuorum",
    "numentries": "--numEntries", "dumptofile": "--dumptofile", "restorefromfile": "--restorefromfile",
    "update": "--update", "msg": "--msg", "force-recovery": "--force-recovery",
    "missingreplica": "--missingreplica", "excludingmissingreplica": "--excludingmissingreplica",
    "printmissingreplica": "--printmissingreplica", "printreplicationworkerid": "--printreplicationworkerid",
    "onlydisplayledgercount": "--onlydisplayledgercount", "entries": "--entries", "timeout": "--timeout",
    "get": "--get", "set": "--set", "checkallledgerscheck": "--checkallledgerscheck", "journal": "--journal",
    "entrylog": "--entrylog", "index": "--index", "bookie": "--bookie",
}


def normalize_bookkeeper_flags(args: list[str]) -> list[str]:
    """``-ledgerid`` -> ``--ledgerid`` (and the other BookKeeper long flags, any case); other
    arguments are left alone, so short flags (``-l``) and values keep their meaning."""
    out = []
    for a in args:
        name, eq, value = a[1:].partition("=")
        long = BOOKKEEPER_LONG_FLAGS.get(name.lower()) if a.startswith("-") and not a.startswith("--") else None
        out.append(long + eq + value if long else a)
    return out


class BookKeeperFlagsGroup(click.Group):
    """A command group that also accepts BookKeeper's single-dash long flags."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = normalize_bookkeeper_flags(args)
        self._refuse_unknown_words(args)
        return super().parse_args(ctx, args)

    def _refuse_unknown_words(self, args: list[str]) -> None:
        # click reads an unknown ``-nosuchflag`` as the short flags -n -o -s ... and names only ``-n``;
        # name the whole word instead.
        params = [p for c in [self, *self.commands.values()] for p in c.params if isinstance(p, click.Option)]
        known = {o for p in params for o in p.opts + p.secondary_opts}
        takes_value = {o for p in params if not p.is_flag for o in p.opts}
        for prev, a in zip(["", *args[:-1]], args, strict=True):
            if (a.startswith("-") and not a.startswith("--") and len(a) > 2 and a[1:].isalpha()
                    and a not in known and prev not in takes_value):
                raise click.UsageError(f"no such option {a!r} (BookKeeper's single-dash long flags known here: "
                                       f"{', '.join('-' + k for k in sorted(BOOKKEEPER_LONG_FLAGS))})")


pass_ctx = click.make_pass_decorator(ShellContext)


@click.group(cls=BookKeeperFlagsGroup)
@click.option("--metadata", envvar="LEDGERSTORE_METADATA", help="metadata store URI (or $LEDGERSTORE_METADATA)")
@click.option("--config", type=click.Path(dir_okay=False), help="client TOML config, or a bookie's (its metadata URI is used)")
@click.pass_context
def shell(ctx: click.Context, metadata: str | None, config: str | None) -> None:
    """Administration commands (named as in `bookkeeper shell`)."""
    ctx.obj = ShellContext(metadata, config)


@shell.command()
@click.option("-e", "--ensemble", type=click.IntRange(min=1), default=3, show_default=True, help="ensemble size")
@click.option("-w", "--write-quorum", "--writeQuorum", "write_quorum", type=click.IntRange(min=1), default=2,
              show_default=True, help="write quorum size")
@click.option("-a", "--ack-quorum", "--ackQuorum", "ack_quorum", type=click.IntRange(min=1), default=2,
              show_default=True, help="ack quorum size")
@click.option("-n", "--entries", "--numEntries", "entries", type=click.IntRange(min=0), default=100,
              show_default=True, help="entries to write")
@json_option
@pass_ctx
@handle_errors
def simpletest(sc: ShellContext, ensemble: int, write_quorum: int, ack_quorum: int, entries: int, as_json: bool) -> None:
    """Create a ledger, write entries, read them back, delete it."""

    async def go(client: Any) -> dict[str, Any]:
        lh = await client.create_ledger(ensemble, write_quorum, ack_quorum, password=b"simpletest")
        payloads = [os.urandom(64) for _ in range(entries)]
        t0 = time.perf_counter()
        with Progress(console=console, transient=True, disable=as_json) as progress:
            task = progress.add_task("writing", total=entries)
            futs = []
            for p in payloads:
                f = lh.append_async(p)
                f.add_done_callback(lambda _f: progress.advance(task))
                futs.append(f)
            import asyncio

            await asyncio.gather(*futs)
        t_write = time.perf_counter() - t0
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id, b"simpletest", recovery=False)
        got = await rh.read(0, entries - 1) if entries else []
        ok = [e.payload for e in got] == payloads
        await client.delete_ledger(lh.ledger_id)
        if not ok:
            from ledgerstore.errors import LedgerStoreError

            raise LedgerStoreError(f"simpletest: ledger {lh.ledger_id} read back different data")
        return {"ledger_id": lh.ledger_id, "entries": entries, "ensemble": lh.md.ensembles[0][1],
                "write_seconds": round(t_write, 4), "result": "ok"}

    r = sc.with_client(go)
    if as_json:
        emit(r, True)
    else:
        console.print(f"[green]simpletest ok[/green]: {r['entries']} entries written to ledger {r['ledger_id']} on "
                      f"{', '.join(r['ensemble'])} in {r['write_seconds']}s, read back, deleted")


async def _bookies_with_live_counts(client: Any, read_only: bool | None) -> tuple[list[Any], Counter[str]]:
    """The registered bookies and, for each, how many ledgers name it in an ensemble now (the count
    in a registration record is the one the bookie had when it registered)."""
    infos = await client.list_bookies(read_only)
    counts: Counter[str] = Counter()
    for lid in await client.list_ledgers():
        md = await client.ledger_metadata(lid)
        counts.update({b for _, ens in md.ensembles for b in ens})
    return infos, counts


@shell.command()
@click.option("-rw", "--readwrite", is_flag=True, help="only writable bookies")
@click.option("-ro", "--readonly", is_flag=True, help="only read-only bookies")
@click.option("-a", "--all", "all_", is_flag=True, help="writable and read-only bookies (the default)")
@click.option("-h", "--hostnames", is_flag=True, help="also print each bookie's host name")
@json_option
@pass_ctx
@handle_errors
def listbookies(sc: ShellContext, readwrite: bool, readonly: bool, all_: bool, hostnames: bool, as_json: bool) -> None:
    """List registered bookies."""
    import dataclasses
    import socket

    ro = None if all_ else (True if readonly and not readwrite else (False if readwrite and not readonly else None))
    infos, counts = sc.with_client(lambda c: _bookies_with_live_counts(c, ro))
    rows = [dataclasses.asdict(b) for b in sorted(infos, key=lambda b: b.bookie_id)]
    for r in rows:
        r["ledger_count"] = counts[r["bookie_id"]]
        r["state"] = "read-only" if r["read_only"] else "writable"
        r.pop("extra", None)
        if hostnames:
            host = r["bookie_id"].rpartition(":")[0] or r["bookie_id"]
            try:
                r["hostname"] = socket.gethostbyaddr(host)[0]
            except OSError:
                r["hostname"] = host
    cols = ["bookie_id", "endpoint", "state", "rack", "region", "free_bytes", "ledger_count"]
    emit(rows, as_json, cols[:1] + ["hostname"] + cols[1:] if hostnames else cols, title=f"{len(rows)} bookies")


@shell.command()
@json_option
@pass_ctx
@handle_errors
def bookieinfo(sc: ShellContext, as_json: bool) -> None:
    """Each bookie's free disk space and ledger count, and the cluster's total."""
    infos, counts = sc.with_client(lambda c: _bookies_with_live_counts(c, None))
    rows = [{"bookie_id": b.bookie_id, "state": "read-only" if b.read_only else "writable",
             "free_bytes": b.free_bytes, "total_bytes": b.total_bytes, "ledger_count": counts[b.bookie_id]}
            for b in sorted(infos, key=lambda b: b.bookie_id)]
    free, total = sum(r["free_bytes"] for r in rows), sum(r["total_bytes"] for r in rows)
    emit(rows, as_json, ["bookie_id", "state", "free_bytes", "total_bytes", "ledger_count"],
         title=f"{len(rows)} bookies, total free space {free} of {total} bytes")


@shell.command()
@click.option("-b", "--bookieid", "bookie_id", required=True, help="the bookie id host:port")
@json_option
@pass_ctx
@handle_errors
def endpointinfo(sc: ShellContext, bookie_id: str, as_json: bool) -> None:
    """Where a bookie is reached: its registered endpoint, or the one its cookie records
    (exit code 3 for an unknown bookie)."""
    import sys

    from ledgerstore.cli.common import EXIT_NOT_FOUND, err_console
    from ledgerstore.meta.bookies import CookieManager

    async def go(client: Any) -> dict[str, Any] | None:
        info = {b.bookie_id: b for b in await client.list_bookies(None)}.get(bookie_id)
        if info is not None:
            return {"bookie_id": bookie_id, "endpoint": info.endpoint, "registered": True,
                    "state": "read-only" if info.read_only else "writable"}
        cookie = await CookieManager(client.store).get(bookie_id)
        if cookie is None:
            return None
        return {"bookie_id": bookie_id, "endpoint": cookie.get("endpoint", ""), "registered": False, "state": "down"}

    r = sc.with_client(go)
    if r is None:
        err_console.print(f"[red]not found:[/red] bookie {bookie_id} is neither registered nor has a cookie")
        sys.exit(EXIT_NOT_FOUND)
    emit(r, as_json, title=f"bookie {bookie_id}")


@shell.command()
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


@shell.command()
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
    from ledgerstore.cli.shell_ledger_files import dump_ledger_metadata, restore_ledger_metadata

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


@shell.command()
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
    from ledgerstore.cli.shell_bookie_read import read_from_bookie

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


@shell.command()
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


@shell.command()
@json_option
@pass_ctx
@handle_errors
def whatisinstanceid(sc: ShellContext, as_json: bool) -> None:
    """Print the cluster's instance id."""
    iid = sc.with_client(lambda c: c.instance_id(), need_cluster=False)  # "none" is an answer here
    if as_json:
        emit({"instance_id": iid}, True)
    else:
        console.print(iid or "(no cluster initialised)")


@shell.command()
@json_option
@pass_ctx
@handle_errors
def initnewcluster(sc: ShellContext, as_json: bool) -> None:
    """Create a new cluster (instance id and layout) in an empty metadata store."""
    from ledgerstore.errors import LedgerStoreError
    from ledgerstore.meta.bookies import ClusterManager

    async def go(client: Any) -> str:
        cm = ClusterManager(client.store)
        existing = await cm.instance_id()
        if existing is not None:
            raise LedgerStoreError(f"the metadata store already holds cluster {existing}; "
                                   "use nukeexistingcluster first to start over")
        return await cm.init()

    iid = sc.with_client(go, need_cluster=False)
    if as_json:
        emit({"instance_id": iid}, True)
    else:
        console.print(f"new cluster initialised: instance id {iid}")


async def _erase_cluster_metadata(store: Any) -> None:
    from ledgerstore.meta import layout

    for path in (layout.LEDGERS, layout.LOGS, layout.UNDERREPLICATION, layout.AVAILABLE, layout.COOKIES,
                 layout.LAYOUT, layout.INSTANCE_ID, "/auditor", HEALTH_CHECK_DISABLED):
        await store.delete_recursive(path)


@shell.command()
@click.option("-n", "--nonInteractive", "non_interactive", is_flag=True,
              help="never ask: refuse if the store already holds a cluster (unless -f)")
@click.option("-f", "--force", is_flag=True, help="erase an existing cluster's metadata without asking")
@json_option
@pass_ctx
@handle_errors
def metaformat(sc: ShellContext, non_interactive: bool, force: bool, as_json: bool) -> None:
    """Format the cluster metadata: erase whatever cluster it holds (asking first) and initialise a
    new one. Bookies' data on disk is not touched: format them before they join (bookieformat)."""
    from ledgerstore.errors import LedgerStoreError
    from ledgerstore.meta import layout
    from ledgerstore.meta.bookies import ClusterManager

    async def existing_cluster(client: Any) -> tuple[str | None, bool]:
        # As BookKeeper does, any ledgers, cookies or registered bookies count as existing data,
        # with or without an instance id.
        iid = await ClusterManager(client.store).instance_id()
        data = [await client.store.children(p) for p in (layout.LEDGERS, layout.COOKIES, layout.AVAILABLE)]
        return iid, iid is not None or any(data)

    existing, has_data = sc.with_client(existing_cluster, need_cluster=False)
    if has_data and not force:
        what = f"cluster {existing}" if existing else "cluster metadata (ledgers, cookies or bookies)"
        if non_interactive:
            raise LedgerStoreError(f"the metadata store holds {what}; pass -f to erase it")
        if not click.confirm(f"erase the {what}?", default=False):
            raise click.Abort()

    async def go(client: Any) -> str:
        await _erase_cluster_metadata(client.store)
        return await ClusterManager(client.store).init()

    iid = sc.with_client(go, need_cluster=False)
    if as_json:
        emit({"instance_id": iid, "erased_instance_id": existing}, True)
    else:
        console.print(f"metadata formatted: instance id {iid}" + (f" (cluster {existing} erased)" if existing else ""))


@shell.command()
@click.option("-i", "--instanceid", "instance_id", help="the instance id to nuke (a safety check)")
@click.option("-f", "--force", is_flag=True, help="nuke without checking the instance id")
@json_option
@pass_ctx
@handle_errors
def nukeexistingcluster(sc: ShellContext, instance_id: str | None, force: bool, as_json: bool) -> None:
    """Delete every piece of cluster metadata (ledgers, logs, cookies, registrations, instance id).
    Bookies' data on disk is not touched: format them before they join a new cluster."""
    from ledgerstore.errors import LedgerStoreError
    from ledgerstore.meta.bookies import ClusterManager

    if not force and not instance_id:
        raise click.UsageError("give --instanceid ID (see whatisinstanceid) or --force")

    async def go(client: Any) -> str | None:
        existing = await ClusterManager(client.store).instance_id()
        if not force and existing != instance_id:
            raise LedgerStoreError(f"instance id mismatch: the cluster is {existing!r}, you named {instance_id!r}")
        await _erase_cluster_metadata(client.store)
        return existing

    nuked = sc.with_client(go, need_cluster=False)
    if as_json:
        emit({"nuked_instance_id": nuked}, True)
    else:
        console.print(f"cluster {nuked} nuked")


# --- bookie-local storage tools (run against a bookie's directories, normally while it is stopped) ---------
#
# A running bookie locks its directories (bookie/dirlock.py). Every tool here that opens the
# storage engine or writes takes the same lock for as long as it works, so it refuses, naming the
# bookie's PID, while the bookie runs, and a bookie cannot start under it meanwhile.


def _open_local(config_path: str, tool: str) -> tuple[Any, Any, Any]:
    """The bookie's config, its storage engine (opened) and the lock held on its directories."""
    from ledgerstore.config import load_bookie_config
    from ledgerstore.plugins import load_driver

    cfg = load_bookie_config(config_path)
    lock = lock_bookie_dirs(cfg, tool)
    try:
        engine = load_driver("storage", cfg.storage)([Path(d) for d in cfg.ledger_dirs], **cfg.storage_options)
        engine.open()
    except BaseException:
        lock.release()
        raise
    return cfg, engine, lock


@shell.command()
@config_option
@json_option
@handle_errors
def localconsistencycheck(bookie_config: str, as_json: bool) -> None:
    """Check that every entry the storage engine indexes is readable and checksum-valid."""
    from ledgerstore.errors import BookieIOError, LedgerStoreError, NoSuchEntryError
    from ledgerstore.proto.digest import parse_entry_header

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


@shell.command()
@config_option
@json_option
@handle_errors
def lastmark(bookie_config: str, as_json: bool) -> None:
    """Print the journal's LastLogMark (up to where the storage engine holds everything)."""
    from ledgerstore.bookie.journal import read_mark
    from ledgerstore.config import load_bookie_config

    cfg = load_bookie_config(bookie_config)
    mark = read_mark(Path(cfg.journal_dir))
    emit({"journal_file_id": mark.file_id, "offset": mark.offset}, as_json, title="LastLogMark")


@shell.command()
@config_option
@click.option("-txn", "--journal", "journal", is_flag=True, help="the journal files")
@click.option("-log", "--entrylog", "entrylog", is_flag=True, help="the entry log files (*.log in the ledger directories)")
@click.option("-idx", "--index", "index", is_flag=True, help="the other ledger-storage files (indexes, RocksDB files)")
@json_option
@handle_errors
def listfilesondisc(bookie_config: str, journal: bool, entrylog: bool, index: bool, as_json: bool) -> None:
    """List the journal and ledger-storage files of a bookie (all of them, or the kinds asked for)."""
    from ledgerstore.bookie.dirlock import LOCK_FILE
    from ledgerstore.config import load_bookie_config

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


@shell.command()
@config_option
@click.option("--limit", default=0, help="print at most this many records (0: all)")
@json_option
@handle_errors
def readjournal(bookie_config: str, limit: int, as_json: bool) -> None:
    """Print the records of every journal file (type, ledger, entry, size, position)."""
    from ledgerstore.bookie.journal import ADD, FENCE, MASTER_KEY, journal_files, scan_file
    from ledgerstore.config import load_bookie_config

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


@shell.command()
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
    import shutil

    from ledgerstore.bookie.dirlock import LOCK_FILE
    from ledgerstore.config import load_bookie_config

    cfg = load_bookie_config(bookie_config)
    dirs = [Path(cfg.journal_dir), *(Path(d) for d in cfg.ledger_dirs)]
    lock = lock_bookie_dirs(cfg, "bookieformat")
    try:
        has_data = any(p.name != LOCK_FILE for d in dirs if d.exists() for p in d.iterdir())
        if has_data and not force:
            if non_interactive:
                from ledgerstore.errors import LedgerStoreError

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
        from ledgerstore.meta.bookies import CookieManager

        with_bookie_store(cfg, lambda store: CookieManager(store).delete(bookie_id_of(cfg)))
    emit({"formatted": [str(d) for d in dirs], "cookie_deleted": delete_cookie}, as_json, title="bookieformat")


@shell.command()
@config_option
@json_option
@handle_errors
def initbookie(bookie_config: str, as_json: bool) -> None:
    """Prepare a new bookie: check its journal and ledger directories are empty and no cookie is
    registered under its id, then create the directories (the bookie writes its cookie when it first
    starts). Refused, naming its PID, while a bookie or another tool holds the directories."""
    from ledgerstore.bookie.dirlock import LOCK_FILE
    from ledgerstore.config import load_bookie_config
    from ledgerstore.errors import LedgerStoreError
    from ledgerstore.meta.bookies import CookieManager

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


@shell.command("gc")
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
        from ledgerstore.bookie.http_auth import bearer_headers
        from ledgerstore.cli.shell_http import admin_request

        result = admin_request(http_address, "PUT", f"/api/v1/bookie/gc?{'major=true' if major else 'minor=true'}",
                               bearer_headers(token_file), timeout=600)
    elif bookie_config:
        from ledgerstore.meta.ledgers import LedgerManager
        from ledgerstore.plugins import create_metadata_store

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


shell.add_command(updatebookieinledger)
shell.add_command(updatebookieinledger, "updateBookieInLedger")
shell.add_command(updateledgers)
shell.add_command(healthcheck)
shell.add_command(readlogmetadata)
shell.add_command(activeledgers)
shell.add_command(ledger_index)


# --- auto-recovery -----------------------------------------------------------------------------


def _urm(client: Any) -> UnderReplicationManager:
    return UnderReplicationManager(client.store)


@shell.command()
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


@shell.command()
@json_option
@pass_ctx
@handle_errors
def whoisauditor(sc: ShellContext, as_json: bool) -> None:
    """Print the elected auditor (exit code 3 when no auto-recovery process is running)."""
    import sys

    from ledgerstore.cli.common import EXIT_NOT_FOUND

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


@shell.command()
@click.option("--replicas", is_flag=True, help="also ask every bookie which ledgers it holds (replicas check)")
@json_option
@pass_ctx
@handle_errors
def triggeraudit(sc: ShellContext, replicas: bool, as_json: bool) -> None:
    """Ask the auditor for a full check of every ledger now."""
    _trigger_audit(sc, replicas, as_json)


@shell.command()
@click.option("-calc", "-apc", "--checkallledgerscheck", "--auditorperiodiccheck", "auditorperiodiccheck", is_flag=True,
              help="the full ledger check (always run)")
@click.option("-rc", "--replicascheck", is_flag=True, help="also the replicas check")
@json_option
@pass_ctx
@handle_errors
def forceauditchecks(sc: ShellContext, auditorperiodiccheck: bool, replicascheck: bool, as_json: bool) -> None:
    """Make the auditor run its checks at its next chance (BookKeeper's forceauditchecks)."""
    _trigger_audit(sc, replicascheck, as_json)


@shell.command()
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


@shell.command("autorecovery")
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


@shell.command()
@click.option("-g", "--get", "get", is_flag=True, help="print the delay (also what the command does without flags)")
@click.option("-s", "--set", "seconds", type=float, default=None, help="new delay in seconds (cluster-wide)")
@click.option("--clear", is_flag=True, help="forget the cluster-wide value: each process's config rules")
@json_option
@pass_ctx
@handle_errors
def lostbookierecoverydelay(sc: ShellContext, get: bool, seconds: float | None, clear: bool, as_json: bool) -> None:
    """Show or set how long a bookie must be gone before its ledgers are re-replicated."""
    from ledgerstore.errors import NoSuchKeyError
    from ledgerstore.recovery.markers import LOST_BOOKIE_DELAY

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


def _recovery_settings(grace: float, rate: float) -> Any:
    from ledgerstore.config import AutoRecoveryConfig

    return AutoRecoveryConfig(open_ledger_rereplication_grace_s=grace, rereplication_entries_per_s=rate)


def _run_with_progress(sc: ShellContext, label: str, as_json: bool,
                       work: Callable[[Any, Callable[[int, int], None]], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    import sys

    from ledgerstore.cli.common import EXIT_NOT_FOUND, err_console
    from ledgerstore.recovery.admin import BookieNotFoundError

    with Progress(console=console, transient=True, disable=as_json) as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=max(total, 1))

        try:
            return sc.with_client(lambda client: work(client, update))
        except BookieNotFoundError as exc:
            err_console.print(f"[red]not found:[/red] {exc}")
            sys.exit(EXIT_NOT_FOUND)


@shell.command()
@click.argument("bookie_id")
@click.option("--open-ledger-grace", "grace", type=float, default=30.0, show_default=True,
              help="seconds an open ledger's writer gets to move off the bookie before it is fenced and closed")
@click.option("--entries-per-second", "rate", type=float, default=0.0, show_default=True, help="copy throttle (0 = none)")
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
def recover(sc: ShellContext, bookie_id: str, grace: float, rate: float, timeout: float, delete_cookie: bool,
            query: bool, dryrun: bool, skip_open: bool, only_ledger: int | None, force: bool, as_json: bool) -> None:
    """Re-replicate every ledger fragment of a dead bookie, from this process (no auditor needed)."""
    from ledgerstore.meta.ledgers import LedgerState
    from ledgerstore.recovery.admin import recover_bookie

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


@shell.command()
@click.argument("bookie_id", required=False)
@click.option("--bookieid", "bookie_opt", default=None,
              help="the bookie to decommission (BookKeeper's -bookieid; default: the one --config names)")
@click.option("--timeout", type=float, default=3600.0, show_default=True, help="seconds")
@click.option("--local-worker", is_flag=True,
              help="also copy from this process (otherwise the cluster's auto-recovery workers do it)")
@click.option("--open-ledger-grace", "grace", type=float, default=30.0, show_default=True,
              help="for --local-worker: seconds an open ledger's writer gets before it is fenced and closed")
@click.option("--entries-per-second", "rate", type=float, default=0.0, show_default=True,
              help="for --local-worker: copy throttle (0 = none)")
@json_option
@pass_ctx
@handle_errors
def decommissionbookie(sc: ShellContext, bookie_id: str | None, bookie_opt: str | None, timeout: float,
                       local_worker: bool, grace: float, rate: float, as_json: bool) -> None:
    """Move every ledger off a bookie (alive or dead), then delete its cookie. A live bookie
    running auto-recovery turns read-only first; stop it once this is done. The bookie is named
    as an argument, by ``-bookieid``, or (as BookKeeper's shell does on the bookie's own host) by
    the bookie config given to ``--config``."""
    from ledgerstore.recovery.admin import decommission_bookie

    if bookie_id and bookie_opt and bookie_id != bookie_opt:
        raise click.UsageError(f"two bookies named: {bookie_id} and -bookieid {bookie_opt}")
    bookie_id = bookie_id or bookie_opt
    if bookie_id is None:
        if not (sc.config and _is_bookie_config(sc.config)):
            raise click.UsageError("name the bookie: decommissionbookie -bookieid HOST:PORT (or --config bookie.toml)")
        from ledgerstore.config import load_bookie_config

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


@shell.command()
@click.option("-b", "--bookie", "bookie_id", help="bookie id host:port (default: the one --bookie-config names)")
@click.option("--bookie-config", type=click.Path(dir_okay=False, exists=True), help="the bookie's TOML config")
@click.option("-e", "-n", "--entries", type=click.IntRange(min=0), default=10, show_default=True,
              help="entries to write and read back")
@click.option("-t", "--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="seconds the writes, and then the reads, may take")
@json_option
@pass_ctx
@handle_errors
def bookiesanity(sc: ShellContext, bookie_id: str | None, bookie_config: str | None, entries: int, timeout: float,
                 as_json: bool) -> None:
    """Sanity test of one bookie: write entries to a ledger on it alone, read them back, delete it.
    Exit 1, naming the step, when the writes or the reads take longer than ``-timeout`` seconds."""
    if bookie_id is None:
        if bookie_config is None:
            raise click.UsageError("give --bookie HOST:PORT or --bookie-config FILE")
        from ledgerstore.api.transport import split_address
        from ledgerstore.config import load_bookie_config

        cfg = load_bookie_config(bookie_config)
        _, host, port = split_address(cfg.advertised_address or cfg.listen)
        bookie_id = f"{host}:{port}"
        if sc.metadata is None and sc.config is None:
            sc.metadata = cfg.metadata

    async def within(step: str, aw: Awaitable[T]) -> T:
        import asyncio

        from ledgerstore.errors import LedgerStoreError

        try:
            return await asyncio.wait_for(aw, timeout)
        except TimeoutError:
            raise LedgerStoreError(f"bookie {bookie_id} did not complete the {step} within {timeout:g}s") from None

    async def go(client: Any) -> dict[str, Any]:
        import asyncio

        lh = await client.create_ledger(1, 1, 1, password=b"bookiesanity", bookies=[bookie_id])
        try:
            payloads = [b"bookiesanity-%d" % i for i in range(entries)]
            await within("writes", asyncio.gather(*(lh.append_async(p) for p in payloads)))
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, b"bookiesanity", recovery=False)
            got = [e.payload for e in await within("reads", rh.read(0, entries - 1))] if entries else []
        finally:
            await client.delete_ledger(lh.ledger_id)
        if got != payloads:
            from ledgerstore.errors import LedgerStoreError

            raise LedgerStoreError(f"bookie {bookie_id} returned different data than was written")
        return {"bookie": bookie_id, "entries": entries, "result": "ok"}

    r = sc.with_client(go)
    if as_json:
        emit(r, True)
    else:
        console.print(f"[green]bookie sanity test succeeded[/green] on {bookie_id} ({entries} entries)")


shell.add_command(updatecookie)
shell.add_command(generatecookie)
shell.add_command(metadata_export)
shell.add_command(metadata_import)
shell.add_command(metadata_copy)
shell.add_command(clusterinfo)
shell.add_command(cookie_get)
shell.add_command(cookie_delete)
