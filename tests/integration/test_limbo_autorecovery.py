"""Auto-recovery leaves a bookie's limbo ledgers to the bookie's own repair instead of racing it.

Four bookie processes (LocalCluster, sqlite metadata): A, B, C and D. Ledgers are written on
A, B and C (E3 Qw3 Qa2) and closed. B is killed, its journal and ledger directories emptied (its
cookie files kept) and started again: it finds the loss, puts the ledgers in limbo, registers
``ledgers_in_limbo`` and repairs them from A and C, throttled (B's own ``[bookie.autorecovery]``
rate, one entry per request) so that the repair takes long enough for auto-recovery to look at it.
The auditor and the replication workers run inside A, C and D; B runs none (a process that is
being repaired is not where the race is).

- With the replicas check running every second, the auditor finds B short of every ledger it has
  not repaired yet, and leaves those shortfalls to B, saying so in its log: B is never swapped out
  of an ensemble, no under-replication marker is written, and once B registers zero a replicas
  check finds every ledger held. (Without the check's limbo rule the workers copy B's share to D
  and swap B out while it repairs itself.)
- A bookie lost elsewhere in the ensemble (C) while B repairs itself is replaced, and only it: the
  marker names C, the worker copies C's share to D reading it from A (B answers UNKNOWN for what
  it lacks), and the ensembles name A, B, D. ``shell listbookies`` shows B's limbo count meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ledgerstore.aio import Client
from ledgerstore.bookie.cookie import COOKIE_FILE
from ledgerstore.cluster import LocalCluster
from ledgerstore.meta.bookies import BookieRegistry
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.recovery.markers import UnderReplicationManager

A, B, C, D = 0, 1, 2, 3
PW = b"limbo-autorecovery"
SESSION = 4  # seconds a SIGKILLed process's ephemeral keys outlive it
ENV = "LEDGERSTORE_BOOKIE_AUTORECOVERY__"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 300))


def extra_config(**autorecovery: object) -> str:
    settings = {"enabled": True, "lease_s": 4.0, "audit_interval_s": 30.0, **autorecovery}
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    return f"[bookie.metadata_options]\nsession_timeout = {SESSION}\n[bookie.autorecovery]\n" + "\n".join(lines) + "\n"


def four_bookies(cluster_factory: Callable[..., LocalCluster], replicas_check_interval_s: float,
                 repair_entries_per_s: float) -> LocalCluster:
    """A, B, C and D started with auto-recovery (a lost bookie's ledgers marked after 300 s);
    B runs none, and repairs itself one entry per request at ``repair_entries_per_s``."""
    cluster = cluster_factory(4, extra_bookie_config=extra_config(replicas_check_interval_s=replicas_check_interval_s,
                                                                  lost_bookie_recovery_delay_s=300.0))
    cluster.bookie_env[B] = {f"{ENV}ENABLED": "false", f"{ENV}REREPLICATION_ENTRIES_PER_S": str(repair_entries_per_s),
                             f"{ENV}REREPLICATION_ENTRY_BATCH_SIZE": "1"}
    return cluster.start()


def empty_directories(cluster: LocalCluster, i: int) -> None:
    """Bookie ``i``'s journal and ledger directories emptied, their cookie files kept."""
    root = cluster.config_path(i).parent
    for d in (root / "journal", root / "ledgers"):
        for p in d.iterdir():
            if p.name != COOKIE_FILE:
                shutil.rmtree(p) if p.is_dir() else p.unlink()


async def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.2)


async def write_closed_ledgers(client: Client, cluster: LocalCluster, count: int, entries: int) -> list[int]:
    """``count`` closed ledgers of ``entries`` entries on A, B and C, each entry acknowledged by
    all three (Qa 3): with Qa 2, an add A had not stored when the ledger closed (a loaded machine)
    leaves that entry on B and C alone, and the tests lose both."""
    ids = []
    for _ in range(count):
        lh = await client.create_ledger(3, 3, 3, password=PW, bookies=[cluster.bookie_id(i) for i in (A, B, C)])
        await asyncio.gather(*(lh.append_async(f"entry {e}".encode()) for e in range(entries)))
        await lh.close()
        ids.append(lh.ledger_id)
    return ids


async def limbo_count(client: Client, bookie: str) -> int | None:
    """``ledgers_in_limbo`` of ``bookie``'s registration (None: not registered)."""
    infos = {i.bookie_id: i for i in await BookieRegistry(client.store).all()}  # type: ignore[arg-type]
    return infos[bookie].ledgers_in_limbo if bookie in infos else None


def listbookies(cluster: LocalCluster) -> dict[str, int]:
    """``ledgerstore shell listbookies --json``: each bookie's registered ``ledgers_in_limbo``."""
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "shell", "--metadata", cluster.metadata, "listbookies",
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {r["bookie_id"]: r["ledgers_in_limbo"] for r in json.loads(out.stdout)}


def empty_then_restart(cluster: LocalCluster, i: int) -> None:
    cluster.kill(i)
    empty_directories(cluster, i)
    cluster.restart(i)


def log_sizes(cluster: LocalCluster, which: tuple[int, ...]) -> dict[int, int]:
    return {i: cluster.log_path(i).stat().st_size for i in which}


async def ensembles(client: Client, ids: list[int]) -> dict[int, list[list[str]]]:
    return {lid: [list(ens) for _, ens in (await client.ledger_metadata(lid)).ensembles] for lid in ids}


async def holds_every_entry(client: Client, bookie: str, ids: list[int], entries: int) -> None:
    for lid in ids:
        for e in range(entries):
            resp = await client.pool.get(bookie).request(lambda r, lid=lid, e=e: codec.encode_read(r, lid, e), 10)
            assert resp.status == Status.OK, f"ledger {lid} entry {e} on {bookie}: {Status(resp.status).name}"


def test_a_bookie_repairing_its_limbo_ledgers_is_left_to_it_by_the_replicas_check(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = four_bookies(cluster_factory, 1.0, 4.0)  # 6 ledgers x 10 entries: about 15 s of repair
    ledgers, entries = 6, 10
    b = cluster.bookie_id(B)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            ids = await write_closed_ledgers(client, cluster, ledgers, entries)
            before = await ensembles(client, ids)
            empty_then_restart(cluster, B)
            # registered with its limbo count (once the killed process's registration is replaced)
            await wait_until(lambda: _limbo_is(client, b, ledgers), 30, "B to register its limbo count")
            auditors = (A, C, D)
            seen: set[int] = set()

            async def repaired() -> bool:
                count = await limbo_count(client, b)
                seen.add(-1 if count is None else count)
                assert await ensembles(client, ids) == before, "B was swapped out while repairing itself"
                return count == 0

            await wait_until(repaired, 120, "B to repair its limbo ledgers and register 0")
            assert len(seen - {0, -1}) >= 2, f"the count was published as it fell, not only at the end: {seen}"
            assert await _said(cluster, auditors, f"replicas check: bookie {b} is repairing"), \
                "no replicas check ran while B repaired itself: the test proves nothing"
            # once B says it is out of limbo it is checked like any other bookie, and holds everything
            mark = log_sizes(cluster, auditors)
            held = f"every closed ledger is held by its bookies ({ledgers} ledgers, 4 bookies)"
            await wait_until(lambda: _said(cluster, auditors, held, mark), 60, "a replicas check that includes B")
            assert not await UnderReplicationManager(client.store).ledger_ids()  # type: ignore[arg-type]
            assert await ensembles(client, ids) == before
            await holds_every_entry(client, b, ids, entries)

    run(main())


def test_a_worker_replaces_the_lost_bookie_but_not_the_one_repairing_itself(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = four_bookies(cluster_factory, 0.0, 1.0)  # 3 ledgers x 10 entries: about 30 s of repair
    ledgers, entries = 3, 10
    a, b, c, d = (cluster.bookie_id(i) for i in (A, B, C, D))

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            urm = UnderReplicationManager(client.store)  # type: ignore[arg-type]
            ids = await write_closed_ledgers(client, cluster, ledgers, entries)
            empty_then_restart(cluster, B)
            await wait_until(lambda: _limbo_is(client, b, ledgers), 30, "B to register its limbo count")
            rows = await asyncio.to_thread(listbookies, cluster)
            assert 0 < rows[b] <= ledgers and [rows[x] for x in (a, c, d)] == [0, 0, 0], rows
            await urm.set_lost_bookie_delay(0)  # from now on a bookie gone is lost at once
            cluster.kill(C)
            await wait_until(lambda: _names_no(client, ids, c), 120, "C to be replaced in every ledger")
            await wait_until(lambda: _no_markers(urm), 30, "the markers to be done")
            count = await limbo_count(client, b)
            assert count is not None and count > 0, "B finished its repair first: the test proves nothing"
            assert await ensembles(client, ids) == {lid: [[a, b, d]] for lid in ids}
            await holds_every_entry(client, d, ids, entries)
            await wait_until(lambda: _limbo_is(client, b, 0), 120, "B to finish its repair")
            await holds_every_entry(client, b, ids, entries)
            assert await ensembles(client, ids) == {lid: [[a, b, d]] for lid in ids}

    run(main())


async def _said(cluster: LocalCluster, which: tuple[int, ...], text: str, after: dict[int, int] | None = None) -> bool:
    """Whether the log of one of bookies ``which`` says ``text`` (past the offsets ``after``)."""
    for i in which:
        with open(cluster.log_path(i), "rb") as fh:
            fh.seek((after or {}).get(i, 0))
            if text in fh.read().decode(errors="replace"):
                return True
    return False


async def _names_no(client: Client, ids: list[int], bookie: str) -> bool:
    return all(bookie not in md.bookies() for md in [await client.ledger_metadata(lid) for lid in ids])


async def _no_markers(urm: UnderReplicationManager) -> bool:
    return not await urm.ledger_ids()


async def _limbo_is(client: Client, bookie: str, count: int) -> bool:
    return await limbo_count(client, bookie) == count
