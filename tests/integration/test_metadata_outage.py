"""A metadata-server outage corrupts nothing: while ZooKeeper/etcd is frozen, writes to open
ledgers go on and metadata operations wait; after it returns, the cluster carries on."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.meta.ledgers import LedgerState
from tests.conftest import ClusterConfig

OUTAGE_S = 4.0


@pytest.mark.parametrize("backend", ["zk", "etcd"])
def test_cluster_carries_on_after_a_metadata_outage(cluster_factory, request, backend: str) -> None:  # type: ignore[no-untyped-def]
    server = request.getfixturevalue("zookeeper_server" if backend == "zk" else "etcd_server")
    cluster: LocalCluster = cluster_factory(3, ClusterConfig(backend, "entrylog", "tcp"))
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            await asyncio.gather(*(lh.append_async(b"before %d" % i) for i in range(100)))
            os.kill(server.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                # data path: adds to an open ledger need no metadata
                await asyncio.gather(*(lh.append_async(b"during %d" % i) for i in range(100)))
                # metadata path: waits for the store instead of failing or corrupting anything
                pending = asyncio.create_task(client.create_ledger(3, 2, 2, password=b"pw"))
                await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - t0)))
                assert not pending.done(), "a metadata write completed while the metadata server was frozen"
            finally:
                os.kill(server.pid, signal.SIGCONT)
            second = await asyncio.wait_for(pending, 60)
            await second.append(b"after")
            await second.close()
            await lh.close()
            md = await client.ledger_metadata(lh.ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 199
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            got = [e.payload for e in await rh.read(0, 199)]
            assert got == [b"before %d" % i for i in range(100)] + [b"during %d" % i for i in range(100)]
            assert {b.bookie_id for b in await client.list_bookies()} == {cluster.bookie_id(i) for i in range(3)}
            third = await client.create_ledger(3, 2, 2)
            assert third.ledger_id > second.ledger_id

    asyncio.run(asyncio.wait_for(main(), 180))
