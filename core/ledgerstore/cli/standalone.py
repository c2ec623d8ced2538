"""``ledgerstore standalone``: a sqlite metadata server and N bookie processes on this machine.

The metadata server owns the sqlite file and is started first: bookies and clients reach the
metadata through its socket, so no process (a paused client, a bookie in a debugger) can hold
the file's write lock and stall the others. See ``docs/metadata-sqlite.md``.

``--http-port-base P`` gives bookie i its admin HTTP server (metrics, health, admin API) on
127.0.0.1:P+i, with the admin credential (a bearer token) in ``<data dir>/admin-token``, made
once and readable by its owner only: the token is named by its file, never printed or put in a
URL. ``--autorecovery`` runs the auditor and a replication worker in every bookie.
``--kafka-port P`` serves the Kafka protocol on 127.0.0.1:P through the ``kafka`` protocol handler
(the ``ledgerstore.protocol`` plugin, found by its entry point; see ``docs/kafka.md``)."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import click

from ledgerstore.cli.common import cluster_client, console, handle_errors
from ledgerstore.cli.protocol_handlers import HandlerThread, check_handler_options
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import ConfigError
from ledgerstore.proto import speedups
from ledgerstore.startup import check_port_free


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


def admin_token_file(data_dir: Path) -> Path:
    """``<data dir>/admin-token``, holding a new random token (mode 0600) unless it has one."""
    path = data_dir / "admin-token"
    if not path.exists() or not path.read_text().strip():
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


def bookie_environment(cluster: LocalCluster, http_port_base: int, autorecovery: bool) -> None:
    """Configure the bookies of ``cluster`` through their environment: admin HTTP on
    ``http_port_base + i`` with the cluster's token file, and auto-recovery."""
    env = dict(cluster.env or {})
    if http_port_base:
        if http_port_base + cluster.n - 1 > 65535:
            raise ConfigError(f"--http-port-base {http_port_base} with {cluster.n} bookies leaves the port range "
                              "1-65535; choose a lower one")
        env["LEDGERSTORE_BOOKIE_HTTP__TOKEN_FILE"] = str(admin_token_file(cluster.data_dir))
        for i in range(cluster.n):
            check_port_free(f"bookie {i}'s admin HTTP (--http-port-base)", "127.0.0.1", http_port_base + i)
            cluster.bookie_env[i] = {"LEDGERSTORE_BOOKIE_HTTP_PORT": str(http_port_base + i)}
    if autorecovery:
        env["LEDGERSTORE_BOOKIE_AUTORECOVERY__ENABLED"] = "true"
    cluster.env = env


@click.command()
@click.option("--bookies", default=3, show_default=True, type=click.IntRange(min=1),
              help="number of bookie processes (at least 1)")
@click.option("--data-dir", default="ledgerstore-data", show_default=True, type=click.Path(file_okay=False))
@click.option("--port-base", default=3181, show_default=True, type=click.IntRange(0, 65535),
              help="first bookie's port; the others follow (0: any free ports)")
@click.option("--storage", default="entrylog", show_default=True, help="storage engine plugin")
@click.option("--transport", default="tcp", show_default=True, help="transport plugin (scheme)")
@click.option("--http-port-base", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="bookie i serves admin HTTP (metrics, admin API) on this port + i; 0: none")
@click.option("--autorecovery", is_flag=True,
              help="run the auditor and a replication worker in every bookie (re-replicates a lost bookie's ledgers)")
@click.option("--kafka-port", default=None, type=click.IntRange(1, 65535),
              help="serve the Kafka protocol on 127.0.0.1:PORT (the kafka protocol handler plugin)")
@click.option("--demo", is_flag=True, help="run a demo workload (write, read back, verify), then stop")
@click.option("--demo-entries", default=10_000, show_default=True)
@handle_errors
def standalone(bookies: int, data_dir: str, port_base: int, storage: str, transport: str, http_port_base: int,
               autorecovery: bool, kafka_port: int | None, demo: bool, demo_entries: int) -> None:
    """Run a sqlite metadata server and N bookies on this machine. Ctrl-C stops it; a restart on
    the same --data-dir keeps every ledger."""
    # Supervised: the metadata server and the bookies die with this process, even on kill -9, so
    # none keeps its port or the database's lock.
    cluster = LocalCluster(Path(data_dir), bookies, port_base, storage, transport, supervise=True,
                           metadata_server=True)
    bookie_environment(cluster, http_port_base, autorecovery)
    handlers: HandlerThread | None = None
    kafka = [("kafka", {"host": "127.0.0.1", "port": kafka_port})] if kafka_port is not None else []
    if kafka_port is not None:  # refused before any process starts: a port in use, the plugin missing
        check_port_free("the Kafka listener (--kafka-port)", "127.0.0.1", kafka_port)
        check_handler_options("kafka", kafka[0][1])
    console.print(f"starting {bookies} bookies ({storage} storage, {transport} transport) in {cluster.data_dir} ...")
    console.print(f"hot path: {speedups.state}", markup=False, highlight=False)
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
            admin = f"  admin http://127.0.0.1:{http_port_base + i}" if http_port_base else ""
            console.print(f"  bookie {i}: {cluster.address(i)}{admin}  (log: {cluster.log_path(i)})")
        if http_port_base:
            token = cluster.data_dir / "admin-token"
            console.print(f"metrics: http://127.0.0.1:{http_port_base}/metrics (one scrape target per bookie; "
                          "Grafana dashboard: deploy/grafana/ledgerstore-dashboard.json)")
            console.print(f"admin credential: the token in {token} (send it as the header "
                          f"'Authorization: Bearer $(cat {token})', never in a URL)")
        if kafka:
            handlers = HandlerThread(cluster.metadata, kafka)  # the metadata URI is known once it started
            handlers.start()
            console.print(f"kafka: 127.0.0.1:{kafka_port}  (bootstrap.servers=127.0.0.1:{kafka_port})")
        if autorecovery:
            console.print("auto-recovery: on (an auditor and a replication worker in every bookie)")
        if demo:
            console.print(f"demo: writing {demo_entries} entries of 100 bytes (E=3 Qw=2 Qa=2), reading them back ...")
            r = run_demo(cluster.metadata, demo_entries)
            console.print(
                f"[green]demo ok[/green]: ledger {r['ledger_id']}: wrote {r['entries']} entries in {r['write_s']:.2f}s "
                f"({r['write_per_s']:,.0f}/s), read back and verified in {r['read_s']:.2f}s ({r['read_per_s']:,.0f}/s)")
            return
        console.print("serving; press Ctrl-C to stop")
        while not stop["now"]:
            if handlers is not None and not handlers.alive():
                console.print("[red]the Kafka handler stopped; stopping the cluster[/red]")
                break
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
        if handlers is not None:
            handlers.stop()
        if cluster.procs or cluster.server_proc is not None:  # a failed start already said why
            console.print("stopping bookies, then the metadata server ...")
            cluster.stop()
            console.print("stopped")
