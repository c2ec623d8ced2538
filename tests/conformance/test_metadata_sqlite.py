"""The MetadataStore conformance suite against the sqlite backend on a real database file."""

import contextlib
import sqlite3

import pytest

from ledgerstore.testing import MetadataStoreConformance
from ledgerstore_sqlite import SqliteMetadataStore


class TestSqliteMetadataStore(MetadataStoreConformance):
    @pytest.fixture
    def store_factory(self, tmp_path):
        return lambda: SqliteMetadataStore(f"sqlite://{tmp_path}/meta.db", session_ttl=2.0)

    @pytest.fixture
    def expire_session(self, tmp_path):
        async def expire(store: SqliteMetadataStore) -> None:
            # as another process's reaper does once the session's expiry time has passed
            with contextlib.closing(sqlite3.connect(f"{tmp_path}/meta.db")) as db, db:
                db.execute("DELETE FROM sessions WHERE id = ?", (store._session_id,))

        return expire
