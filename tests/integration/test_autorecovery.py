"""Auto-recovery on every metadata backend: bookies are real processes killed with SIGKILL; the
auditor and the replication workers run inside the bookies (``[bookie.autorecovery]``).

Each test checks the end state directly on the bookies: every entry of every ledger is on each
bookie of its write set (read from that bookie alone, digest verified, byte-equal to what was
written), and no ledger's metadata names the lost or decommissioned bookie."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DigestManager
from ledgerstore.recovery.markers import UnderReplicationManager
from tests.conftest import ClusterConfig

BACKENDS = ["sqlite", "zk", "etcd"]
SESSION = 4  # seconds a SIGKILLed process's ephemeral keys outlive it


def extra_config(**autorecovery: object) -> str:
    settings = {"enabled": True, "lost_bookie_recovery_delay_s": 2.0, "open_ledger_rereplication_grace_s": 3.0,
                "lease_s": 4.0, "audit_interval_s": 30.0, **autorecovery}
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    return f"[bookie.metadata_options]\nsession_timeout = {SESSION}\n[bookie.autorecovery]\n" + "\n".join(lines) + "\n"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 240))


def password(lid_index: int) -> bytes:
    return f"pw-{lid_index}".encode()


async def write_ledgers(client: Client, count: int, entries: int, size: int, leave_open: int = 0
                        ) -> tuple[dict[int, list[bytes]], dict[int, bytes], list[object]]:
    """``count`` ledgers (E3/Qw2/Qa2) of ``entries`` entries; the last ``leave_open`` stay open
    (their handles are returned so the writers stay alive)."""
    payloads: dict[int, list[bytes]] = {}
    passwords: dict[int, bytes] = {}
    open_handles: list[object] = []

    async def one(i: int) -> None:
        pw = password(i)
        digest = "hmac-sha256" if i % 4 == 0 else "crc32c"
        lh = await client.create_ledger(3, 2, 2, digest=digest, password=pw)
        data = [os.urandom(size) for _ in range(entries)]
        await asyncio.gather(*(lh.append_async(p) for p in data))
        payloads[lh.ledger_id], passwords[lh.ledger_id] = data, pw
        if i >= count - leave_open:
            open_handles.append(lh)
        else:
            await lh.close()

    for at in range(0, count, 25):
        await asyncio.gather(*(one(i) for i in range(at, min(count, at + 25))))
    return payloads, passwords, open_handles


async def wait_until(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.25) -> float:
    t0 = time.monotonic()
    while True:
        if await cond():  # type: ignore[misc]
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def all_metadata(client: Client) -> dict[int, LedgerMetadata]:
    return {lid: await client.ledger_metadata(lid) for lid in await client.list_ledgers()}


async def rereplicated(client: Client, gone: str) -> bool:
    """No ledger names ``gone`` and no marker is left."""
    mds = await all_metadata(client)
    if any(gone in md.bookies() for md in mds.values()):
        return False
    return not await UnderReplicationManager(client.store).ledger_ids()  # type: ignore[arg-type]


async def verify_replicas(client: Client, payloads: dict[int, list[bytes]], passwords: dict[int, bytes],
                          gone: str) -> None:
    """Every entry is on every bookie of its write set, digest-valid and byte-equal. (Ledgers left
    open by their writer stay open unless auto-recovery had to close them.)"""
    for lid, data in payloads.items():
        md = await client.ledger_metadata(lid)
        if md.state is LedgerState.CLOSED:
            assert md.last_entry_id == len(data) - 1, (lid, md.last_entry_id, len(data))
        assert gone not in md.bookies(), f"ledger {lid} still names {gone}: {md.ensembles}"
        dm = DigestManager(lid, md.digest_type, passwords[lid])
        reads = []
        for e in range(len(data)):
            _, ensemble = md.ensemble_for(e)
            for idx in md.write_set(e):
                reads.append((e, ensemble[idx], client.pool.get(ensemble[idx]).request(
                    lambda rid, e=e, lid=lid: codec.encode_read(rid, lid, e), 10)))
        for (e, bid, fut) in reads:
            resp = await fut
            assert resp.status == Status.OK, f"ledger {lid} entry {e} missing on {bid}: {Status(resp.status).name}"
            assert dm.verify(resp.entry, e).payload == data[e], f"ledger {lid} entry {e} differs on {bid}"
        rh = await client.open_ledger(lid, passwords[lid], recovery=False)
        got = await rh.read(0, len(data) - 1, allow_beyond_lac=True)
        assert [x.payload for x in got] == data


def copies_needed(mds: dict[int, LedgerMetadata], payloads: dict[int, list[bytes]], gone: str) -> tuple[int, int]:
    """Entries (and their payload bytes) whose write set included ``gone``."""
    n = size = 0
    for lid, md in mds.items():
        for e, p in enumerate(payloads.get(lid, [])):
            _, ensemble = md.ensemble_for(e)
            if any(ensemble[i] == gone for i in md.write_set(e)):
                n += 1
                size += len(p)
    return n, size


def start(cluster_factory, backend: str, bookies: int = 5, **autorecovery: object) -> LocalCluster:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(bookies, ClusterConfig(backend, "entrylog", "tcp"),
                                            extra_bookie_config=extra_config(**autorecovery))
    return cluster.start()


async def shell(cluster: LocalCluster, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ledgerstore", "shell", "--metadata", cluster.metadata, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.mark.parametrize("backend", BACKENDS)
def test_lost_bookie_is_rereplicated_by_autorecovery(cluster_factory, backend: str) -> None:  # type: ignore[no-untyped-def]
    cluster = start(cluster_factory, backend)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            payloads, passwords, open_handles = await write_ledgers(client, 100, 50, 1024, leave_open=4)
            code, out = await shell(cluster, "whoisauditor", "--json")
            assert code == 0, out
            auditor = json.loads(out)["auditor"]
            assert auditor == min(cluster.bookie_id(i) for i in range(5))
            victim = 4 if cluster.bookie_id(4) != auditor else 3
            gone = cluster.bookie_id(victim)
            before = await all_metadata(client)
            needed, needed_bytes = copies_needed(before, payloads, gone)
            assert needed > 0

            cluster.kill(victim)
            urm = UnderReplicationManager(client.store)  # type: ignore[arg-type]
            await wait_until(lambda: _has_markers(urm), 60, "the auditor to mark ledgers", 0.05)
            t_marked = time.monotonic()
            open_ids = {h.ledger_id for h in open_handles}  # type: ignore[attr-defined]
            closed = {lid: md for lid, md in before.items() if lid not in open_ids}

            async def closed_ledgers_done() -> bool:
                for lid in closed:
                    if gone in (await client.ledger_metadata(lid)).bookies():
                        return False
                return True

            closed_s = await wait_until(closed_ledgers_done, 120, "the closed ledgers to move off", 0.05)
            await wait_until(lambda: rereplicated(client, gone), 120, f"every ledger to move off {gone}")
            elapsed = time.monotonic() - t_marked
            await verify_replicas(client, payloads, passwords, gone)
            n_closed, bytes_closed = copies_needed(closed, payloads, gone)
            print(f"\n[{backend}] closed ledgers: {n_closed} entries ({bytes_closed / 1e6:.2f} MB) of "
                  f"{sum(gone in md.bookies() for md in closed.values())} ledgers re-replicated {closed_s:.2f}s after "
                  f"marking: {n_closed / closed_s:.0f} entries/s, {bytes_closed / closed_s / 1e6:.2f} MB/s; all "
                  f"{needed} entries ({needed_bytes / 1e6:.2f} MB, with {len(open_handles)} open ledgers held back "
                  f"by the 3s grace period) in {elapsed:.2f}s")

    run(main())


async def _has_markers(urm: UnderReplicationManager) -> bool:
    return bool(await urm.ledger_ids())


@pytest.mark.parametrize("backend", BACKENDS)
def test_killing_the_auditor_and_a_worker_mid_way_does_not_stop_recovery(cluster_factory, backend: str) -> None:  # type: ignore[no-untyped-def]
    # throttled so that re-replication is still under way when the auditor and a worker are killed
    cluster = start(cluster_factory, backend, rereplication_entries_per_s=60.0, parallel_ledgers=2)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            payloads, passwords, _ = await write_ledgers(client, 60, 40, 512)
            ids = {cluster.bookie_id(i): i for i in range(5)}
            victim = max(ids)  # never the auditor (the smallest id)
            gone = victim
            cluster.kill(ids[victim])
            urm = UnderReplicationManager(client.store)  # type: ignore[arg-type]
            claimed: dict[str, int] = {}

            async def some_claim_by_another_worker() -> bool:
                auditor = await urm.auditor()
                for m in await urm.all():
                    if m.owner and m.owner not in (auditor, victim) and m.owner in ids:
                        claimed[m.owner] = m.ledger_id
                        return True
                return False

            await wait_until(some_claim_by_another_worker, 60, "a worker to claim a marker", 0.05)
            auditor = await urm.auditor()
            assert auditor in ids and auditor != victim
            worker = next(iter(claimed))
            left_before = len(await urm.ledger_ids())
            cluster.kill(ids[auditor])
            cluster.kill(ids[worker])
            assert left_before > 0, "re-replication finished before the kill: the test proves nothing"
            await asyncio.sleep(1.0)
            await asyncio.to_thread(cluster.restart, ids[auditor])
            await asyncio.to_thread(cluster.restart, ids[worker])

            await wait_until(lambda: rereplicated(client, gone), 150, f"every ledger to move off {gone}")
            await verify_replicas(client, payloads, passwords, gone)
            assert await urm.auditor() in ids

    run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_decommission_live_bookie_under_write_load(cluster_factory, backend: str) -> None:  # type: ignore[no-untyped-def]
    cluster = start(cluster_factory, backend)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            payloads, passwords, _ = await write_ledgers(client, 30, 30, 512)
            target = cluster.bookie_id(2)
            stop = asyncio.Event()
            tail = await client.create_ledger(3, 2, 2, password=b"tail")
            tail_data: list[bytes] = []

            async def tail_writer() -> None:
                while not stop.is_set():
                    p = os.urandom(200)
                    await tail.append(p)
                    tail_data.append(p)
                    await asyncio.sleep(0.01)

            async def roller() -> None:
                i = 1000
                while not stop.is_set():
                    pw = password(i)
                    lh = await client.create_ledger(3, 2, 2, password=pw)
                    data = [os.urandom(300) for _ in range(20)]
                    await asyncio.gather(*(lh.append_async(p) for p in data))
                    await lh.close()
                    payloads[lh.ledger_id], passwords[lh.ledger_id] = data, pw
                    i += 1

            load = [asyncio.create_task(tail_writer()), asyncio.create_task(roller())]
            await asyncio.sleep(1.0)
            code, out = await shell(cluster, "decommissionbookie", target, "--json", "--timeout", "150")
            assert code == 0, out
            result = json.loads(out)
            assert result["bookie_id"] == target and result["cookie_deleted"]
            stop.set()
            await asyncio.gather(*load)
            await tail.close()
            payloads[tail.ledger_id], passwords[tail.ledger_id] = tail_data, b"tail"
            assert len(tail_data) > 20, "the tail writer made no progress during the decommission"

            assert not any(target in md.bookies() for md in (await all_metadata(client)).values())
            from ledgerstore.meta.bookies import CookieManager

            assert await CookieManager(client.store).get(target) is None  # type: ignore[arg-type]
            infos = {b.bookie_id: b for b in await client.list_bookies()}
            assert infos[target].read_only, "a decommissioned bookie that runs auto-recovery turns read-only"
            await verify_replicas(client, payloads, passwords, target)
            code, out = await shell(cluster, "listunderreplicated", "--json")
            assert code == 0 and json.loads(out) == [], out

    run(main())


def test_shell_recover_rereplicates_a_dead_bookie_without_any_autorecovery_process(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(4, ClusterConfig("sqlite", "entrylog", "tcp"),
                                            extra_bookie_config=f"[bookie.metadata_options]\nsession_timeout = {SESSION}\n")
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            payloads, passwords, open_handles = await write_ledgers(client, 20, 20, 256, leave_open=1)
            code, out = await shell(cluster, "whoisauditor", "--json")
            assert code == 3 and json.loads(out)["auditor"] is None, out
            code, out = await shell(cluster, "autorecovery", "--disable", "--json")
            assert code == 0 and json.loads(out) == {"enabled": False}, out
            code, out = await shell(cluster, "recover", "127.0.0.1:1", "--json")
            assert code == 3, out

            gone = cluster.bookie_id(3)
            cluster.kill(3)
            await wait_until(lambda: _unregistered(client, gone), 30, f"{gone}'s registration to expire")
            # an explicit recover works even while auto-recovery is disabled cluster-wide
            code, out = await shell(cluster, "recover", gone, "--json", "--open-ledger-grace", "0", "--delete-cookie",
                                    "--timeout", "60")
            assert code == 0, out
            result = json.loads(out)
            assert result["ledgers"] > 0 and result["entries_copied"] > 0 and result["cookie_deleted"]
            await verify_replicas(client, payloads, passwords, gone)
            from ledgerstore.meta.bookies import CookieManager

            assert await CookieManager(client.store).get(gone) is None  # type: ignore[arg-type]
            code, out = await shell(cluster, "listunderreplicated", "--json")
            assert code == 0 and json.loads(out) == [], out

    run(main())


async def _unregistered(client: Client, bookie_id: str) -> bool:
    return bookie_id not in {b.bookie_id for b in await client.list_bookies()}
