"""Ledger keys in the metadata store: a new cluster keys them as BookKeeper's long-hierarchical
layout does (no level over 10,000 children), a cluster made before keeps its bucketed keys (the
``/LAYOUT`` marker says which), and passes over every ledger overlap their metadata reads."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest

from ledgerstore.errors import MetadataError, NoSuchLedgerError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import ClusterManager
from ledgerstore.meta.layout import LedgerLayout
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata
from ledgerstore_memory import MemoryMetadataStore


def with_store(scenario: Callable[[MemoryMetadataStore], Awaitable[None]]) -> None:
    async def main() -> None:
        store = MemoryMetadataStore(f"memory://layout-{uuid.uuid4().hex}")
        await store.start()
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


def ledger(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum=1, ack_quorum=1, digest_type="crc32c",
                          password_check="-", ensembles=[(0, ["b1:3181"])])


def test_a_new_cluster_keys_ledgers_as_bookkeepers_long_hierarchical_layout() -> None:
    async def scenario(store: MemoryMetadataStore) -> None:
        await ClusterManager(store).init()
        marker = await store.get(layout.LAYOUT)
        assert marker is not None and marker.value == b"2"
        mgr = LedgerManager(store)
        await mgr.create(ledger(1234567))
        assert await store.get("/ledgers/000/0000/0000/0123/L4567") is not None
        assert (await mgr.read(1234567)).ledger_id == 1234567
        assert [lid async for lid in mgr.list()] == [1234567]

    with_store(scenario)


def test_a_cluster_made_before_keeps_its_bucketed_keys() -> None:
    async def scenario(store: MemoryMetadataStore) -> None:
        await store.put(layout.INSTANCE_ID, b"old-cluster")
        await store.put(layout.LAYOUT, b"1")
        old_key = "/ledgers/000000000000001/L0000000000000012345"
        await store.put(old_key, ledger(12345).to_bytes())
        mgr = LedgerManager(store)
        assert await mgr.ledger_layout() is LedgerLayout.BUCKETED
        md = await mgr.read(12345)
        md.custom["k"] = "v"
        await mgr.write(md)
        await mgr.create(ledger(7))
        assert await store.get("/ledgers/000000000000000/L0000000000000000007") is not None
        assert [lid async for lid in mgr.list()] == [7, 12345]
        await mgr.delete(12345)
        assert await store.get(old_key) is None
        with pytest.raises(NoSuchLedgerError):
            await mgr.read(12345)

    with_store(scenario)


def test_a_cluster_without_a_layout_marker_is_bucketed_an_empty_store_hierarchical() -> None:
    async def scenario(store: MemoryMetadataStore) -> None:
        assert await LedgerManager(store).ledger_layout() is LedgerLayout.LONG_HIERARCHICAL
        await store.put(layout.INSTANCE_ID, b"old-cluster")
        assert await LedgerManager(store).ledger_layout() is LedgerLayout.BUCKETED

    with_store(scenario)


def test_an_unknown_layout_version_is_one_line_naming_it() -> None:
    async def scenario(store: MemoryMetadataStore) -> None:
        await store.put(layout.LAYOUT, b"7")
        with pytest.raises(MetadataError, match=r"layout version '7' is not supported .*upgrade") as err:
            await LedgerManager(store).read(1)
        assert "\n" not in str(err.value)

    with_store(scenario)


@pytest.mark.parametrize("ledger_id", [0, 1, 9999, 10_000, 1234567890123, 2**63 - 1])
def test_a_ledger_key_parses_back_to_its_id_in_either_layout(ledger_id: int) -> None:
    for lay in LedgerLayout:
        assert layout.parse_ledger_key(lay.path(ledger_id)) == ledger_id
    assert layout.parse_ledger_key("/ledgers/000/0000") is None
    assert layout.parse_ledger_key("/logs/L0001") is None


def test_read_many_keeps_a_window_of_reads_in_flight_and_reports_missing_ledgers() -> None:
    async def scenario(store: MemoryMetadataStore) -> None:
        mgr = LedgerManager(store)
        for lid in range(1, 201):
            if lid % 10:
                await mgr.create(ledger(lid))
        in_flight = most = 0
        plain_get = store.get

        async def slow_get(key: str):  # type: ignore[no-untyped-def]
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.001)
            in_flight -= 1
            return await plain_get(key)

        store.get = slow_get  # type: ignore[method-assign]
        await mgr.ledger_layout()
        got = {lid: md async for lid, md in mgr.read_many(range(1, 201), window=16)}
        assert sorted(got) == list(range(1, 201))
        assert {lid for lid, md in got.items() if md is None} == set(range(10, 201, 10))
        assert most == 16
        assert await mgr.missing(range(1, 201), window=8) == list(range(10, 201, 10))

    with_store(scenario)
