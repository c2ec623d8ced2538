"""A session of the sqlite metadata server stays alive under a deep queue of writes.

Like a ZooKeeper session, a client's session lives while the client is connected and the server
makes progress, however many of its writes wait for the server's one writer (an fsync each): its
heartbeats are answered without waiting behind them, and a client hears the server alive from any
answer, not from its ping alone. Against a real ``ledgerstore metadata-server`` process, reached
over its Unix socket and over TCP with a secret file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerstore.api import SessionEvent
from ledgerstore.cluster import start_metadata_server_process, stop_process
from ledgerstore.testing.metadata import run
from ledgerstore_sqlite import SqliteMetadataStore
from tests.unit.test_sqlite_tcp import TcpServer, write_secret

#: the session TTL under test: a few hundred fsyncs in a row take longer than this
TTL = 2.0
#: writes kept in flight at once: more than the server commits in two thirds of the TTL
IN_FLIGHT = 1024


@pytest.fixture(params=["unix", "tcp"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    """A store with a 2 s session on a real metadata server, through its Unix socket or over TCP."""
    if request.param == "tcp":
        secret = write_secret(tmp_path / "secret")
        server = TcpServer(tmp_path, secret)
        try:
            yield SqliteMetadataStore(server.uri, secret_file=str(secret), session_ttl=TTL)
        finally:
            server.stop()
    else:
        db = tmp_path / "meta.db"
        proc = start_metadata_server_process(db, tmp_path / "server.log")
        try:
            yield SqliteMetadataStore(f"sqlite://{db}", server="require", session_ttl=TTL)
        finally:
            stop_process(proc)


def test_a_session_outlives_its_ttl_while_hundreds_of_its_writes_wait_for_the_writer(
        client: SqliteMetadataStore) -> None:
    async def main() -> None:
        events: list[SessionEvent] = []
        client.add_session_listener(events.append)
        await client.start()
        try:
            await client.put_ephemeral("/deep/alive", b"mine")
            session = client._session_id
            writes = 0
            started = time.monotonic()

            async def writer(n: int) -> None:
                nonlocal writes
                i = n
                while time.monotonic() - started < 3 * TTL or i < 2 * IN_FLIGHT:
                    await client.put(f"/deep/k{i}", b"x" * 64)
                    writes += 1
                    i += IN_FLIGHT

            await asyncio.gather(*(writer(n) for n in range(IN_FLIGHT)))
            assert writes >= 2 * IN_FLIGHT
            assert events == [], f"the session was dropped under load: {events}"
            assert client._session_id == session
            got = await client.get("/deep/alive")
            assert got is not None and got.value == b"mine", "the session's ephemeral key was removed"
            assert len(await client.children("/deep")) == writes + 1
        finally:
            await client.close()

    run(main(), timeout=120)
