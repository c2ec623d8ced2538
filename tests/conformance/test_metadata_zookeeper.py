"""The MetadataStore conformance suite against a real ZooKeeper server."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

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
