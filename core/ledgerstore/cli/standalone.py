"""``ledgerstore standalone``: a sqlite metadata server and N bookie processes on this machine.

The metadata server owns the sqlite file and is started first: bookies and clients reach the
metadata through its socket, so no process (a paused client, a bookie in a debugger) can hold
the file's write lock and stall the others. See ``docs/metadata-sqlite.md``."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import click

from ledgerstore.cli.common import cluster_client, console, handle_errors
from ledgerstore.cluster import LocalCluster


def run_demo(metadata: str, entries: int = 10_000, size: int = 100) -> dict[str, float]:
    """Write and read back ``entries`` entries through the async API; returns figures."""
    import asyncio

    async def demo() -> dict[str, float]:
        async with cluster_client(metadata=metadata) as client:
            lh = await client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"demo")
            payloads = [os.urandom(size) for _ in range(entries)]
            t0 = time.perf_counter()
            await asyncio.gather(*(lh.append_async(p) for p in payloads))
            t_write = time.perf_counter() - t0
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"demo")
            t0 = time.perf_counter()
            got = await rh.read(0, rh.last_add_confirmed)
            t_read = time.perf_counter() - t0
            if [e.payload for e in got] != payloads:
                raise RuntimeError("demo read back different bytes than it wrote")
            return {"ledger_id": lh.ledger_id, "entries": entries, "write_s": t_write, "read_s": t_read,
                    "write_per_s": entries / t_write, "read_per_s": entries / t_read}

    return asyncio.run(demo())


@click.command()
@click.option("--bookies", default=3, show_default=True, type=click.IntRange(min=1),
              help="number of bookie processes (at least 1)")
@click.option("--data-dir", default="ledgerstore-data", show_default=True, type=click.Path(file_okay=False))
@click.option("--port-base", default=3181, show_default=True, type=click.IntRange(0, 65535),
              help="first bookie's port; the others follow (0: any free ports)")
@click.option("--storage", default="entrylog", show_default=True, help="storage engine plugin")
@click.option("--transport", default="tcp", show_default=True, help="transport plugin (scheme)")
@click.option("--demo", is_flag=True, help="run a demo workload (write, read back, verify), then stop")
@click.option("--demo-entries", default=10_000, show_default=True)
@handle_errors
def standalone(bookies: int, data_dir: str, port_base: int, storage: str, transport: str, demo: bool,
               demo_entries: int) -> None:
    """Run a sqlite metadata server and N bookies on this machine. Ctrl-C stops it; a restart on
    the same --data-dir keeps every ledger."""
    # Supervised: the metadata server and the bookies die with this process, even on kill -9, so
    # none keeps its port or the database's lock.
    cluster = LocalCluster(Path(data_dir), bookies, port_base, storage, transport, supervise=True,
                           metadata_server=True)
    console.print(f"starting {bookies} bookies ({storage} storage, {transport} transport) in {cluster.data_dir} ...")
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t0 = time.monotonic()
    try:
        cluster.start()
        console.print(f"[green]cluster up[/green] in {time.monotonic() - t0:.1f}s")
        console.print(f"metadata URI: [bold]{cluster.metadata}[/bold]  (server log: {cluster.metadata_server_log})")
        for i in range(bookies):
            console.print(f"  bookie {i}: {cluster.address(i)}  (log: {cluster.log_path(i)})")
        if demo:
            console.print(f"demo: writing {demo_entries} entries of 100 bytes (E=3 Qw=2 Qa=2), reading them back ...")
            r = run_demo(cluster.metadata, demo_entries)
            console.print(
                f"[green]demo ok[/green]: ledger {r['ledger_id']}: wrote {r['entries']} entries in {r['write_s']:.2f}s "
                f"({r['write_per_s']:,.0f}/s), read back and verified in {r['read_s']:.2f}s ({r['read_per_s']:,.0f}/s)")
            return
        console.print("serving; press Ctrl-C to stop")
        while not stop["now"]:
            server = cluster.server_proc
            if server is not None and server.poll() is not None:
                console.print(f"[red]metadata server exited with code {server.returncode}; restarting it[/red]")
                cluster.start_metadata_server()
            for i, p in list(cluster.procs.items()):
                if p.poll() is not None:
                    console.print(f"[red]bookie {i} exited with code {p.returncode}; restarting it[/red]")
                    cluster.start_bookie(i)
            time.sleep(0.5)
    finally:
        if cluster.procs or cluster.server_proc is not None:  # a failed start already said why
            console.print("stopping bookies, then the metadata server ...")
            cluster.stop()
            console.print("stopped")
