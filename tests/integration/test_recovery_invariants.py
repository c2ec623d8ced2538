"""Recovery and auto-recovery never lose an acknowledged entry, never let a fenced writer commit,
and never write an ensemble that names one bookie twice.

Each test builds its interleaving step by step with the fault-injecting transport
(:mod:`ledgerstore.testing.faults`) against real bookie processes: a request held, dropped or
delayed to one named bookie, a writer paused (its frames held) and woken after it was fenced.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import InvalidArgumentError, InvalidMetadataError, LedgerFencedError, LedgerStoreError
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, Op, Status
from ledgerstore.proto.digest import DigestManager
from ledgerstore.recovery.markers import UnderReplicationManager
from ledgerstore.recovery.worker import ReplicationWorker
from ledgerstore.testing.faults import FaultInjector, FrameInfo

PW = b"pw"
ADDS = {Op.ADD, Op.ADD_BATCH}


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 240))


def is_entry(eid: int):  # type: ignore[no-untyped-def]
    return lambda info: eid in info.entry_ids


def fenced_read_lac(info: FrameInfo) -> bool:
    return info.op == Op.READ_LAC and bool(info.flags & FLAG_FENCE)


async def replicas_holding(client: Client, md: LedgerMetadata, eid: int) -> list[str]:
    """Bookies of ``eid``'s write set (as the metadata now says) that hold a valid copy of it."""
    _, ensemble = md.ensemble_for(eid)
    digest = DigestManager(md.ledger_id, md.digest_type, PW)
    holders = []
    for i in md.write_set(eid):
        resp = await client.pool.get(ensemble[i]).request(
            lambda rid: codec.encode_read(rid, md.ledger_id, eid), client.config.read_timeout_s)
        if resp.status == Status.OK:
            digest.verify(resp.entry, eid)
            holders.append(ensemble[i])
    return holders


async def rereplicate(client: Client, ledger_id: int, missing: set[str], **settings: float) -> None:
    """Run one replication worker over ``ledger_id``'s marker until the marker is gone."""
    markers = UnderReplicationManager(client.store)  # type: ignore[arg-type]
    await markers.mark(ledger_id, missing)
    cfg = dataclasses.replace(AutoRecoveryConfig(), open_ledger_rereplication_grace_s=0.0, lease_s=60.0,
                              **settings)
    worker = ReplicationWorker(client, cfg, "test-worker", obey_switch=False)
    m, _ = await markers.claim(ledger_id, "test-worker", cfg.lease_s)
    assert m is not None
    assert await worker.process(m)


async def auto_recover_while_decommissioning(client: Client, ledger_id: int, decommissioned: str,
                                             unreachable: str) -> LedgerMetadata:
    """``decommissioned`` is being decommissioned and every request of ``client`` to
    ``unreachable`` is lost; a worker on ``client`` re-replicates the ledger. Returns its metadata."""
    markers = UnderReplicationManager(client.store)  # type: ignore[arg-type]
    await markers.start_decommission(decommissioned)
    FaultInjector().install(client).drop(unreachable)
    await rereplicate(client, ledger_id, {decommissioned})
    return await client.ledger_metadata(ledger_id)


def test_auto_recovery_of_an_open_ledger_keeps_an_entry_acked_by_a_decommissioned_bookie(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """E3 Qw3 Qa2: entry 10 is acknowledged by b1 and b2 only; b2 is being decommissioned and the
    worker's requests to b1 are lost. Recovering the ledger as its metadata names it still finds
    entry 10 on b2 (the swapped-in empty replacement would have answered "no such entry").
    Five bookies: b1 is registered but unreachable to the worker, so two spares are needed."""
    cluster: LocalCluster = cluster_factory(5)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=120) as writer, \
                Client(metadata=cluster.metadata, read_timeout_s=1.5, add_timeout_s=1.5) as worker_client:
            wf = FaultInjector().install(writer)
            lh = await writer.create_ledger(3, 3, 2, password=PW)
            b0, b1, b2 = lh.md.current_ensemble
            for i in range(10):
                await lh.append(b"e%d" % i)
            hold_b0 = wf.hold(b0, ops=ADDS, match=is_entry(10))
            assert await lh.append(b"e10") == 10  # acknowledged by b1 and b2
            hold_b0.discard()

            md = await auto_recover_while_decommissioning(worker_client, lh.ledger_id, b2, b1)
            assert md.state is LedgerState.CLOSED
            assert md.last_entry_id == 10, f"acknowledged entry 10 lost: closed at {md.last_entry_id}"
            assert b2 not in md.bookies(), md.ensembles
            with pytest.raises(LedgerFencedError):
                await lh.append(b"after")
        async with Client(metadata=cluster.metadata) as reader:
            rh = await reader.open_ledger(lh.ledger_id, password=PW)
            assert [e.payload for e in await rh.read(0, 10)] == [b"e%d" % i for i in range(11)]

    run(main())


def test_auto_recovery_never_counts_an_unfenced_replacement_as_fenced(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """Every request of the worker to b1 is lost while b2 is decommissioned. Recovery must fence
    the ensemble the live writer writes to (b0 and b2 here): afterwards the writer cannot get one
    more entry acknowledged. Swapping b2 for an empty bookie first would count b0 and that bookie
    as the fenced pair, and b1 with the unfenced b2 would acknowledge the writer's next entry."""
    cluster: LocalCluster = cluster_factory(5)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=120) as writer, \
                Client(metadata=cluster.metadata, read_timeout_s=1.5, add_timeout_s=1.5) as worker_client:
            wf = FaultInjector().install(writer)
            lh = await writer.create_ledger(3, 3, 2, password=PW)
            b0, b1, b2 = lh.md.current_ensemble
            for i in range(20):
                await lh.append(b"e%d" % i)
            md = await auto_recover_while_decommissioning(worker_client, lh.ledger_id, b2, b1)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 19

            # the live writer wakes; b0's answers come last (held), so b1 and b2 decide
            wf.hold(b0, ops=ADDS)
            acked = []
            for i in range(20, 25):
                try:
                    acked.append(await asyncio.wait_for(lh.append(b"e%d" % i), 30))
                except LedgerStoreError:
                    break
            assert not acked, f"entries {acked} acknowledged after the ledger was closed at 19"

    run(main())


def test_recovery_completes_with_a_dead_bookie_when_a_spare_exists(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """E3 Qw2 Qa2 with one bookie of the last fragment killed: recovery's write-back replaces it
    through the placement policy (in memory, committed with the close) instead of failing."""
    cluster: LocalCluster = cluster_factory(4)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=120) as writer:
            lh = await writer.create_ledger(3, 2, 2, password=PW)
            ensemble = list(lh.md.current_ensemble)
            await asyncio.gather(*(lh.append_async(b"e%d" % i) for i in range(100)))
            # the bookies' LAC is 98 (carried by entry 99): recovery writes entry 99 back, and the
            # dead bookie is in its write set
            victim = ensemble[lh.md.write_set(99)[0]]
        cluster.kill(next(i for i in range(4) if cluster.bookie_id(i) == victim))
        async with Client(metadata=cluster.metadata, read_timeout_s=2, add_timeout_s=2) as rc:
            rh = await rc.open_ledger(lh.ledger_id, password=PW)
            md = rh.metadata
            assert md.is_closed and md.last_entry_id == 99
            assert all(len(set(b)) == len(b) for _, b in md.ensembles)
            assert victim not in md.ensemble_for(99)[1], md.ensembles
            assert [e.payload for e in await rh.read(0, 99)] == [b"e%d" % i for i in range(100)]
            assert len(await replicas_holding(rc, md, 99)) == 2
            assert rh.length == sum(len(b"e%d" % i) for i in range(100))

    run(main())


def test_an_ensemble_never_holds_the_same_bookie_twice(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """Two bookies of a closed fragment leave at once (decommissioned): their replacements are
    chosen one after another, so the fragment ends with three distinct bookies, every entry on
    each of them. Ten ledgers: picking each against the old ensemble alone collides in half."""
    cluster: LocalCluster = cluster_factory(5)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            first3 = [cluster.bookie_id(i) for i in range(3)]
            lids = []
            for n in range(10):
                lh = await client.create_ledger(3, 3, 2, password=PW, bookies=first3)
                await asyncio.gather(*(lh.append_async(b"l%d-%d" % (n, i)) for i in range(20)))
                await lh.close()
                lids.append(lh.ledger_id)
            markers = UnderReplicationManager(client.store)  # type: ignore[arg-type]
            for b in first3[1:]:
                await markers.start_decommission(b)
            for lid in lids:
                await rereplicate(client, lid, set(first3[1:]))
                md = await client.ledger_metadata(lid)
                for _, bookies in md.ensembles:
                    assert len(set(bookies)) == 3, f"ledger {lid}: {md.ensembles}"
                    assert not set(bookies) & set(first3[1:])
                for eid in range(20):
                    assert len(await replicas_holding(client, md, eid)) == 3

            # and no path can write such an ensemble: the metadata manager refuses it
            md = await client.ledger_metadata(lids[0])
            dup = [md.ensembles[0][1][0]] * 2 + [md.ensembles[0][1][2]]
            with pytest.raises(InvalidMetadataError, match="more than once"):
                await client.ledgers.write(LedgerMetadata(**{**md.__dict__, "ensembles": [(0, dup)]}))
            assert (await client.ledger_metadata(lids[0])).ensembles == md.ensembles

    run(main())


def test_a_fenced_writer_cannot_commit_after_recovery_closed_the_ledger(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """BookKeeper #2614. E3 Qw3 Qa2. The writer's entry 1 reaches b3 only (held for b1 and b2);
    the recoverer's fence to b2 is lost (b1 and b3 fenced suffice), its read of entry 1 from b3
    is held, and b1 and b2 answer "no such entry": recovery closes at 0. Then the writer's held
    add reaches b2. Only a fencing recovery read has fenced b2 by then; otherwise b2 and b3
    acknowledge entry 1 of a ledger closed at 0."""
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=120) as w1, \
                Client(metadata=cluster.metadata, read_timeout_s=2) as w2:
            wf = FaultInjector().install(w1)
            lh = await w1.create_ledger(3, 3, 2, password=PW)
            b1, b2, b3 = lh.md.current_ensemble
            assert await lh.append(b"e0") == 0
            wf.hold(b1, ops=ADDS, match=is_entry(1))  # never arrives
            held_b2 = wf.hold(b2, ops=ADDS, match=is_entry(1))
            acked_to_b3 = asyncio.Event()
            lh.ack_observer = lambda eid, bid: acked_to_b3.set() if (eid, bid) == (1, b3) else None
            add1 = lh.append_async(b"e1")
            await asyncio.wait_for(acked_to_b3.wait(), 30)

            rf = FaultInjector().install(w2)
            rf.drop(b2, match=fenced_read_lac)
            rf.hold(b3, ops={Op.READ}, match=is_entry(1))
            rh = await w2.open_ledger(lh.ledger_id, password=PW)
            assert rh.metadata.is_closed and rh.metadata.last_entry_id == 0

            held_b2.release()  # entry 1 reaches b2 after the close
            with pytest.raises(LedgerFencedError):
                await asyncio.wait_for(add1, 30)

    run(main())


def test_recovery_never_rewrites_a_fragment_before_the_current_one(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """BookKeeper #2615. E2 Qw2 Qa2: entries 0..9 on {b1, b2}; entry 10 fails on both, so the
    writer moves to {b3, b4} from entry 10 and pauses before entry 10 reaches them. The new
    bookies report no LAC. Recovery must start reading at entry 10 (the current fragment), not at
    LAC+1 = 0: re-writing entry 0 with b2 failing would put a new fragment at 0, after 10."""
    cluster: LocalCluster = cluster_factory(5)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=2) as w1, \
                Client(metadata=cluster.metadata, read_timeout_s=2, add_timeout_s=2) as w2:
            wf = FaultInjector().install(w1)
            lh = await w1.create_ledger(2, 2, 2, password=PW)
            b1, b2 = lh.md.current_ensemble
            for i in range(10):
                await lh.append(b"e%d" % i)
            wf.drop(b1, ops=ADDS)
            wf.drop(b2, ops=ADDS)
            paused = wf.hold(None, ops=ADDS, match=lambda info: info.bookie not in (b1, b2))
            add10 = lh.append_async(b"e10")
            await paused.wait_hits(1, timeout=60)  # the ensemble changed and entry 10 went out again
            md = await w2.ledger_metadata(lh.ledger_id)
            assert [f for f, _ in md.ensembles] == [0, 10], md.ensembles

            FaultInjector().install(w2).drop(b2, ops=ADDS)  # a write-back to b2 would fail
            rh = await w2.open_ledger(lh.ledger_id, password=PW)
            closed = rh.metadata
            assert closed.last_entry_id == 9
            assert closed.ensembles == md.ensembles, closed.ensembles
            assert [e.payload for e in await rh.read(0, 9)] == [b"e%d" % i for i in range(10)]
            paused.release()
            with pytest.raises(LedgerStoreError):
                await asyncio.wait_for(add10, 30)

    run(main())


def test_a_payload_larger_than_a_frame_is_refused_before_sending_and_the_handle_stays_usable(shared_cluster) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with Client(metadata=shared_cluster.metadata, max_frame_size=64 * 1024) as client:
            lh = await client.create_ledger(3, 2, 2, password=PW)
            assert await lh.append(b"small") == 0
            with pytest.raises(InvalidArgumentError, match="does not fit a frame"):
                await lh.append(b"x" * 64 * 1024)
            with pytest.raises(InvalidArgumentError, match="does not fit a frame"):
                await lh.append_many([b"ok", b"y" * 70_000])
            assert await lh.append(b"still fine") == 1
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=PW)
            assert [e.payload for e in await rh.read(0, 1)] == [b"small", b"still fine"]

    run(main())


def test_a_replication_worker_leaves_a_quarantined_bookie_out_of_its_replacements(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """The worker chooses replacements through its client's health, as a writer's ensemble change
    does: with b3 quarantined by that client, every fragment of b0 (being decommissioned) goes to
    b4, the only other candidate; at random each ledger would pick b3 half of the time."""
    cluster: LocalCluster = cluster_factory(5)
    cluster.start()
    b = [cluster.bookie_id(i) for i in range(5)]

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            ledgers = []
            for _ in range(8):
                lh = await client.create_ledger(3, 2, 2, password=PW, bookies=b[:3])
                for i in range(10):
                    await lh.append(b"entry %d" % i)
                await lh.close()
                ledgers.append(lh.ledger_id)
            assert client.health.quarantine(b[3], 600)
            await UnderReplicationManager(client.store).start_decommission(b[0])  # type: ignore[arg-type]
            for lid in ledgers:
                await rereplicate(client, lid, {b[0]})
                md = await client.ledger_metadata(lid)
                assert md.current_ensemble == [b[4], b[1], b[2]], md.ensembles
                rh = await client.open_ledger(lid, password=PW)
                assert [e.payload for e in await rh.read(0, 9)] == [b"entry %d" % i for i in range(10)]

    run(main())
