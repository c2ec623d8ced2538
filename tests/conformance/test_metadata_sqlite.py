"""The MetadataStore conformance suite against the sqlite backend on a real database file."""

import pytest

from ledgerstore.testing import MetadataStoreConformance
from ledgerstore_sqlite import SqliteMetadataStore


class TestSqliteMetadataStore(MetadataStoreConformance):
    @pytest.fixture
    def store_factory(self, tmp_path):
        return lambda: SqliteMetadataStore(f"sqlite://{tmp_path}/meta.db", session_ttl=2.0)
