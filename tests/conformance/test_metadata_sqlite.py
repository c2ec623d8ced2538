"""The MetadataStore conformance suite against the sqlite backend on a real database file:
once opening the file directly, once through a real ``ledgerstore metadata-server`` process's
Unix socket, once through its TCP listener (``sqlite+tcp://``, with a secret file)."""

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerstore.cluster import start_metadata_server_process, stop_process
from ledgerstore.testing import MetadataStoreConformance
from ledgerstore_sqlite import SqliteMetadataStore
from tests.unit.test_sqlite_tcp import TcpServer, write_secret


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

    def test_a_client_paused_mid_write_blocks_no_other_store(self, server: Path, store_factory) -> None:  # type: ignore[no-untyped-def]
        """A client process stopped (SIGSTOP) in the middle of a write through the server holds no
        lock anyone waits for: a store of this suite keeps writing and reading, each call within a
        short bound, for longer than the paused client's TTL."""
        from ledgerstore.api import NOT_EXISTS
        from tests.integration.test_sqlite_server import Client as ClientProcess

        paused = ClientProcess(server, "server", 2.0)

        async def main() -> None:
            store = store_factory()
            await store.start()
            try:
                paused.send("pause")
                await asyncio.get_running_loop().run_in_executor(None, paused.wait_stopped)
                loop = asyncio.get_running_loop()
                until = loop.time() + 3.0  # past the paused client's 2 s TTL
                i = 0
                while loop.time() < until or i < 10:
                    version = await asyncio.wait_for(store.put(f"/suite/k{i}", b"v", NOT_EXISTS), 2.0)
                    got = await asyncio.wait_for(store.get(f"/suite/k{i}"), 2.0)
                    assert got is not None and got.version == version
                    i += 1
                    await asyncio.sleep(0.05)
            finally:
                await store.close()

        try:
            asyncio.run(main())
        finally:
            paused.close()


class TestSqliteMetadataStoreOverTcp(MetadataStoreConformance):
    @pytest.fixture
    def server(self, tmp_path: Path) -> Iterator[TcpServer]:
        srv = TcpServer(tmp_path, write_secret(tmp_path / "secret"), "--reap-interval", "0.1")
        try:
            yield srv
        finally:
            srv.stop()

    @pytest.fixture
    def store_factory(self, server: TcpServer, tmp_path: Path):
        return lambda: SqliteMetadataStore(server.uri, secret_file=str(tmp_path / "secret"), session_ttl=2.0)

    @pytest.fixture
    def expire_session(self, server: TcpServer):
        async def expire(store: SqliteMetadataStore) -> None:
            assert store._remote is not None, "the store did not go through the server"
            _delete_session_row(server.db, store._remote.session)

        return expire
