"""Recovery adds on read-only bookies (BookKeeper's high-priority writes): a ledger can be closed
while two of its three bookies are read-only because their disks filled up, ordinary adds are
still refused, and a read-only bookie short of its disk reserve refuses recovery adds too.

Each "disk" is a small tmpfs of the test's own (mounting needs root); a ballast file past
``disk_usage_threshold`` turns its bookie read-only at the next disk check."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ledgerstore.aio import Client
from ledgerstore.bookie.server import RECOVERY_ADD_RESERVE_BYTES
from ledgerstore.cluster import LocalCluster
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_RECOVERY_ADD, Status
from ledgerstore.proto.digest import DigestManager, master_key

PW = b"pw"
#: read-only past 10 % of the disk used, writable again below 5 %; checked every 100 ms
DISK_CONFIG = "disk_usage_threshold = 0.1\ndisk_usage_lwm = 0.05\ndisk_check_interval_ms = 100\n"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


@pytest.fixture
def small_disk(tmpfs: Callable[[int], Path]) -> Callable[[int], Path]:
    """Small disks of the test's own (tmpfs, in MiB)."""
    return tmpfs


def on_disk(cluster: LocalCluster, i: int, disk: Path) -> None:
    """Put bookie ``i``'s ledger directory on ``disk`` (its journal stays where it is)."""
    cluster.write_configs()
    cfg = cluster.config_path(i)
    cfg.write_text(cfg.read_text().replace('ledger_dirs = ["ledgers"]', f'ledger_dirs = ["{disk}/ledgers"]'))


def fill(disk: Path, fraction: float) -> None:
    """A ballast file using ``fraction`` of the disk."""
    with open(disk / "ballast", "wb") as fh:
        fh.write(b"\0" * int(shutil.disk_usage(disk).total * fraction))


async def wait_state(client: Client, bookies: set[str], read_only: bool) -> None:
    deadline = time.monotonic() + 30
    while not bookies <= {b.bookie_id for b in await client.list_bookies(read_only=read_only)}:
        assert time.monotonic() < deadline, f"{bookies} never turned {'read-only' if read_only else 'writable'}"
        await asyncio.sleep(0.1)


async def probe_add(client: Client, bookie: str, ledger_id: int, entry_id: int, flags: int) -> int:
    """One add sent straight to ``bookie``; returns its status."""
    entry = DigestManager(ledger_id, "crc32c").sign(entry_id, entry_id - 1, b"probe")
    resp = await client.pool.get(bookie).request(
        lambda rid: codec.encode_add(rid, ledger_id, entry_id, master_key(PW), entry, flags), 10)
    return resp.status


def test_recovery_closes_a_ledger_while_two_of_its_three_bookies_are_read_only(  # type: ignore[no-untyped-def]
        cluster_factory, small_disk) -> None:
    cluster: LocalCluster = cluster_factory(3, extra_bookie_config=DISK_CONFIG)
    # every bookie's ledgers on its own tmpfs: the machine's disk may be past the 10 % threshold
    disks = {i: small_disk(256) for i in (0, 1, 2)}  # 10 % used is far more free space than the reserve
    for i, disk in disks.items():
        on_disk(cluster, i, disk)
    cluster.start()
    full = {cluster.bookie_id(i) for i in (1, 2)}

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as writer:
            lh = await writer.create_ledger(3, 3, 2, password=PW)
            payloads = [b"e-%04d" % i for i in range(200)]
            # all in flight at once: every entry carries LAC -1, so recovery re-replicates all 200
            assert await asyncio.gather(*(lh.append_async(p) for p in payloads)) == list(range(200))
            # the writer goes away without closing; then two of the three disks fill up
        for i in (1, 2):
            fill(disks[i], 0.2)
        async with Client(metadata=cluster.metadata) as client:
            await wait_state(client, full, read_only=True)
            rh = await client.open_ledger(lh.ledger_id, PW, recovery=True)
            assert rh.is_closed and rh.md.last_entry_id == 199
            assert [e.payload for e in await rh.read(0, 199)] == payloads
            # an ordinary add is still refused by a read-only bookie
            for bookie in full:
                assert await probe_add(client, bookie, lh.ledger_id, 200, 0) == Status.READ_ONLY

    run(main())


def test_a_read_only_bookie_short_of_its_disk_reserve_refuses_recovery_adds(  # type: ignore[no-untyped-def]
        cluster_factory, small_disk) -> None:
    cluster: LocalCluster = cluster_factory(1, extra_bookie_config=DISK_CONFIG)
    disk = small_disk(RECOVERY_ADD_RESERVE_BYTES // 2 >> 20)  # the whole disk is smaller than the reserve
    on_disk(cluster, 0, disk)
    cluster.start()
    bookie = cluster.bookie_id(0)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(1, 1, 1, password=PW)
            await lh.append(b"first")
            fill(disk, 0.2)
            await wait_state(client, {bookie}, read_only=True)
            assert await probe_add(client, bookie, lh.ledger_id, 1, FLAG_RECOVERY_ADD) == Status.READ_ONLY
            (disk / "ballast").unlink()
            await wait_state(client, {bookie}, read_only=False)
            assert await probe_add(client, bookie, lh.ledger_id, 1, FLAG_RECOVERY_ADD) == Status.OK

    run(main())
