"""The Python client on a URI that holds no cluster: the same one-line NoClusterError as the
shell, naming ``initnewcluster``, and nothing created there (no sqlite file or folder, no znode,
no etcd key), for the sync and the asyncio client, on real ZooKeeper and etcd servers."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

import ledgerstore
from ledgerstore import aio
from ledgerstore.errors import NoClusterError
from ledgerstore.meta.bookies import ClusterManager
from ledgerstore.plugins import create_metadata_store


def _refused(uri: str) -> list[str]:
    """Messages of the sync and the asyncio client refusing ``uri``."""
    messages = []
    with pytest.raises(NoClusterError) as sync_error:
        ledgerstore.Client(metadata=uri)
    messages.append(str(sync_error.value))

    async def aio_client() -> None:
        async with aio.Client(metadata=uri) as client:
            await client.create_ledger(3, 2, 2, password=b"pw")

    with pytest.raises(NoClusterError) as aio_error:
        asyncio.run(aio_client())
    messages.append(str(aio_error.value))
    for m in messages:
        assert "no cluster is initialised at " + uri in m and "initnewcluster" in m and "\n" not in m, m
    return messages


async def _children_of(parent_uri: str) -> list[str]:
    """What lies under ``parent_uri`` (the URI the client used is one level below it)."""
    store = create_metadata_store(parent_uri)
    await store.start()
    try:
        return await store.children("/")
    finally:
        await store.close()


def test_sqlite_uri_without_a_cluster_is_refused_and_no_file_or_folder_is_made(tmp_path: Path) -> None:
    folder = tmp_path / "typo-dir"
    uri = f"sqlite://{folder / 'metadata.db'}"
    _refused(uri)
    assert not folder.exists()


@pytest.mark.parametrize("backend", ["zk", "etcd"])
def test_a_server_uri_without_a_cluster_is_refused_and_no_key_is_made(request: pytest.FixtureRequest,
                                                                      backend: str) -> None:
    server = request.getfixturevalue("zookeeper_server" if backend == "zk" else "etcd_server")
    parent = f"/probe-{uuid.uuid4().hex[:10]}"
    uri = server.uri(f"{parent}/ledgers")
    _refused(uri)
    assert asyncio.run(_children_of(server.uri(parent))) == [], "the client created keys where no cluster was"

    async def init() -> None:  # once created, the same URI is a cluster the client joins
        store = create_metadata_store(uri)
        await store.start()
        try:
            await ClusterManager(store).init()
        finally:
            await store.close()
        async with aio.Client(metadata=uri) as client:
            assert await client.list_bookies() == []

    asyncio.run(init())
