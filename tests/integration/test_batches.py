"""The batched write path against real bookie processes: ``append_many``, the compact all-OK
answer to ADD_BATCH, per-entry answers when a batch holds a bad entry, and an ensemble change
while whole batches are outstanding."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

import ledgerstore
from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import InvalidArgumentError, LedgerClosedError
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DigestManager, master_key


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


async def stored_copy(client: Client, bookie_id: str, ledger_id: int, entry_id: int) -> codec.Response:
    ch = client.pool.get(bookie_id)
    return await ch.request(lambda rid: codec.encode_read(rid, ledger_id, entry_id), 10)


@pytest.mark.parametrize(("ensemble", "write_quorum"), [(3, 3), (3, 2)])
def test_append_many_mixed_with_single_adds(shared_cluster: LocalCluster, ensemble: int, write_quorum: int) -> None:
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            lh = await client.create_ledger(ensemble, write_quorum, 2, password=b"pw")
            payloads = [os.urandom(1 + i % 500) for i in range(5_000)]
            futs: list[asyncio.Future[int]] = []
            expected_last: list[int] = []
            i = 0
            while i < len(payloads):
                if i % 7 == 0:
                    futs.append(lh.append_async(payloads[i]))
                    expected_last.append(i)
                    i += 1
                else:
                    n = min(1 + i % 300, len(payloads) - i)
                    futs.append(lh.append_many_async(payloads[i : i + n]))
                    i += n
                    expected_last.append(i - 1)
            assert await asyncio.gather(*futs) == expected_last
            assert lh.last_add_confirmed == len(payloads) - 1
            assert await lh.append_many([b"a", b"b"]) == len(payloads) + 1
            await lh.close()
            md = await client.ledger_metadata(lh.ledger_id)
            assert md.last_entry_id == len(payloads) + 1
            assert md.length == sum(map(len, payloads)) + 2
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, md.last_entry_id)] == payloads + [b"a", b"b"]
            # striping holds for batches: entry e is on its write set's bookies and nowhere else
            dm = DigestManager(lh.ledger_id, md.digest_type, b"pw")
            bookies = md.ensembles[0][1]
            for e in (0, 1, 2, 3, 1234, 4999):
                for idx, bid in enumerate(bookies):
                    resp = await stored_copy(client, bid, lh.ledger_id, e)
                    assert (resp.status == Status.OK) == (idx in md.write_set(e)), (e, idx)
                    if resp.status == Status.OK:
                        assert dm.verify(resp.entry, e).payload == payloads[e]
            await client.delete_ledger(lh.ledger_id)

    run(main())


def test_append_many_refuses_bad_input(shared_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            with pytest.raises(InvalidArgumentError, match="at least one"):
                await lh.append_many_async([])
            with pytest.raises(InvalidArgumentError, match="bytes, not str"):
                await lh.append_many_async([b"ok", "text"])  # type: ignore[list-item]
            assert lh.last_add_confirmed == -1, "a refused batch adds nothing"
            assert await lh.append_many([b"x"]) == 0
            await lh.close()
            with pytest.raises(LedgerClosedError):
                await lh.append_many_async([b"late"])
            await client.delete_ledger(lh.ledger_id)

    run(main())


def test_sync_append_many(shared_cluster: LocalCluster) -> None:
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        lh = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        assert lh.append_many([b"e%d" % i for i in range(100)]) == 99
        futs = [lh.append_many_async([b"f%d" % i] * 10) for i in range(10)]
        assert [f.result(30) for f in futs] == [109 + 10 * i for i in range(10)]
        lh.close()
        rh = client.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.payload for e in rh.read(98, 101)] == [b"e98", b"e99", b"f0", b"f0"]
        client.delete_ledger(lh.ledger_id)


def test_bookie_answers_a_clean_batch_compactly_and_a_bad_one_per_entry(shared_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            lh = await client.create_ledger(3, 3, 3, password=b"pw")
            await lh.append(b"first")  # the ledger's key is known to every bookie
            dm = DigestManager(lh.ledger_id, "crc32c", b"pw")
            key = master_key(b"pw")
            bid = lh.metadata.current_ensemble[0]
            ch = client.pool.get(bid)
            good = [(e, dm.sign(e, 0, b"p%d" % e)) for e in range(1, 51)]
            resp = await ch.request(lambda rid: codec.encode_add_batch(rid, lh.ledger_id, key, good), 10)
            assert (resp.status, resp.all_ok, resp.count, resp.items) == (Status.OK, True, 50, ())
            # entry 52 is signed as entry 99: that one is refused, the others stored
            bad = [(51, dm.sign(51, 0, b"x")), (52, dm.sign(99, 0, b"y")), (53, dm.sign(53, 0, b"z"))]
            resp = await ch.request(lambda rid: codec.encode_add_batch(rid, lh.ledger_id, key, bad), 10)
            assert not resp.all_ok
            assert resp.items == ((51, Status.OK), (52, Status.BAD_REQUEST), (53, Status.OK))
            for e, expected in ((25, b"p25"), (51, b"x"), (53, b"z")):
                got = await stored_copy(client, bid, lh.ledger_id, e)
                assert dm.verify(got.entry, e).payload == expected
            assert (await stored_copy(client, bid, lh.ledger_id, 52)).status == Status.NO_SUCH_ENTRY
            # a wrong key refuses every entry, item by item
            resp = await ch.request(lambda rid: codec.encode_add_batch(rid, lh.ledger_id, b"wrong", good[:3]), 10)
            assert [st for _, st in resp.items] == [Status.UNAUTHORIZED] * 3

    run(main())


def test_ensemble_change_while_batches_are_outstanding(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(4)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=5) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"pw")
            first_ensemble = list(lh.metadata.current_ensemble)
            victim = next(i for i in range(4) if cluster.bookie_id(i) == first_ensemble[1])
            futs: list[asyncio.Future[int]] = []
            n = 0
            for round_ in range(60):
                futs.append(lh.append_many_async([b"entry-%d" % (n + k) for k in range(200)]))
                n += 200
                if round_ == 20:
                    cluster.kill(victim)  # SIGKILL with batches in flight
                await asyncio.sleep(0.01)
            lasts = await asyncio.gather(*futs)
            assert lasts == [200 * (r + 1) - 1 for r in range(60)]
            await lh.close()
            md = await client.ledger_metadata(lh.ledger_id)
            assert md.last_entry_id == n - 1
            assert len(md.ensembles) >= 2 and cluster.bookie_id(victim) not in md.current_ensemble
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, n - 1)] == [b"entry-%d" % e for e in range(n)]
            # every entry of the new fragment is on all three bookies of its ensemble
            dm = DigestManager(lh.ledger_id, md.digest_type, b"pw")
            start, bookies = md.ensembles[-1]
            for e in (start, (start + n) // 2, n - 1):
                for bid in bookies:
                    resp = await stored_copy(client, bid, lh.ledger_id, e)
                    assert resp.status == Status.OK and dm.verify(resp.entry, e).payload == b"entry-%d" % e

    run(main())


def test_iterating_with_read_ahead_yields_every_entry_in_order(shared_cluster: LocalCluster) -> None:
    async def main() -> int:
        async with Client(metadata=shared_cluster.metadata) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            await lh.append_many([b"r%d" % i for i in range(100)])
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            for read_ahead in (0, 1, 3):
                got = [e.payload async for e in rh.iter_entries(5, 97, batch=7, read_ahead=read_ahead)]
                assert got == [b"r%d" % i for i in range(5, 98)]
            first = []
            async for e in rh.iter_entries(batch=10, read_ahead=4):  # leaving early cancels the read-ahead
                first.append(e.entry_id)
                if len(first) == 15:
                    break
            assert first == list(range(15))
            return lh.ledger_id

    lid = run(main())
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        rh = client.open_ledger(lid, password=b"pw")
        assert [e.payload for e in rh.iter_entries(batch=9, read_ahead=2)] == [b"r%d" % i for i in range(100)]
        client.delete_ledger(lid)
