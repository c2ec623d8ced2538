"""``ledgerstore standalone``: sqlite metadata and N bookie processes on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from ledgerstore.cli.common import console, handle_errors


class StandaloneCluster:
    """Start, watch and stop a local cluster; usable from tests and scripts too."""

    def __init__(self, data_dir: Path, bookies: int = 3, port_base: int = 3181, storage: str = "entrylog",
                 transport: str = "tcp", extra_bookie_config: str = "") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.n = bookies
        self.port_base = port_base
        self.storage = storage
        self.transport = transport
        self.extra = extra_bookie_config
        self.metadata = f"sqlite://{self.data_dir / 'metadata.db'}"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def config_path(self, i: int) -> Path:
        return self.data_dir / f"bookie-{i}" / "bookie.toml"

    def write_configs(self) -> None:
        for i in range(self.n):
            p = self.config_path(i)
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.exists():
                continue  # keep an existing cluster's configuration (and so its bookie ids)
            p.write_text(
                "[bookie]\n"
                f'metadata = "{self.metadata}"\n'
                f'listen = "{self.transport}://127.0.0.1:{self.port_base + i}"\n'
                'journal_dir = "journal"\n'
                'ledger_dirs = ["ledgers"]\n'
                f'storage = "{self.storage}"\n'
                "flush_interval_ms = 10000\n" + self.extra
            )

    def start_bookie(self, i: int) -> subprocess.Popen[bytes]:
        log = open(self.config_path(i).parent / "bookie.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ledgerstore", "bookie", "--config", str(self.config_path(i))],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.procs[i] = proc
        return proc

    def start(self, timeout: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.write_configs()
        for i in range(self.n):
            self.start_bookie(i)
        self.wait_registered(self.n, timeout)

    def wait_registered(self, count: int, timeout: float = 60.0) -> None:
        import asyncio

        from ledgerstore.meta.bookies import BookieRegistry
        from ledgerstore.plugins import create_metadata_store

        async def poll() -> int:
            store = create_metadata_store(self.metadata)
            await store.start()
            try:
                return len(await BookieRegistry(store).all())
            finally:
                await store.close()

        deadline = time.monotonic() + timeout
        while True:
            for i, p in self.procs.items():
                if p.poll() is not None:
                    tail = (self.config_path(i).parent / "bookie.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"bookie {i} exited with code {p.returncode}:\n{tail}")
            if asyncio.run(poll()) >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only some of {count} bookies registered within {timeout}s")
            time.sleep(0.2)

    def stop(self, timeout: float = 30.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def run_demo(metadata: str, entries: int = 10_000, size: int = 100) -> dict[str, float]:
    """Write and read back ``entries`` entries through the async API; returns figures."""
    import asyncio

    from ledgerstore.aio import Client

    async def demo() -> dict[str, float]:
        async with Client(metadata=metadata) as client:
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
@click.option("--bookies", default=3, show_default=True, help="number of bookie processes")
@click.option("--data-dir", default="ledgerstore-data", show_default=True, type=click.Path(file_okay=False))
@click.option("--port-base", default=3181, show_default=True, help="first bookie's port; the others follow")
@click.option("--storage", default="entrylog", show_default=True, help="storage engine plugin")
@click.option("--transport", default="tcp", show_default=True, help="transport plugin (scheme)")
@click.option("--demo", is_flag=True, help="run a demo workload (write, read back, verify), then stop")
@click.option("--demo-entries", default=10_000, show_default=True)
@handle_errors
def standalone(bookies: int, data_dir: str, port_base: int, storage: str, transport: str, demo: bool,
               demo_entries: int) -> None:
    """Run sqlite metadata and N bookies on this machine. Ctrl-C stops it; a restart on the same
    --data-dir keeps every ledger."""
    cluster = StandaloneCluster(Path(data_dir), bookies, port_base, storage, transport)
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
        console.print(f"metadata URI: [bold]{cluster.metadata}[/bold]")
        for i in range(bookies):
            console.print(f"  bookie {i}: {transport}://127.0.0.1:{port_base + i}  (log: {cluster.config_path(i).parent / 'bookie.log'})")
        if demo:
            console.print(f"demo: writing {demo_entries} entries of 100 bytes (E=3 Qw=2 Qa=2), reading them back ...")
            r = run_demo(cluster.metadata, demo_entries)
            console.print(
                f"[green]demo ok[/green]: ledger {r['ledger_id']}: wrote {r['entries']} entries in {r['write_s']:.2f}s "
                f"({r['write_per_s']:,.0f}/s), read back and verified in {r['read_s']:.2f}s ({r['read_per_s']:,.0f}/s)")
            return
        console.print("serving; press Ctrl-C to stop")
        while not stop["now"]:
            for i, p in list(cluster.procs.items()):
                if p.poll() is not None:
                    console.print(f"[red]bookie {i} exited with code {p.returncode}; restarting it[/red]")
                    cluster.start_bookie(i)
            time.sleep(0.5)
    finally:
        console.print("stopping bookies ...")
        cluster.stop()
        console.print("stopped")
