"""The MetadataStore conformance suite against a real etcd server."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
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
