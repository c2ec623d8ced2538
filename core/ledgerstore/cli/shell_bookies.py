"""``shell`` commands about bookies: ``simpletest``, ``listbookies``, ``bookieinfo``, ``endpointinfo``
and ``bookiesanity``."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any, TypeVar

import click
from rich.progress import Progress

from ledgerstore.api.transport import split_address
from ledgerstore.cli.common import (
    EXIT_NOT_FOUND,
    console,
    emit,
    err_console,
    handle_errors,
)
from ledgerstore.cli.shell_context import ShellContext, pass_ctx
from ledgerstore.cli.shell_local import (
    json_option,
)
from ledgerstore.config import load_bookie_config
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.bookies import CookieManager

T = TypeVar("T")


@click.command()
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

            await asyncio.gather(*futs)
        t_write = time.perf_counter() - t0
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id, b"simpletest", recovery=False)
        got = await rh.read(0, entries - 1) if entries else []
        ok = [e.payload for e in got] == payloads
        await client.delete_ledger(lh.ledger_id)
        if not ok:
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


@click.command()
@click.option("-rw", "--readwrite", is_flag=True, help="only writable bookies")
@click.option("-ro", "--readonly", is_flag=True, help="only read-only bookies")
@click.option("-a", "--all", "all_", is_flag=True, help="writable and read-only bookies (the default)")
@click.option("-h", "--hostnames", is_flag=True, help="also print each bookie's host name")
@json_option
@pass_ctx
@handle_errors
def listbookies(sc: ShellContext, readwrite: bool, readonly: bool, all_: bool, hostnames: bool, as_json: bool) -> None:
    """List registered bookies."""

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
    # ledgers_in_limbo: the bookie lost data and is repairing those ledgers itself
    cols = ["bookie_id", "endpoint", "state", "rack", "region", "free_bytes", "ledger_count", "ledgers_in_limbo"]
    emit(rows, as_json, cols[:1] + ["hostname"] + cols[1:] if hostnames else cols, title=f"{len(rows)} bookies")


@click.command()
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


@click.command()
@click.option("-b", "--bookieid", "bookie_id", required=True, help="the bookie id host:port")
@json_option
@pass_ctx
@handle_errors
def endpointinfo(sc: ShellContext, bookie_id: str, as_json: bool) -> None:
    """Where a bookie is reached: its registered endpoint, or the one its cookie records
    (exit code 3 for an unknown bookie)."""

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


@click.command()
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

        cfg = load_bookie_config(bookie_config)
        _, host, port = split_address(cfg.advertised_address or cfg.listen)
        bookie_id = f"{host}:{port}"
        if sc.metadata is None and sc.config is None:
            sc.metadata = cfg.metadata

    async def within(step: str, aw: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(aw, timeout)
        except TimeoutError:
            raise LedgerStoreError(f"bookie {bookie_id} did not complete the {step} within {timeout:g}s") from None

    async def go(client: Any) -> dict[str, Any]:
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
            raise LedgerStoreError(f"bookie {bookie_id} returned different data than was written")
        return {"bookie": bookie_id, "entries": entries, "result": "ok"}

    r = sc.with_client(go)
    if as_json:
        emit(r, True)
    else:
        console.print(f"[green]bookie sanity test succeeded[/green] on {bookie_id} ({entries} entries)")
