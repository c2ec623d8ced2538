"""The sqlite metadata server (issue 15): one paused process must not freeze the cluster.

Real processes throughout: the server is ``ledgerstore metadata-server``, bookies are bookie
processes, the paused client is ``sqlite_client_proc.py`` stopping itself with SIGSTOP in the
middle of a write.

``LEDGERSTORE_TEST_SQLITE_DIRECT=1`` runs the headline test with the server bypassed (every
process opens the database file itself, the design before the server): it then fails, which is
the point of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ledgerstore.aio import Client as AioClient
from ledgerstore.api import NOT_EXISTS, EventType, Notification, SessionEvent
from ledgerstore.cluster import LocalCluster, start_metadata_server_process, stop_process
from ledgerstore.errors import MetadataError
from ledgerstore_sqlite import SqliteMetadataStore
from ledgerstore_sqlite.discovery import live_socket
from ledgerstore_sqlite.protocol import VERSION, decode_body, encode

DIRECT = os.environ.get("LEDGERSTORE_TEST_SQLITE_DIRECT") == "1"
CLIENT = Path(__file__).with_name("sqlite_client_proc.py")
#: how long another process's metadata write may take while a client is paused
WRITE_BOUND_S = 2.0
BOOKIE_TTL = 2.0
CLIENT_TTL = 2.0


class Client:
    """``sqlite_client_proc.py`` driven line by line."""

    def __init__(self, db: Path, mode: str, ttl: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CLIENT), str(db), mode, str(ttl)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.session = int(self.expect("ready").split()[1])

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the client printed no {prefix!r} line within {timeout}s") from None
            if line is None:
                raise AssertionError(f"client exited (code {self.proc.wait(10)}) before printing {prefix!r}")
            if line.startswith(prefix):
                return line.strip()

    def state(self) -> str:
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]

    def wait_stopped(self, timeout: float = 30.0) -> None:
        wait_until(lambda: self.state() == "T", timeout, "the client never stopped itself")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.send("quit")
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def read_db(db: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    """A read-only look at the file: WAL readers never wait for a writer, paused or not."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as conn:
        return conn.execute(sql, args).fetchall()


def session_expiry(db: Path, session: int) -> float | None:
    rows = read_db(db, "SELECT expires_at FROM sessions WHERE id = ?", session)
    return float(rows[0][0]) if rows else None  # type: ignore[arg-type]


def bookie_session(db: Path, bookie_id: str) -> int:
    rows = read_db(db, "SELECT session FROM kv WHERE session IS NOT NULL AND key LIKE ?", f"%{bookie_id}%")
    assert rows, f"bookie {bookie_id} holds no ephemeral registration"
    return int(rows[0][0])  # type: ignore[call-overload]


@pytest.fixture
def started() -> Iterator[list[Client]]:
    clients: list[Client] = []
    yield clients
    for c in clients:
        c.close()


class Server:
    """A database served by a real ``ledgerstore metadata-server`` process."""

    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "meta.db"
        self.log = tmp_path / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = start_metadata_server_process(self.db, self.log, extra_args=("--reap-interval", "0.1"))

    def kill(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGKILL)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.kill()


def test_a_client_paused_mid_write_freezes_no_other_process(cluster_factory, started: list[Client]) -> None:  # type: ignore[no-untyped-def]
    """A client SIGSTOPped in the middle of a metadata write: another client's writes and a
    bookie's session heartbeats keep succeeding within a short bound; the paused client's
    ephemeral key vanishes after its TTL (its session expired) and it gets a new session after
    SIGCONT; no acknowledged write is lost."""
    cluster: LocalCluster = cluster_factory(
        1, metadata_server=not DIRECT,
        extra_bookie_config=f"[bookie.metadata_options]\nsession_timeout = {BOOKIE_TTL}\n",
    )
    cluster.start()
    db = Path(cluster.metadata.removeprefix("sqlite://"))
    mode = "direct" if DIRECT else "server"
    paused = Client(db, mode, CLIENT_TTL)
    started.append(paused)
    bookie = bookie_session(db, cluster.bookie_id(0))

    async def main() -> None:
        other = SqliteMetadataStore(cluster.metadata, session_ttl=10, busy_timeout=WRITE_BOUND_S * 3,
                                    server="never" if DIRECT else "require")
        await other.start()
        acked: dict[str, int] = {}
        try:
            paused.send("pause")
            await asyncio.get_running_loop().run_in_executor(None, paused.wait_stopped)
            stopped_at = time.time()
            assert session_expiry(db, paused.session) is not None, "the session ended before its TTL"
            i = 0
            # Writes keep landing, and the bookie keeps renewing its session for longer than
            # its TTL, while the client stays stopped mid-write.
            while True:
                key = f"/other/k{i}"
                t0 = time.monotonic()
                try:
                    acked[key] = await asyncio.wait_for(other.put(key, b"v", NOT_EXISTS), WRITE_BOUND_S)
                except TimeoutError:
                    pytest.fail(f"a metadata write waited over {WRITE_BOUND_S}s behind the paused client")
                assert time.monotonic() - t0 < WRITE_BOUND_S
                i += 1
                renewed = session_expiry(db, bookie)
                assert renewed is not None, "the bookie's session expired while a client was paused"
                if renewed - BOOKIE_TTL > stopped_at + BOOKIE_TTL + 0.5 and i >= 10:
                    break
                assert time.time() < stopped_at + 4 * BOOKIE_TTL + 10, "the bookie stopped renewing its session"
                await asyncio.sleep(0.05)
            # The paused client's session expires after its TTL, taking its ephemeral key along.
            deadline = time.monotonic() + CLIENT_TTL + 10
            while await other.get("/client/eph") is not None:
                assert time.monotonic() < deadline, "a paused client's ephemeral key outlived its TTL"
                await asyncio.sleep(0.05)
            assert time.time() - stopped_at >= CLIENT_TTL * 0.9, "the ephemeral key vanished before the TTL"

            os.kill(paused.proc.pid, signal.SIGCONT)
            during = int(paused.expect("acked").split()[1])
            assert paused.expect("event") == f"event {SessionEvent.LOST.value}"
            assert paused.expect("event") == f"event {SessionEvent.RESTORED.value}"

            got = await other.get("/client/during")
            assert got is not None and got.version == during, "the paused client's acknowledged write is lost"
            assert await other.get("/client/before") is not None
            for key, version in acked.items():
                stored = await other.get(key)
                assert stored is not None and stored.version == version, f"acknowledged write {key} lost"
            assert cluster.registered() == {cluster.bookie_id(0)}
            assert bookie_session(db, cluster.bookie_id(0)) == bookie, "the bookie had to re-register"
        finally:
            os.kill(paused.proc.pid, signal.SIGCONT)
            await other.close()

    asyncio.run(main())


def test_a_paused_clients_ephemeral_key_vanishes_after_its_ttl(server: Server, started: list[Client]) -> None:
    db = server.db
    client = Client(db, "server", CLIENT_TTL)
    started.append(client)
    os.kill(client.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    wait_until(lambda: not read_db(db, "SELECT 1 FROM kv WHERE key = '/client/eph'"), CLIENT_TTL + 10,
               "a paused client's ephemeral key outlived its TTL")
    assert time.monotonic() - stopped_at >= CLIENT_TTL * 0.9
    os.kill(client.proc.pid, signal.SIGCONT)
    assert client.expect("event") == "event lost"
    assert client.expect("event") == "event restored"
    client.send("check")
    assert client.expect("eph") == "eph none"


def test_a_client_that_reconnects_within_its_ttl_keeps_its_session_and_ephemeral_key(server: Server, started: list[Client]) -> None:
    """kill -9 of the server, restart within the client's TTL: the client resumes its session (as
    a ZooKeeper client does after a connection loss), its ephemeral key never vanished, no session
    event fired, and every acknowledged write survived (WAL, synchronous=full)."""
    db = server.db
    ttl = 15.0
    client = Client(db, "server", ttl)
    started.append(client)
    version = read_db(db, "SELECT version FROM kv WHERE key = '/client/eph'")
    assert version

    async def main() -> None:
        store = SqliteMetadataStore(f"sqlite://{db}", session_ttl=ttl, server="require")
        events: list[SessionEvent] = []
        store.add_session_listener(events.append)
        await store.start()
        try:
            written = {f"/kept/{i}": await store.put(f"/kept/{i}", b"%d" % i, NOT_EXISTS) for i in range(20)}
            server.kill()
            with pytest.raises(MetadataError, match="metadata server"):
                await store.put("/kept/after-kill", b"x")
            server.start()
            deadline = time.monotonic() + ttl / 2
            while True:
                try:
                    got = await store.get("/kept/0")
                    break
                except MetadataError:
                    assert time.monotonic() < deadline, "the client did not reconnect to the restarted server"
                    await asyncio.sleep(0.05)
            assert got is not None
            for key, v in written.items():
                stored = await store.get(key)
                assert stored is not None and stored.version == v
            assert read_db(db, "SELECT version FROM kv WHERE key = '/client/eph'") == version
            client.send("check")
            assert client.expect("eph") == f"eph {version[0][0]}"
            assert events == []
        finally:
            await store.close()

    asyncio.run(main())


def test_bookies_and_clients_ride_out_a_kill_9_of_the_metadata_server(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the server and a restart within the session TTL: every bookie keeps its session
    and registration (resumed, not re-registered), a client's writes go on, and its ledger closes
    and reads back whole."""
    ttl = 15
    cluster: LocalCluster = cluster_factory(
        3, metadata_server=True, extra_bookie_config=f"[bookie.metadata_options]\nsession_timeout = {ttl}\n",
    )
    cluster.start()
    db = Path(cluster.metadata.removeprefix("sqlite://"))
    sessions = {cluster.bookie_id(i): bookie_session(db, cluster.bookie_id(i)) for i in range(3)}

    async def main() -> None:
        async with AioClient(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            payloads = [b"entry-%d" % i for i in range(200)]
            for p in payloads[:100]:
                await lh.append(p)
            cluster.stop_metadata_server(signal.SIGKILL)
            with pytest.raises(MetadataError):
                await client.store.get("/")
            cluster.start_metadata_server()
            for p in payloads[100:]:
                await lh.append(p)  # adds need no metadata
            deadline = time.monotonic() + ttl / 2
            while True:
                try:
                    await client.store.get("/")
                    break
                except MetadataError:
                    assert time.monotonic() < deadline, "the client did not reconnect to the restarted server"
                    await asyncio.sleep(0.05)
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, rh.last_add_confirmed)] == payloads
        assert cluster.registered() == set(sessions)
        assert {b: bookie_session(db, b) for b in sessions} == sessions, "a bookie lost its session"

    asyncio.run(main())


def test_a_watch_misses_no_change_made_while_its_server_was_down(server: Server) -> None:
    """Changes committed while the client was cut off from the server (here: by a process that
    opened the file itself meanwhile) are delivered after the reconnect, in commit order."""

    async def main() -> None:
        watcher = SqliteMetadataStore(f"sqlite://{server.db}", session_ttl=15, server="require")
        await watcher.start()
        seen: list[Notification] = []
        events: list[SessionEvent] = []
        watcher.add_session_listener(events.append)
        try:
            await watcher.watch("/w", seen.append)
            await watcher.put("/w/first", b"1")
            await wait_for(lambda: len(seen) == 1)
            server.kill()
            offline = SqliteMetadataStore(f"sqlite://{server.db}", server="never")
            await offline.start()
            await offline.put("/w/a", b"x")
            await offline.put("/w/b", b"y")
            await offline.delete("/w/a")
            await offline.put("/elsewhere", b"z")
            await offline.close()
            server.start()
            await wait_for(lambda: len(seen) == 4, timeout=15)
            assert seen == [
                Notification(EventType.CREATED, "/w/first"),
                Notification(EventType.CREATED, "/w/a"),
                Notification(EventType.CREATED, "/w/b"),
                Notification(EventType.DELETED, "/w/a"),
            ]
            await watcher.put("/w/after", b"2")
            await wait_for(lambda: len(seen) == 5)
            assert seen[-1] == Notification(EventType.CREATED, "/w/after")
            assert events == []
        finally:
            await watcher.close()

    asyncio.run(main())


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _frame(payload: bytes, version: int = VERSION) -> bytes:
    return struct.pack(">IB", len(payload) + 1, version) + payload


def _answer(sock: socket.socket) -> dict[str, object]:
    header = sock.recv(4, socket.MSG_WAITALL)
    (length,) = struct.unpack(">I", header)
    return decode_body(sock.recv(length, socket.MSG_WAITALL))


def test_bad_frames_get_a_clear_error_and_the_server_keeps_serving(server: Server) -> None:
    db = server.db
    path = live_socket(str(db))
    assert path is not None
    with socket.socket(socket.AF_UNIX) as bad, socket.socket(socket.AF_UNIX) as good:
        bad.connect(path)
        good.connect(path)
        bad.sendall(_frame(b'{"id": 1, "op": "hello"}', version=VERSION + 1))
        answer = _answer(bad)
        assert answer["error"] == "protocol" and "version" in str(answer["message"])
        bad.sendall(_frame(b"not json"))
        assert _answer(bad)["error"] == "protocol"
        bad.sendall(encode({"id": 2, "op": "get", "key": "/x"}))
        answer = _answer(bad)
        assert answer["id"] == 2 and "hello" in str(answer["message"])  # still served, in order
        good.sendall(encode({"id": 1, "op": "hello", "ttl": 5}))
        assert "session" in _answer(good)["result"]  # type: ignore[operator]
        bad.sendall(struct.pack(">I", 2**31))  # a length past the limit: refused, then hung up
        assert _answer(bad)["error"] == "protocol"
        assert bad.recv(1) == b""
        good.sendall(encode({"id": 2, "op": "put", "key": "/x", "value": "eA=="}))
        assert isinstance(_answer(good)["result"], int)


def test_kill_9_of_the_standalone_leaves_no_metadata_server(tmp_path: Path) -> None:
    data = tmp_path / "d"
    proc = subprocess.Popen([sys.executable, "-m", "ledgerstore", "standalone", "--data-dir", str(data),
                             "--bookies", "1", "--port-base", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if "serving" in line:
                break
        db = str(data.resolve() / "metadata.db")
        assert live_socket(db) is not None, "the standalone runs no metadata server"
        proc.kill()
        proc.wait(30)
        wait_until(lambda: live_socket(db) is None, 30, "the metadata server outlived the standalone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_pipelined_writes_share_the_servers_commits_and_a_read_after_them_sees_them(server: Server) -> None:
    """A client's puts and deletes sent back to back are handled together by the server (one
    group commit), each answered with its own outcome: a failed compare-and-set fails alone. A
    read sent after them on the same connection is answered after them, and sees them all."""
    from ledgerstore.api import NOT_EXISTS
    from ledgerstore.errors import BadVersionError, KeyExistsError

    async def main() -> None:
        store = SqliteMetadataStore(f"sqlite://{server.db}", server="require")
        await store.start()
        try:
            await store.put("/p/taken", b"first")
            await store.put("/p/gone", b"x")
            results = await asyncio.gather(
                *(store.put(f"/p/k{i}", b"%d" % i) for i in range(200)),
                store.put("/p/taken", b"second", NOT_EXISTS),
                store.delete("/p/gone"),
                store.children("/p"),
                return_exceptions=True)
            assert all(isinstance(r, int) for r in results[:200]) and len(set(results[:200])) == 200
            assert isinstance(results[200], KeyExistsError)
            assert results[201] is None
            assert results[202] == sorted([f"k{i}" for i in range(200)] + ["taken"])
            with pytest.raises(BadVersionError):
                await store.put("/p/k0", b"stale", 1)
            assert (await store.get("/p/taken")).value == b"first"  # type: ignore[union-attr]
        finally:
            await store.close()

    asyncio.run(main())
