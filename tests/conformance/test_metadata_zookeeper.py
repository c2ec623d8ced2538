"""The MetadataStore conformance suite against a real ZooKeeper server."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import pytest
from kazoo.client import KazooClient

from ledgerstore.testing import MetadataStoreConformance
from ledgerstore_zookeeper import ZooKeeperMetadataStore

if TYPE_CHECKING:
    from ledgerstore.testing.servers import ZooKeeperServer

pytest_plugins = ["ledgerstore.testing.servers"]


class TestZooKeeperMetadataStore(MetadataStoreConformance):
    #: the session timeout below, plus slack for the server's expiry tick
    ephemeral_timeout = 10.0

    @pytest.fixture
    def store_factory(self, zookeeper_server: ZooKeeperServer):
        # A fresh root per test: tests share the session-scoped server but never each other's keys.
        uri = zookeeper_server.uri(f"/conformance-{uuid.uuid4().hex[:12]}")
        return lambda: ZooKeeperMetadataStore(uri, session_timeout=2.0)

    @pytest.fixture
    def expire_session(self):
        def close_same_session(store: ZooKeeperMetadataStore) -> None:
            # a second client on the same session id and password closes the session: the server
            # expires it as it does when a client stays away past the timeout (kazoo's own harness)
            other = KazooClient(hosts=store.hosts, client_id=store.client.client_id)
            other.start(timeout=15)
            other.stop()
            other.close()

        async def expire(store: ZooKeeperMetadataStore) -> None:
            await asyncio.to_thread(close_same_session, store)

        return expire
