"""The sqlite metadata backend with real processes sharing one database file.

Child processes are real interpreters started with ``python -c``; fault tests kill or stop them
by PID with real signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from ledgerstore.api import EventType, Notification
from ledgerstore.errors import ConfigError, MetadataError
from ledgerstore.testing.metadata import run, wait_until
from ledgerstore_sqlite import SqliteMetadataStore, path_from_uri
from ledgerstore_sqlite import schema as sqlite_schema

# Holds an ephemeral key until killed; on a new session it re-registers the key, as owners must.
EPHEMERAL_HOLDER = """
import asyncio, sys
from ledgerstore_sqlite import SqliteMetadataStore

async def main(uri, key, ttl):
    store = SqliteMetadataStore(uri, session_ttl=float(ttl))
    await store.start()
    tasks = []

    def on_session(event):
        print("session", event, flush=True)
        if event == "restored":
            tasks.append(asyncio.get_running_loop().create_task(store.put_ephemeral(key, b"again")))

    store.add_session_listener(on_session)
    await store.put_ephemeral(key, b"alive")
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""

# Allocates ids once told to go, so that two allocators run at the same time.
ID_ALLOCATOR = """
import asyncio, json, sys
from ledgerstore_sqlite import SqliteMetadataStore

async def main(uri, count):
    store = SqliteMetadataStore(uri)
    await store.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    ids = [await store.next_id("ledger") for _ in range(int(count))]
    await store.close()
    print(json.dumps(ids), flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


async def spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def read_line(proc: asyncio.subprocess.Process, timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    assert line, f"child {proc.pid} exited (code {await proc.wait()}) before writing a line"
    return line.decode().strip()


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        os.kill(proc.pid, signal.SIGCONT)  # a stopped child must run to die of SIGKILL promptly
        os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/meta.db"


def test_ephemeral_key_of_a_killed_process_vanishes_with_a_deleted_notification(uri: str) -> None:
    child_ttl = 2.0

    async def main() -> float:
        observer = SqliteMetadataStore(uri, session_ttl=1.0)
        await observer.start()
        seen: list[Notification] = []
        child = await spawn(EPHEMERAL_HOLDER, uri, "/bookies/b1", str(child_ttl))
        try:
            await observer.watch("/bookies", seen.append)
            assert await read_line(child) == "ready"
            got = await observer.get("/bookies/b1")
            assert got is not None and got.value == b"alive"
            loop = asyncio.get_running_loop()
            os.kill(child.pid, signal.SIGKILL)
            killed_at = loop.time()
            await child.wait()
            await wait_until(
                lambda: any(n == Notification(EventType.DELETED, "/bookies/b1") for n in seen),
                timeout=child_ttl + 5.0,
            )
            elapsed = loop.time() - killed_at
            assert await observer.get("/bookies/b1") is None
            assert await observer.children("/bookies") == []
            return elapsed
        finally:
            await stop(child)
            await observer.close()

    elapsed = run(main())
    assert elapsed <= child_ttl + 2.0, f"key outlived its dead owner by {elapsed:.2f}s (ttl {child_ttl}s)"


def test_stalled_process_loses_its_session_and_re_registers_on_restore(uri: str) -> None:
    async def main() -> None:
        observer = SqliteMetadataStore(uri, session_ttl=0.6)
        await observer.start()
        child = await spawn(EPHEMERAL_HOLDER, uri, "/bookies/b2", "1.0")
        try:
            assert await read_line(child) == "ready"
            os.kill(child.pid, signal.SIGSTOP)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while await observer.get("/bookies/b2") is not None:
                assert loop.time() < deadline, "the stalled process's session was never reaped"
                await asyncio.sleep(0.05)
            os.kill(child.pid, signal.SIGCONT)
            assert await read_line(child) == "session lost"
            assert await read_line(child) == "session restored"
            deadline = loop.time() + 10
            while (got := await observer.get("/bookies/b2")) is None:
                assert loop.time() < deadline, "the owner did not re-register after restore"
                await asyncio.sleep(0.05)
            assert got.value == b"again"
        finally:
            await stop(child)
            await observer.close()

    run(main())


def test_two_processes_allocate_unique_ids(uri: str) -> None:
    async def main() -> list[list[int]]:
        children = [await spawn(ID_ALLOCATOR, uri, "500") for _ in range(2)]
        try:
            for child in children:
                assert await read_line(child) == "ready"
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                await child.stdin.drain()
            return [json.loads(await read_line(child, timeout=120)) for child in children]
        finally:
            for child in children:
                await stop(child)

    first, second = run(main(), timeout=180)
    assert len(first) == len(second) == 500
    assert first == sorted(first) and second == sorted(second)
    assert sorted(first + second) == list(range(1, 1001))


def test_processes_creating_the_database_at_once_all_start(uri: str) -> None:
    async def main() -> list[str]:
        children = [await spawn(EPHEMERAL_HOLDER, uri, f"/starters/s{i}", "10") for i in range(4)]
        try:
            answers = [await read_line(child) for child in children]
            observer = SqliteMetadataStore(uri)
            await observer.start()
            try:
                assert await observer.children("/starters") == ["s0", "s1", "s2", "s3"]
            finally:
                await observer.close()
            return answers
        finally:
            for child in children:
                await stop(child)

    assert run(main()) == ["ready"] * 4


def test_non_sqlite_file_is_a_clear_metadata_error(tmp_path: Path) -> None:
    bogus = tmp_path / "meta.db"
    content = b"this is a ledger dump, not a database\n" * 200
    bogus.write_bytes(content)
    store = SqliteMetadataStore(f"sqlite://{bogus}")
    with pytest.raises(MetadataError) as err:
        run(store.start())
    assert str(bogus) in str(err.value)
    assert "not a database" in str(err.value)
    assert bogus.read_bytes() == content
    run(store.close())


def test_directory_instead_of_file_is_a_metadata_error(tmp_path: Path) -> None:
    store = SqliteMetadataStore(f"sqlite://{tmp_path}")
    with pytest.raises(MetadataError, match=str(tmp_path)):
        run(store.start())


def test_watch_matches_on_path_boundaries(uri: str) -> None:
    async def main() -> list[Notification]:
        watcher, writer = SqliteMetadataStore(uri), SqliteMetadataStore(uri)
        await watcher.start()
        await writer.start()
        seen: list[Notification] = []
        try:
            await watcher.watch("/w", seen.append)
            await writer.put("/wx", b"1")
            await writer.put("/wx/a", b"1")
            await writer.put("/w", b"1")
            await writer.put("/w/a", b"1")
            await wait_until(lambda: any(n.key == "/w/a" for n in seen))
            return seen
        finally:
            await watcher.close()
            await writer.close()

    seen = run(main())
    assert seen == [Notification(EventType.CREATED, "/w"), Notification(EventType.CREATED, "/w/a")]


def test_close_removes_ephemeral_keys_and_session_at_once(uri: str, tmp_path: Path) -> None:
    async def main() -> None:
        owner, observer = SqliteMetadataStore(uri), SqliteMetadataStore(uri)
        await owner.start()
        await observer.start()
        seen: list[Notification] = []
        try:
            await observer.watch("/e", seen.append)
            await owner.put_ephemeral("/e/k", b"x")
            await owner.close()
            # No waiting for expiry (session_ttl is 10 s): close() deleted the key itself.
            assert await observer.get("/e/k") is None
            await wait_until(lambda: Notification(EventType.DELETED, "/e/k") in seen)
        finally:
            await observer.close()

    run(main())
    with contextlib.closing(sqlite3.connect(tmp_path / "meta.db")) as db:
        assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


def test_put_ephemeral_takes_over_a_key_and_plain_put_keeps_the_owner(uri: str) -> None:
    async def main() -> None:
        a, b = SqliteMetadataStore(uri), SqliteMetadataStore(uri)
        await a.start()
        await b.start()
        try:
            await a.put("/k/persistent", b"p")
            await b.put_ephemeral("/k/persistent", b"now ephemeral")
            await a.put_ephemeral("/k/owned-by-a", b"a")
            await b.put("/k/owned-by-a", b"updated by b")
            await a.close()
            assert await b.get("/k/owned-by-a") is None
            got = await b.get("/k/persistent")
            assert got is not None and got.value == b"now ephemeral"
        finally:
            await b.close()
            await a.close()
        c = SqliteMetadataStore(uri)
        await c.start()
        try:
            assert await c.get("/k/persistent") is None
        finally:
            await c.close()

    run(main())


def test_versions_come_from_one_growing_revision_and_are_never_reused(uri: str) -> None:
    async def main() -> list[int]:
        s = SqliteMetadataStore(uri)
        await s.start()
        try:
            v1 = await s.put("/v/a", b"1")
            v2 = await s.put("/v/b", b"1")
            await s.delete("/v/a")
            v3 = await s.put("/v/a", b"again")
            return [v1, v2, v3]
        finally:
            await s.close()

    v1, v2, v3 = run(main())
    assert v1 < v2 < v3 and v3 > v2 + 1  # the delete took a revision too


def test_children_skip_deep_subtrees_and_read_flat_ones_in_batches(uri: str) -> None:
    async def main() -> tuple[list[str], list[str], list[str]]:
        s = SqliteMetadataStore(uri)
        await s.start()
        try:
            for i in range(600):
                await s.put(f"/flat/n{i:04d}", b"")
            for i in range(300):
                await s.put(f"/mixed/a/deep/{i}", b"")
            for k in ["/mixed/a", "/mixed/a!b", "/mixed/a0", "/mixed/b/c", "/mixedx/z"]:
                await s.put(k, b"")
            return await s.children("/flat"), await s.children("/mixed"), await s.children("/")
        finally:
            await s.close()

    flat, mixed, root = run(main())
    assert flat == [f"n{i:04d}" for i in range(600)]
    assert mixed == ["a", "a!b", "a0", "b"]
    assert root == ["flat", "mixed", "mixedx"]


def test_delete_recursive_is_bounded_by_path_and_notifies_each_key(uri: str) -> None:
    async def main() -> tuple[list[Notification], list[str]]:
        s = SqliteMetadataStore(uri)
        await s.start()
        seen: list[Notification] = []
        try:
            for k in ["/t", "/t/a", "/t/a/b", "/tx"]:
                await s.put(k, b"")
            await s.watch("/", seen.append)
            await s.delete_recursive("/t")
            await wait_until(lambda: len(seen) >= 3)
            return seen, await s.children("/")
        finally:
            await s.close()

    seen, root = run(main())
    assert sorted(n.key for n in seen) == ["/t", "/t/a", "/t/a/b"]
    assert all(n.type is EventType.DELETED for n in seen)
    assert root == ["tx"]


def test_heartbeat_prunes_the_change_table(uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_schema, "CHANGE_RETENTION_ROWS", 10)

    def change_rows() -> int:
        with contextlib.closing(sqlite3.connect(tmp_path / "meta.db")) as db:
            return int(db.execute("SELECT count(*) FROM changes").fetchone()[0])

    def revisions() -> tuple[int, int]:
        with contextlib.closing(sqlite3.connect(tmp_path / "meta.db")) as db:
            low, high = db.execute("SELECT min(revision), max(revision) FROM changes").fetchone()
            return int(low), int(high)

    async def main() -> None:
        s = SqliteMetadataStore(uri, session_ttl=0.3)
        await s.start()
        try:
            for i in range(50):
                await s.put(f"/p/{i}", b"")
            # every change was recorded (a heartbeat may already have pruned some on a slow machine)
            first, last = revisions()
            assert last - first + 1 == change_rows() and last >= 50
            await wait_until(lambda: change_rows() <= 10, timeout=10)
            # the oldest went, the newest stayed
            assert revisions()[1] == last and revisions()[0] > last - 10
        finally:
            await s.close()

    run(main())


def test_uri_paths_and_parent_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert path_from_uri("sqlite:///tmp/x.db") == "/tmp/x.db"
    monkeypatch.chdir(tmp_path)
    assert path_from_uri("sqlite://rel/x.db") == str(tmp_path / "rel" / "x.db")
    store = SqliteMetadataStore("sqlite://rel/deeper/meta.db")
    run(store.start())
    run(store.close())
    assert (tmp_path / "rel" / "deeper" / "meta.db").is_file()
    with pytest.raises(ConfigError, match="sqlite://"):
        SqliteMetadataStore("zk://127.0.0.1:2181/x")
    with pytest.raises(ConfigError, match="session_tll"):
        SqliteMetadataStore("sqlite:///tmp/x.db", session_tll=3)
    with pytest.raises(ConfigError, match="poll_interval"):
        SqliteMetadataStore("sqlite:///tmp/x.db", poll_interval="soon")


def test_use_before_start_and_after_close_is_a_metadata_error(uri: str) -> None:
    async def main() -> None:
        s = SqliteMetadataStore(uri)
        with pytest.raises(MetadataError, match="not started"):
            await s.get("/a")
        await s.start()
        await s.close()
        with pytest.raises(MetadataError, match="closed"):
            await s.put("/a", b"")

    run(main())


# --- the metadata server's frames: pure functions over bytes, no socket -------------------------


def test_a_frame_round_trips_with_its_length_and_version() -> None:
    from ledgerstore_sqlite import protocol

    message = {"id": 7, "op": "put", "key": "/a", "value": protocol.encode_value(b"\x00\xffbytes")}
    frame = protocol.encode(message)
    assert protocol.frame_length(frame[:4]) == len(frame) - 4
    assert frame[4] == protocol.VERSION
    decoded = protocol.decode_body(frame[4:])
    assert decoded == message
    assert protocol.decode_value(decoded["value"]) == b"\x00\xffbytes"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (bytes([99]) + b"{}", "version 99"),
        (bytes([1]) + b"\xff\xfe", "not UTF-8 JSON"),
        (bytes([1]) + b"[1, 2]", "not an object"),
    ],
)
def test_a_bad_frame_body_is_refused_with_a_clear_error(payload: bytes, words: str) -> None:
    from ledgerstore_sqlite import protocol

    with pytest.raises(protocol.FrameError, match=words):
        protocol.decode_body(payload)


@pytest.mark.parametrize("length", [0, 64 * 1024 * 1024 + 1, 2**32 - 1])
def test_a_frame_length_outside_the_limit_is_refused(length: int) -> None:
    from ledgerstore_sqlite import protocol

    with pytest.raises(protocol.FrameError, match="outside"):
        protocol.frame_length(length.to_bytes(4, "big"))


def test_every_error_crosses_the_wire_as_its_own_class() -> None:
    from ledgerstore.errors import (
        BadVersionError,
        InvalidArgumentError,
        KeyExistsError,
        NoSuchKeyError,
        SessionExpiredError,
    )
    from ledgerstore_sqlite import protocol

    for exc in (KeyExistsError("k"), BadVersionError("b"), NoSuchKeyError("n"), SessionExpiredError("s"),
                InvalidArgumentError("i"), MetadataError("m")):
        back = protocol.error_from(protocol.error_code(exc), str(exc))
        assert type(back) is type(exc)
    assert protocol.error_code(protocol.FrameError("x")) == "protocol"
    assert type(protocol.error_from("protocol", "x")) is MetadataError


def test_the_server_socket_path_fits_a_unix_socket_address(tmp_path: Path) -> None:
    from ledgerstore_sqlite.discovery import live_socket, socket_path_for

    short = str(tmp_path / "meta.db")
    assert socket_path_for(short) == short + ".sock"
    deep = str(tmp_path / ("d" * 120) / "meta.db")
    assert len(socket_path_for(deep).encode()) <= 100
    assert socket_path_for(deep) == socket_path_for(deep)  # stable: clients compute the same
    assert live_socket(short) is None  # no lock file: no server
    # what a killed server leaves: a socket path in an unlocked lock file, and the socket file
    Path(short + ".lock").write_text(short + ".sock\n")
    Path(short + ".sock").write_text("")
    assert live_socket(short) is None


def test_concurrent_writes_share_a_commit_and_each_keeps_its_outcome(uri: str) -> None:
    """Puts and deletes in flight together go to the database as one transaction (a group
    commit: one COMMIT, one fsync), each write in its own savepoint: a failed compare-and-set
    and a create of an existing key fail alone, with their own errors, and every other write
    is stored with its own revision."""
    from ledgerstore.api import NOT_EXISTS
    from ledgerstore.errors import BadVersionError, KeyExistsError

    async def main() -> tuple[list[object], list[str], dict[str, bytes | None]]:
        s = SqliteMetadataStore(uri)
        await s.start()
        try:
            await s.put("/g/taken", b"first")
            await s.put("/g/gone", b"x")
            statements: list[str] = []
            assert s._conn is not None
            s._conn.set_trace_callback(statements.append)
            results = await asyncio.gather(
                *(s.put(f"/g/k{i}", b"%d" % i) for i in range(40)),
                s.put("/g/taken", b"second", NOT_EXISTS),
                s.put("/g/k0", b"stale", 1),
                s.delete("/g/gone"),
                return_exceptions=True)
            s._conn.set_trace_callback(None)
            stored = {k: (None if (v := await s.get(k)) is None else v.value)
                      for k in ("/g/taken", "/g/k0", "/g/k39", "/g/gone")}
            return results, statements, stored
        finally:
            await s.close()

    results, statements, stored = run(main())
    revisions = results[:40]
    assert all(isinstance(r, int) for r in revisions) and len(set(revisions)) == 40
    assert isinstance(results[40], KeyExistsError) and isinstance(results[41], BadVersionError)
    assert results[42] is None
    assert stored == {"/g/taken": b"first", "/g/k0": b"0", "/g/k39": b"39", "/g/gone": None}
    commits = [st for st in statements if st.strip().upper() == "COMMIT"]
    assert 1 <= len(commits) <= 3, commits  # the first write alone, then the rest together
    assert sum(st.startswith("ROLLBACK TO") for st in statements) == 2


def test_a_group_commit_that_meets_an_sqlite_error_runs_each_write_alone(tmp_path: Path) -> None:
    """An sqlite error inside a group (a full disk, a lock held too long) undoes the whole group;
    each write then runs alone, so the ones that can succeed do, and only the failing one
    reports the error."""
    conn = sqlite_schema.connect(str(tmp_path / "g.db"), 5.0, "FULL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")

    def insert(k: str) -> str:
        with sqlite_schema.immediate(conn) as c:
            c.execute("INSERT INTO t VALUES (?)", (k,))
        return k

    def broken() -> None:
        with sqlite_schema.immediate(conn) as c:
            c.execute("INSERT INTO no_such_table VALUES (1)")

    out = sqlite_schema.run_group(conn, [(insert, ("a",)), (broken, ()), (insert, ("b",))])
    assert [ok for ok, _ in out] == [True, False, True]
    assert isinstance(out[1][1], sqlite3.OperationalError)
    assert not conn.in_transaction
    assert sorted(r[0] for r in conn.execute("SELECT k FROM t")) == ["a", "b"]
