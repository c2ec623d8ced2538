"""Behaviour of the memory store beyond the conformance suite: sharing by name across threads
and loops, sessions, expiry, garbage-collected stores and clear errors."""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from ledgerstore.api import NOT_EXISTS, EventType, Notification
from ledgerstore.errors import BadVersionError, ConfigError, InvalidArgumentError, MetadataError
from ledgerstore.testing.metadata import wait_until
from ledgerstore_memory import MemoryMetadataStore, drop_namespace, namespace_names

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def uri() -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex}"
    yield f"memory://{name}"
    drop_namespace(name)


class LoopThread:
    """An event loop on its own thread, as an in-process bookie might run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


def test_stores_with_one_name_share_keys_and_other_names_do_not(uri: str) -> None:
    async def main() -> None:
        a, b, other = MemoryMetadataStore(uri), MemoryMetadataStore(uri), MemoryMetadataStore(uri + "-other")
        for s in (a, b, other):
            await s.start()
        v = await a.put("/shared/k", b"from-a", NOT_EXISTS)
        got = await b.get("/shared/k")
        assert got is not None and (got.value, got.version) == (b"from-a", v)
        assert await other.get("/shared/k") is None
        for s in (a, b, other):
            await s.close()
        again = MemoryMetadataStore(uri)  # the namespace outlives its stores
        await again.start()
        assert (await again.get("/shared/k")) == got
        await again.close()

    run(main())
    assert uri.removeprefix("memory://") in namespace_names()


def test_watch_runs_on_the_watchers_loop_when_the_writer_is_on_another_thread(
    uri: str, loop_thread: LoopThread
) -> None:
    writer = MemoryMetadataStore(uri)
    loop_thread.call(writer.start())

    async def main() -> None:
        watcher = MemoryMetadataStore(uri)
        await watcher.start()
        seen: list[tuple[Notification, int]] = []
        sub = await watcher.watch("/reg", lambda n: seen.append((n, threading.get_ident())))
        for i in range(50):
            await asyncio.to_thread(loop_thread.call, writer.put(f"/reg/b{i}", b"x"))
        await asyncio.to_thread(loop_thread.call, writer.delete("/reg/b0"))
        await wait_until(lambda: len(seen) == 51)
        assert {tid for _, tid in seen} == {threading.get_ident()}
        assert [n.key for n, _ in seen][:3] == ["/reg/b0", "/reg/b1", "/reg/b2"]
        assert seen[-1][0] == Notification(EventType.DELETED, "/reg/b0")
        sub.cancel()
        await watcher.close()

    run(main())
    loop_thread.call(writer.close())


def test_compare_and_set_is_atomic_across_threads(uri: str) -> None:
    threads, increments = 4, 300

    async def worker() -> int:
        s = MemoryMetadataStore(uri)
        await s.start()
        conflicts = 0
        done = 0
        while done < increments:
            cur = await s.get("/counter")
            assert cur is not None
            try:
                await s.put("/counter", b"%d" % (int(cur.value) + 1), cur.version)
                done += 1
            except BadVersionError:
                conflicts += 1
        await s.close()
        return conflicts

    async def setup() -> None:
        s = MemoryMetadataStore(uri)
        await s.start()
        await s.put("/counter", b"0", NOT_EXISTS)
        await s.close()

    run(setup())
    results: list[int] = []
    pool = [threading.Thread(target=lambda: results.append(asyncio.run(worker()))) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    assert len(results) == threads

    async def check() -> bytes | None:
        s = MemoryMetadataStore(uri)
        await s.start()
        got = await s.get("/counter")
        await s.close()
        return None if got is None else got.value

    assert run(check()) == b"%d" % (threads * increments)


def test_plain_put_keeps_a_key_ephemeral_and_put_ephemeral_takes_it_over(uri: str) -> None:
    async def main() -> None:
        a, b, observer = (MemoryMetadataStore(uri) for _ in range(3))
        for s in (a, b, observer):
            await s.start()
        await a.put_ephemeral("/e/plain", b"1")
        await b.put("/e/plain", b"2")  # still owned by a's session
        await a.put_ephemeral("/e/taken", b"1")
        await b.put_ephemeral("/e/taken", b"2")  # now owned by b's session
        await a.close()
        assert await observer.get("/e/plain") is None
        taken = await observer.get("/e/taken")
        assert taken is not None and taken.value == b"2"
        await b.close()
        assert await observer.children("/e") == []
        await observer.close()

    run(main())


def test_expire_session_drops_ephemerals_and_tells_listeners_in_order(uri: str) -> None:
    async def main() -> None:
        s, observer = MemoryMetadataStore(uri), MemoryMetadataStore(uri)
        await s.start()
        await observer.start()
        events: list[str] = []
        s.add_session_listener(events.append)
        await s.put_ephemeral("/bookies/b1", b"up")
        await s.put("/persistent", b"stays")
        first = s.session_id
        s.expire_session()
        assert await observer.get("/bookies/b1") is None
        assert await observer.get("/persistent") is not None
        await wait_until(lambda: events == ["lost", "restored"])
        assert s.session_id != first
        await s.put_ephemeral("/bookies/b1", b"up again")  # the new session works
        await s.close()
        assert await observer.get("/bookies/b1") is None
        await observer.close()

    run(main())


def test_a_store_collected_without_close_loses_its_ephemerals(uri: str) -> None:
    async def main() -> None:
        observer = MemoryMetadataStore(uri)
        await observer.start()
        leaked = MemoryMetadataStore(uri)
        await leaked.start()
        await leaked.put_ephemeral("/eph/leaked", b"x")
        await leaked.put("/kept", b"x")
        assert await observer.get("/eph/leaked") is not None
        del leaked
        gc.collect()
        assert await observer.get("/eph/leaked") is None
        assert await observer.get("/kept") is not None
        await observer.close()

    run(main())


def test_watch_stops_when_its_store_closes(uri: str) -> None:
    async def main() -> None:
        watcher, writer = MemoryMetadataStore(uri), MemoryMetadataStore(uri)
        await watcher.start()
        await writer.start()
        seen: list[Notification] = []
        await watcher.watch("/", seen.append)
        await writer.put("/a", b"1")
        await wait_until(lambda: len(seen) == 1)
        await watcher.close()
        await writer.put("/b", b"2")
        await asyncio.sleep(0.2)
        assert [n.key for n in seen] == ["/a"]
        await writer.close()

    run(main())


def test_delete_recursive_is_atomic_and_notifies_each_key(uri: str) -> None:
    async def main() -> None:
        s = MemoryMetadataStore(uri)
        await s.start()
        for k in ("/t", "/t/a", "/t/a/b", "/t/c/d", "/tx"):
            await s.put(k, b"v")
        seen: list[Notification] = []
        await s.watch("/", seen.append)
        await s.delete_recursive("/t")
        await wait_until(lambda: len(seen) == 4)
        assert {n.key for n in seen} == {"/t", "/t/a", "/t/a/b", "/t/c/d"}
        assert all(n.type is EventType.DELETED for n in seen)
        assert await s.children("/") == ["tx"]
        await s.close()

    run(main())


@pytest.mark.parametrize(
    ("bad_uri", "message"),
    [("memory://", "names no namespace"), ("sqlite:///x.db", "must start with 'memory://'")],
)
def test_bad_uris_are_config_errors(bad_uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MemoryMetadataStore(bad_uri)


def test_options_are_refused_by_name(uri: str) -> None:
    with pytest.raises(ConfigError, match="session_ttl"):
        MemoryMetadataStore(uri, session_ttl=2)


def test_unstarted_and_closed_stores_refuse_calls(uri: str) -> None:
    async def main() -> None:
        s = MemoryMetadataStore(uri)
        with pytest.raises(MetadataError, match="not started"):
            await s.get("/k")
        await s.start()
        await s.close()
        with pytest.raises(MetadataError, match="closed"):
            await s.put("/k", b"v")
        with pytest.raises(MetadataError, match="closed"):
            await s.start()

    run(main())


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.get("relative"), InvalidArgumentError),
        (lambda s: s.put("/a//b", b"v"), InvalidArgumentError),
        (lambda s: s.put("/k", "text"), InvalidArgumentError),
    ],
)
def test_bad_keys_and_values_are_refused(uri: str, call: Callable[[MemoryMetadataStore], Any], error: type) -> None:
    async def main() -> None:
        s = MemoryMetadataStore(uri)
        await s.start()
        try:
            with pytest.raises(error):
                await call(s)
        finally:
            await s.close()

    run(main())
