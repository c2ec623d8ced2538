"""Logs under metadata failures: a writer never rolls past a ledger it failed to close, a new
leader recovers every ledger of the log that is not closed, and a reader never silently stops at
an OPEN ledger in the middle of the log. The interleavings are built with FaultyMetadataStore."""

from __future__ import annotations

import asyncio

import pytest

from ledgerstore.aio import Client, Position
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import LedgerStoreError, LogError
from ledgerstore.meta import layout
from ledgerstore.meta.ledgers import LedgerState
from ledgerstore.meta.logs import LogManager
from ledgerstore.plugins import create_metadata_store
from ledgerstore.proto.codec import Op
from ledgerstore.testing.faults import FaultInjector, FaultyMetadataStore

PW = b"pw"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


def faulty_client(cluster: LocalCluster) -> tuple[Client, FaultyMetadataStore]:
    store = FaultyMetadataStore(create_metadata_store(cluster.metadata))
    return Client(metadata=cluster.metadata, metadata_store=store), store


async def read_all(client: Client, name: str) -> list[tuple[Position, bytes]]:
    reader = await client.open_log_reader(name, password=PW)
    return [item async for item in reader]


async def log_ledgers(client: Client, name: str) -> list[int]:
    md = await LogManager(client.store).read(name)  # type: ignore[arg-type]
    assert md is not None
    return md.ledger_ids


async def states(client: Client, ids: list[int]) -> list[LedgerState]:
    return [(await client.ledger_metadata(lid)).state for lid in ids]


async def append_acked(writer, payloads: list[bytes]) -> list[tuple[Position, bytes]]:  # type: ignore[no-untyped-def]
    """Append all of ``payloads`` at once; the acknowledged ones with their positions."""
    got = await asyncio.gather(*(writer.append_async(p) for p in payloads), return_exceptions=True)
    return [(pos, p) for pos, p in zip(got, payloads, strict=True) if isinstance(pos, Position)]


async def abandoned_log(client: Client, name: str, ledgers: int, per_ledger: int,
                        closed: tuple[int, ...] = ()) -> list[tuple[Position, bytes]]:
    """A log whose ledgers a writer filled and left OPEN (except the indexes in ``closed``), the
    state an older writer that rolled past a failed close left behind. Returns what was acked."""
    logs = LogManager(client.store)  # type: ignore[arg-type]
    md = await logs.get_or_create(name)
    acked = []
    for n in range(ledgers):
        lh = await client.create_ledger(3, 3, 2, password=PW)
        payloads = [b"%d-%04d" % (n, i) for i in range(per_ledger)]
        # the last add carries the others' confirmation: readers see all but the last entry
        ids = [*await asyncio.gather(*(lh.append_async(p) for p in payloads[:-1])), await lh.append(payloads[-1])]
        acked += [(Position(lh.ledger_id, e), p) for e, p in zip(ids, payloads, strict=True)]
        if n in closed:
            await lh.close()
        md = await logs.write(md.with_ledger(lh.ledger_id))
    return acked


def test_a_log_never_rolls_past_a_ledger_that_failed_to_close(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()

    async def main() -> None:
        client, store = faulty_client(cluster)
        async with client:
            faults = FaultInjector().install(client)
            w = await client.open_log("orders", ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
            acked = await append_acked(w, [b"a-%04d" % i for i in range(100)])
            assert len(acked) == 100
            first = w.ledger_id
            store.fail_writes(10**6, key=layout.ledger_path(first))  # its close never lands
            # an add of the first ledger stays in flight, so its close waits while the log rolls on
            answers = faults.hold(direction="response", ops={Op.ADD, Op.ADD_BATCH},
                                  match=lambda info: info.ledger_id == first)
            last_a = w.append_async(b"a-last")
            await answers.wait_hits(3)
            second = await w.roll()  # the second ledger is listed; the first is closed after its adds
            next_roll = asyncio.ensure_future(w.roll())  # must wait for that close before adding a third
            b = [b"b-%04d" % i for i in range(100)]
            b_adds = asyncio.gather(*(w.append_async(p) for p in b), return_exceptions=True)
            answers.release()
            acked.append((await last_a, b"a-last"))
            acked += [(pos, p) for pos, p in zip(await b_adds, b, strict=True) if isinstance(pos, Position)]
            with pytest.raises(LedgerStoreError) as failed:
                await next_roll
            assert await log_ledgers(client, "orders") == [first, second]
            assert (await states(client, [first]))[0] is LedgerState.OPEN
            assert isinstance(failed.value, LogError) and f"ledger {first} could not be closed" in str(failed.value)
            assert w.error is failed.value and len(acked) == 201
            with pytest.raises(LogError, match=f"ledger {first} could not be closed"):
                await w.append(b"later")  # every later append fails with the same error
            # the next leader recovers both open ledgers and the log reads back whole, in order
            async with Client(metadata=cluster.metadata) as leader:
                w2 = await leader.open_log("orders", password=PW)
                assert await states(leader, [first, second]) == [LedgerState.CLOSED] * 2
                assert (await leader.ledger_metadata(first)).last_entry_id == 100
                await w2.close()
                assert await read_all(leader, "orders") == acked

    run(main())


def test_a_close_that_fails_once_is_retried_before_the_log_moves_on(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()

    async def main() -> None:
        client, store = faulty_client(cluster)
        async with client:
            w = await client.open_log("events", ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
            acked = await append_acked(w, [b"a-%04d" % i for i in range(50)])
            first = w.ledger_id
            fault = store.fail_writes(1, key=layout.ledger_path(first))
            await w.roll()
            acked += await append_acked(w, [b"b-%04d" % i for i in range(50)])
            await w.flush()  # the roll's close has finished (after its retry)
            assert fault.hits == 1
            assert w.error is None
            assert (await states(client, [first]))[0] is LedgerState.CLOSED
            await w.roll()
            acked += await append_acked(w, [b"c-%04d" % i for i in range(50)])
            await w.close()
            assert len(acked) == 150
            ids = await log_ledgers(client, "events")
            assert len(ids) == 3 and await states(client, ids) == [LedgerState.CLOSED] * 3
            assert await read_all(client, "events") == acked

    run(main())


def test_a_new_leader_recovers_every_ledger_of_the_log_that_is_not_closed(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as old:
            # [L1 OPEN, L2 CLOSED, L3 OPEN, L4 OPEN]: a writer rolled past L1's failed close
            acked = await abandoned_log(old, "clicks", ledgers=4, per_ledger=50, closed=(1,))
        async with Client(metadata=cluster.metadata) as client:
            ids = await log_ledgers(client, "clicks")
            assert (await states(client, ids))[0] is LedgerState.OPEN
            w = await client.open_log("clicks", password=PW)
            assert await states(client, ids) == [LedgerState.CLOSED] * 4
            assert [(await client.ledger_metadata(lid)).last_entry_id for lid in ids] == [49] * 4
            pos = await w.append(b"new")
            await w.close()
            assert await read_all(client, "clicks") == [*acked, (pos, b"new")]

    run(main())


def test_a_log_reader_never_silently_stops_at_an_open_ledger_in_the_middle(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            acked = await abandoned_log(client, "views", ledgers=2, per_ledger=50, closed=(1,))
            first = acked[0][0].ledger_id
            reader = await client.open_log_reader("views", password=PW)
            reader.open_ledger_grace_s = 1.0
            got: list[tuple[Position, bytes]] = []
            with pytest.raises(LogError, match=f"ledger {first} is still OPEN"):
                async for item in reader:
                    got.append(item)
            # the reader read up to the open ledger's last-add-confirmed and stayed there
            assert got == acked[:49] and reader.blocked_at == Position(first, 49)
            tail = await client.open_log_reader("views", password=PW, follow=True)
            tailed: list[tuple[Position, bytes]] = []

            async def follow() -> None:
                async for item in tail:
                    tailed.append(item)
                    if len(tailed) == len(acked):
                        return

            follower = asyncio.create_task(follow())
            deadline = asyncio.get_running_loop().time() + 30
            while tail.blocked_at is None:
                assert asyncio.get_running_loop().time() < deadline, "the tailing reader never reached the open ledger"
                await asyncio.sleep(0.05)
            assert not follower.done() and tailed == acked[:49]  # waits at the open ledger, not past it
            w = await client.open_log("views", password=PW)  # the next leader recovers it
            await w.close()
            await asyncio.wait_for(follower, 60)
            assert tailed == acked
            got += [item async for item in reader]  # the same reader goes on from where it stopped
            assert got == acked and reader.blocked_at is None

    run(main())
