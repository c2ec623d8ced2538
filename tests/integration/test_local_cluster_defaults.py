"""A LocalCluster on sqlite (the default of the tests, the benchmarks and ``ledgerstore bench``)
runs the metadata server: its bookies and clients never hold the database's write lock
themselves, so a paused process cannot stall a bookie restart. Direct mode is there when asked for."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore_sqlite.discovery import live_socket


def test_a_sqlite_local_cluster_runs_the_metadata_server_and_bookies_restart_through_it(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=2, port_base=None) as cluster:
        assert cluster.server_proc is not None and cluster.server_proc.poll() is None
        assert live_socket(cluster.metadata.removeprefix("sqlite://")) is not None
        cluster.kill(0, signal.SIGKILL)
        cluster.restart(0)

        async def use() -> None:
            async with Client(metadata=cluster.metadata) as client:
                lh = await client.create_ledger(2, 2, 2, password=b"p")
                await lh.append(b"x")
                await lh.close()

        asyncio.run(asyncio.wait_for(use(), 120))
        cluster.stop()
        assert cluster.server_proc is None  # stopped after the bookies
        cluster.start_bookie(1)  # a bookie started alone brings its server back first
        assert cluster.server_proc is not None and cluster.server_proc.poll() is None


def test_direct_mode_is_asked_for(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "d", bookies=1, port_base=None, metadata_server=False) as cluster:
        assert cluster.server_proc is None
        assert live_socket(cluster.metadata.removeprefix("sqlite://")) is None
