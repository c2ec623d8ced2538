"""Conformance suite for :class:`ledgerstore.api.MetadataStore` backends."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from ledgerstore.api import NOT_EXISTS, EventType, MetadataStore, Notification, SessionEvent
from ledgerstore.errors import BadVersionError, KeyExistsError, NoSuchKeyError
from ledgerstore.meta import layout
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore.testing.capabilities import require

T = TypeVar("T")
StoreFactory = Callable[[], MetadataStore]
SessionExpirer = Callable[[MetadataStore], Awaitable[None]]


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """Run a coroutine to completion in a fresh event loop, bounded by ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def wait_until(predicate: Callable[[], bool], timeout: float = 15.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` on the loop until true; AssertionError after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


class LargestChildrenAnswer:
    """While entered, records the most names any ``children`` answer of ``store`` held (the
    answers a ZooKeeper ``getChildren`` would carry whole, under its ``jute.maxbuffer``)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        #: the most names one answer held so far
        self.largest = 0
        self._plain = store.children

    async def _counted(self, key: str) -> list[str]:
        names = await self._plain(key)
        self.largest = max(self.largest, len(names))
        return names

    def __enter__(self) -> LargestChildrenAnswer:
        self.store.children = self._counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.children = self._plain  # type: ignore[method-assign]


class MetadataStoreConformance:
    """Subclass and provide a ``store_factory`` fixture returning a callable that builds a new,
    unstarted store client connected to one shared, empty namespace.

    Backends that declare ``supports_session_events`` also provide ``expire_session``: an async
    callable that ends a started store's session from outside, as the server does when it
    expires a session (ZooKeeper: close a second client on the same session id; etcd: revoke the
    lease; sqlite: delete the session row). Without it the session cases are skipped."""

    #: total CAS rounds in the concurrent-writers race (the issue asks for 1,000)
    cas_race_rounds = 1000
    #: concurrent writers in the race
    cas_race_writers = 8
    #: seconds within which an ephemeral key of a closed session must vanish
    ephemeral_timeout = 20.0
    #: ledgers the layout case creates and lists (the issue asks for 25,000 or more)
    many_ledgers = 25_000
    #: creates in flight while it fills the store: few enough that a backend with one writer
    #: (the sqlite server, an fsync per write) still answers a short session's heartbeats in time
    create_window = 32

    @pytest.fixture
    def store_factory(self) -> StoreFactory:  # pragma: no cover - must be overridden
        raise NotImplementedError("conformance suites need a store_factory fixture")

    @pytest.fixture
    def expire_session(self) -> SessionExpirer:
        pytest.skip("this suite's subclass gives no expire_session fixture")

    def _with_stores(self, factory: StoreFactory, n: int, body: Callable[..., Awaitable[Any]]) -> Any:
        async def main() -> Any:
            stores = [factory() for _ in range(n)]
            for s in stores:
                await s.start()
            try:
                return await body(*stores)
            finally:
                for s in stores:
                    await s.close()

        return run(main(), timeout=180)

    def test_get_missing_returns_none(self, store_factory: StoreFactory) -> None:
        async def body(s: MetadataStore) -> None:
            assert await s.get("/conformance/missing") is None

        self._with_stores(store_factory, 1, body)

    def test_create_if_absent_then_conflict(self, store_factory: StoreFactory) -> None:
        async def body(s: MetadataStore) -> None:
            v = await s.put("/c/a", b"one", NOT_EXISTS)
            got = await s.get("/c/a")
            assert got is not None and got.value == b"one" and got.version == v
            with pytest.raises(KeyExistsError):
                await s.put("/c/a", b"two", NOT_EXISTS)
            got2 = await s.get("/c/a")
            assert got2 is not None and got2.value == b"one"

        self._with_stores(store_factory, 1, body)

    def test_compare_and_set(self, store_factory: StoreFactory) -> None:
        async def body(s: MetadataStore) -> None:
            v1 = await s.put("/cas/k", b"1", NOT_EXISTS)
            v2 = await s.put("/cas/k", b"2", v1)
            assert v2 != v1
            with pytest.raises(BadVersionError):
                await s.put("/cas/k", b"stale", v1)
            got = await s.get("/cas/k")
            assert got is not None and (got.value, got.version) == (b"2", v2)
            with pytest.raises(BadVersionError):
                await s.put("/cas/absent", b"x", v2)
            assert await s.get("/cas/absent") is None

        self._with_stores(store_factory, 1, body)

    def test_unconditional_put_and_empty_value(self, store_factory: StoreFactory) -> None:
        async def body(s: MetadataStore) -> None:
            await s.put("/u/k", b"")
            await s.put("/u/k", b"\x00\xff" * 1000)
            got = await s.get("/u/k")
            assert got is not None and got.value == b"\x00\xff" * 1000
            await s.put("/u/e", b"")
            e = await s.get("/u/e")
            assert e is not None and e.value == b""

        self._with_stores(store_factory, 1, body)

    def test_delete_with_version(self, store_factory: StoreFactory) -> None:
        async def body(s: MetadataStore) -> None:
            v = await s.put("/d/k", b"x", NOT_EXISTS)
            with pytest.raises(BadVersionError):
                await s.delete("/d/k", v + 12345)
            await s.delete("/d/k", v)
            assert await s.get("/d/k") is None
            with pytest.raises(NoSuchKeyError):
                await s.delete("/d/k")

        self._with_stores(store_factory, 1, body)

    def test_children_are_direct_and_sorted(self, store_factory: StoreFactory) -> None:
        async def body(s: MetadataStore) -> None:
            for k in ["/ch/b", "/ch/a", "/ch/c/deep/er", "/chx/other", "/ch/127.0.0.1:3181"]:
                await s.put(k, b"v")
            assert await s.children("/ch") == sorted(["a", "b", "c", "127.0.0.1:3181"])
            assert await s.children("/ch/c") == ["deep"]
            assert await s.children("/nothing/here") == []
            await s.delete("/ch/b")
            assert "b" not in await s.children("/ch")

        self._with_stores(store_factory, 1, body)

    def test_ephemeral_vanishes_when_session_closes(self, store_factory: StoreFactory) -> None:
        async def main() -> None:
            owner, observer = store_factory(), store_factory()
            await owner.start()
            await observer.start()
            try:
                await owner.put_ephemeral("/eph/bookie-1", b"alive")
                got = await observer.get("/eph/bookie-1")
                assert got is not None and got.value == b"alive"
                assert await observer.children("/eph") == ["bookie-1"]
                await owner.close()
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.ephemeral_timeout
                while await observer.get("/eph/bookie-1") is not None:
                    assert loop.time() < deadline, "ephemeral key outlived its session"
                    await asyncio.sleep(0.1)
            finally:
                await observer.close()
                await owner.close()

        run(main(), timeout=self.ephemeral_timeout + 60)

    def test_watch_sees_other_clients_changes(self, store_factory: StoreFactory) -> None:
        async def body(watcher: MetadataStore, writer: MetadataStore) -> None:
            seen: list[Notification] = []
            sub = await watcher.watch("/w", seen.append)
            try:
                await writer.put("/w/k1", b"a", NOT_EXISTS)
                await wait_until(lambda: any(n.key == "/w/k1" for n in seen))
                v = await writer.get("/w/k1")
                assert v is not None
                await writer.put("/w/k1", b"b", v.version)
                await wait_until(lambda: any(n.type is EventType.MODIFIED and n.key == "/w/k1" for n in seen))
                await writer.delete("/w/k1")
                await wait_until(lambda: any(n.type is EventType.DELETED and n.key == "/w/k1" for n in seen))
                await writer.put("/outside/k", b"x")
                await writer.put("/w/deep/k2", b"x")
                await wait_until(lambda: any(n.key == "/w/deep/k2" for n in seen))
                assert not any(n.key.startswith("/outside") for n in seen)
                assert [n.type for n in seen if n.key == "/w/k1"][0] is EventType.CREATED
            finally:
                sub.cancel()
            before = len(seen)
            await writer.put("/w/after-cancel", b"x")
            await asyncio.sleep(1.0)
            assert len(seen) == before, "callback ran after cancel()"

        self._with_stores(store_factory, 2, body)

    def test_next_id_is_unique_across_clients(self, store_factory: StoreFactory) -> None:
        async def body(a: MetadataStore, b: MetadataStore) -> None:
            ids = await asyncio.gather(*[(a if i % 2 else b).next_id("ledger") for i in range(200)])
            assert len(set(ids)) == 200 and min(ids) >= 1
            first = await a.next_id("ledger")
            second = await a.next_id("ledger")
            assert first > max(ids) and second > first
            assert await a.next_id("other-counter") >= 1

        self._with_stores(store_factory, 2, body)

    def test_concurrent_cas_race_loses_nothing(self, store_factory: StoreFactory) -> None:
        """N writers each try to append their token to one key by CAS; exactly one wins each
        round and every win is visible in the final value."""
        rounds, writers = self.cas_race_rounds, self.cas_race_writers

        async def body(*stores: MetadataStore) -> None:
            await stores[0].put("/race/k", b"", NOT_EXISTS)
            wins = [0] * writers
            conflicts = [0]

            async def writer(i: int) -> None:
                s = stores[i]
                rnd = random.Random(i)
                while True:
                    cur = await s.get("/race/k")
                    assert cur is not None
                    tokens = cur.value.split(b",") if cur.value else []
                    if len(tokens) >= rounds:
                        return
                    new = b",".join([*tokens, b"%d-%d" % (i, wins[i])])
                    try:
                        await s.put("/race/k", new, cur.version)
                        wins[i] += 1
                    except BadVersionError:
                        conflicts[0] += 1
                        await asyncio.sleep(rnd.random() * 0.001)

            await asyncio.gather(*(writer(i) for i in range(writers)))
            final = await stores[0].get("/race/k")
            assert final is not None
            tokens = final.value.split(b",")
            assert len(tokens) == rounds == sum(wins), (len(tokens), sum(wins))
            assert len(set(tokens)) == rounds, "a token appears twice: two writers won one round"

        self._with_stores(store_factory, writers, body)

    def test_children_come_in_sorted_pages(self, store_factory: StoreFactory) -> None:
        """``children_page`` cuts the sorted children after a name, ``iter_children`` walks them
        a page at a time, and both agree with ``children`` (names with characters that sort
        before ``/`` included, and children that only have descendants)."""

        async def body(s: MetadataStore) -> None:
            names = [f"n{i:02d}" for i in range(23)] + ["a", "a-1", "a.b", "b"]
            for n in names:
                await s.put(f"/pg/{n}", b"v")
            await s.put("/pg/a/deep/er", b"v")
            await s.put("/pg/only-deep/x/y", b"v")
            every = sorted([*names, "only-deep"])
            assert await s.children("/pg") == every
            assert await s.children_page("/pg", None, 3) == every[:3]
            assert await s.children_page("/pg", "a", 2) == ["a-1", "a.b"]
            assert await s.children_page("/pg", every[-1], 5) == []
            assert await s.children_page("/nothing/here") == []
            assert [n async for n in s.iter_children("/pg", page_size=4)] == every
            assert [n async for n in s.iter_children("/pg", page_size=len(every))] == every
            with pytest.raises(ValueError):
                await s.children_page("/pg", None, 0)

        self._with_stores(store_factory, 1, body)

    def test_ledgers_are_laid_out_hierarchically_and_listed_without_a_giant_answer(
            self, store_factory: StoreFactory) -> None:
        """``many_ledgers`` ledgers (ids 1 up, and two far ones) are stored at BookKeeper's
        long-hierarchical keys (``/ledgers/000/0000/0000/0000/L0001``); the ledger manager lists
        every one, ascending, and no children answer it reads holds more than 10,000 names."""

        async def body(s: MetadataStore) -> None:
            mgr = LedgerManager(s)
            ids = [*range(1, self.many_ledgers + 1), 10**12 + 7, 2**63 - 1]
            for i in range(0, len(ids), self.create_window):
                await asyncio.gather(*(mgr.create(_small_ledger(lid)) for lid in ids[i:i + self.create_window]))
            assert await s.get("/ledgers/000/0000/0000/0000/L0001") is not None
            assert await s.get("/ledgers/922/3372/0368/5477/L5807") is not None
            assert await s.children("/ledgers/000/0000/0000") == ["0000", "0001", "0002"]
            with LargestChildrenAnswer(s) as answers:
                listed = [lid async for lid in LedgerManager(s).list()]
            assert listed == ids
            assert 0 < answers.largest <= layout.MAX_LEVEL_CHILDREN

        self._with_stores(store_factory, 1, body)

    def test_delete_recursive(self, store_factory: StoreFactory) -> None:
        async def body(s: MetadataStore) -> None:
            for k in ["/tree/a", "/tree/a/b", "/tree/c/d/e"]:
                await s.put(k, b"x")
            await s.delete_recursive("/tree")
            assert await s.children("/tree") == []
            assert await s.get("/tree/a") is None

        self._with_stores(store_factory, 1, body)

    def test_session_lost_and_restored(self, store_factory: StoreFactory, expire_session: SessionExpirer) -> None:
        """When the server ends a store's session: listeners hear LOST then RESTORED (as
        :class:`SessionEvent` members, nothing else); the session's ephemeral keys are gone for
        everyone while persistent keys stay; watches deliver again without being re-created; and
        the store can create ephemeral keys on its new session."""

        async def body(owner: MetadataStore, observer: MetadataStore) -> None:
            require(owner, "supports_session_events")
            events: list[object] = []
            owner.add_session_listener(events.append)
            seen: list[Notification] = []
            sub = await owner.watch("/sess/w", seen.append)
            await owner.put_ephemeral("/sess/eph/bookie-1", b"alive")
            await owner.put("/sess/persistent", b"kept", NOT_EXISTS)
            assert await observer.get("/sess/eph/bookie-1") is not None
            await observer.put("/sess/w/before", b"x")
            await wait_until(lambda: any(n.key == "/sess/w/before" for n in seen))

            await expire_session(owner)
            await wait_until(lambda: len(events) >= 2, timeout=self.ephemeral_timeout + 15)
            assert events == [SessionEvent.LOST, SessionEvent.RESTORED]
            assert all(type(e) is SessionEvent for e in events)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.ephemeral_timeout
            while await observer.get("/sess/eph/bookie-1") is not None:
                assert loop.time() < deadline, "an ephemeral key outlived its lost session"
                await asyncio.sleep(0.1)
            kept = await observer.get("/sess/persistent")
            assert kept is not None and kept.value == b"kept"

            await observer.put("/sess/w/after", b"y")
            await wait_until(lambda: any(n.key == "/sess/w/after" for n in seen))
            sub.cancel()

            await owner.put_ephemeral("/sess/eph/bookie-1", b"again")
            again = await observer.get("/sess/eph/bookie-1")
            assert again is not None and again.value == b"again"
            assert events == [SessionEvent.LOST, SessionEvent.RESTORED], "a second session event came"

        self._with_stores(store_factory, 2, body)


def _small_ledger(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1, digest_type="crc32c",
                          password_check="-", ensembles=[(0, ["bookie-1:3181"])])
