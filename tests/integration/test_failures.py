"""The protocol under failure: ensemble change, concurrent recovery, reads falling back."""

from __future__ import annotations

import asyncio
import time

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.meta.ledgers import LedgerState
from tests.integration.writer_proc import run_and_kill


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


def test_writes_continue_through_a_bookie_loss_with_a_new_fragment(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(4)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=3) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            victim_id = lh.md.ensembles[0][1][1]
            victim = next(i for i in range(4) if cluster.bookie_id(i) == victim_id)
            acked: list[int] = []
            rates: list[float] = []
            i = 0
            killed_at = None
            t_end = time.monotonic() + 30
            while time.monotonic() < t_end:
                t0 = time.perf_counter()
                futs = [lh.append_async(b"p%d" % (i + k)) for k in range(200)]
                i += 200
                acked.extend(await asyncio.gather(*futs))  # no add may fail: a spare bookie exists
                rates.append(200 / (time.perf_counter() - t0))
                if killed_at is None and len(acked) >= 4000:
                    cluster.kill(victim)
                    killed_at = len(rates)
                if killed_at is not None and len(rates) > killed_at + 20:
                    break
            assert acked == list(range(len(acked)))
            md = await client.ledger_metadata(lh.ledger_id)
            assert len(md.ensembles) == 2, md.ensembles
            first, new = md.ensembles[1]
            assert victim_id not in new and 0 < first <= 4400
            # once the new fragment is in place no round of 200 adds waits on the lost bookie:
            # a writer still waiting for it would manage one round per add timeout at best
            after = rates[killed_at + 5 :]
            assert after and min(after) > 200 / client.config.add_timeout_s, after
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            got = await rh.read(0, len(acked) - 1)
            assert [e.payload for e in got] == [b"p%d" % e for e in acked]

    run(main())


def test_reads_fall_back_when_a_replica_is_down(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, read_timeout_s=2, speculative_read_timeout_ms=200) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"pw")
            await asyncio.gather(*(lh.append_async(b"e%d" % i) for i in range(300)))
            await lh.close()
            cluster.kill(0)
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 299)] == [b"e%d" % i for i in range(300)]

    run(main())


def test_two_recoverers_race_to_the_same_last_entry(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()
    ledger_id, last_ack = run_and_kill(cluster.metadata, until_ack=2000)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as a, Client(metadata=cluster.metadata) as b:
            ra, rb = await asyncio.gather(a.open_ledger(ledger_id, b"pw"), b.open_ledger(ledger_id, b"pw"))
            assert ra.last_add_confirmed == rb.last_add_confirmed >= last_ack
            md = await a.ledger_metadata(ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == ra.last_add_confirmed
            got = await ra.read(0, md.last_entry_id)
            assert [e.payload for e in got] == [b"entry-%08d" % i for i in range(md.last_entry_id + 1)]

    run(main())
