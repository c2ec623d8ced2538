"""The MetadataStore conformance suite against a real etcd server."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import grpc
import pytest
from aetcd import rpc

from ledgerstore.testing import MetadataStoreConformance
from ledgerstore_etcd import EtcdMetadataStore

if TYPE_CHECKING:
    from ledgerstore.testing.servers import EtcdServer

pytest_plugins = ["ledgerstore.testing.servers"]


class TestEtcdMetadataStore(MetadataStoreConformance):
    #: close() revokes the lease, so keys vanish at once; the TTL bounds the worst case
    ephemeral_timeout = 10.0

    @pytest.fixture
    def store_factory(self, etcd_server: EtcdServer):
        # A fresh prefix per test: tests share the session-scoped server but never each other's keys.
        uri = etcd_server.uri(f"/conformance-{uuid.uuid4().hex[:12]}")
        return lambda: EtcdMetadataStore(uri, lease_ttl=3)

    @pytest.fixture
    def expire_session(self, etcd_server: EtcdServer):
        async def expire(store: EtcdMetadataStore) -> None:
            # revoke the store's lease from another connection, as the server does at its TTL
            assert store.lease_id is not None
            async with grpc.aio.insecure_channel(f"127.0.0.1:{etcd_server.port}") as channel:
                await rpc.LeaseStub(channel).LeaseRevoke(rpc.LeaseRevokeRequest(ID=store.lease_id), timeout=10)

        return expire


def test_children_pages_skip_subtrees_without_losing_siblings(etcd_server: EtcdServer, monkeypatch) -> None:
    """children() pages through keys and jumps over each child's subtree; tiny pages make every
    page boundary fall somewhere interesting (inside a subtree, on a leaf followed by a sibling
    that sorts between the leaf and its subtree, ...)."""
    import ledgerstore_etcd.store as etcd_store
    from ledgerstore.testing.metadata import run

    keys = ["/p/a", "/p/a!", "/p/a.b", *[f"/p/a/x/{i}" for i in range(12)], "/p/a0", "/p/b/c/d",
            "/p/b", "/p/c", *[f"/p/c/{i}" for i in range(7)], "/p/d!x", "/pz/outside", "/p"]
    expected = sorted({k[len("/p/"):].split("/")[0] for k in keys if k.startswith("/p/")})

    async def main() -> None:
        store = EtcdMetadataStore(etcd_server.uri(f"/paging-{uuid.uuid4().hex[:12]}"), lease_ttl=3)
        await store.start()
        try:
            for k in keys:
                await store.put(k, b"v")
            for page in (1, 2, 3, 5, 1000):
                monkeypatch.setattr(etcd_store, "_PAGE", page)
                assert await store.children("/p") == expected, page
        finally:
            await store.close()

    run(main())
