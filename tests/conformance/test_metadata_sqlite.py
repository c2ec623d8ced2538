"""The MetadataStore conformance suite against the sqlite backend on a real database file:
once opening the file directly, once through a real ``ledgerstore metadata-server`` process."""

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerstore.cluster import start_metadata_server_process, stop_process
from ledgerstore.testing import MetadataStoreConformance
from ledgerstore_sqlite import SqliteMetadataStore


def _delete_session_row(db: Path, session: int | None) -> None:
    # as a reaper does once the session's expiry time has passed
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DELETE FROM sessions WHERE id = ?", (session,))


class TestSqliteMetadataStore(MetadataStoreConformance):
    @pytest.fixture
    def store_factory(self, tmp_path):
        return lambda: SqliteMetadataStore(f"sqlite://{tmp_path}/meta.db", session_ttl=2.0, server="never")

    @pytest.fixture
    def expire_session(self, tmp_path):
        async def expire(store: SqliteMetadataStore) -> None:
            _delete_session_row(tmp_path / "meta.db", store._session_id)

        return expire


class TestSqliteMetadataStoreThroughServer(MetadataStoreConformance):
    @pytest.fixture
    def server(self, tmp_path: Path) -> Iterator[Path]:
        db = tmp_path / "meta.db"
        proc = start_metadata_server_process(db, tmp_path / "server.log", extra_args=("--reap-interval", "0.1"))
        try:
            yield db
        finally:
            stop_process(proc)

    @pytest.fixture
    def store_factory(self, server: Path):
        return lambda: SqliteMetadataStore(f"sqlite://{server}", session_ttl=2.0, server="require")

    @pytest.fixture
    def expire_session(self, server: Path):
        async def expire(store: SqliteMetadataStore) -> None:
            assert store._remote is not None, "the store did not go through the server"
            _delete_session_row(server, store._remote.session)

        return expire
