"""Disk faults in the simulation: writes that fail (EIO, ENOSPC) and reads with a flipped bit."""

from __future__ import annotations

import logging
import random

from ledgerstore.sim import run_seed
from ledgerstore.sim.disk import DiskFaults
from ledgerstore.sim.world import World
from tests.sim._worlds import closed_ledger, in_world


def setup_module() -> None:
    logging.disable(logging.CRITICAL)  # the code under test logs every fault it survives


def teardown_module() -> None:
    logging.disable(logging.NOTSET)


def test_a_flipped_bit_fails_the_digest_and_the_entry_is_read_from_another_replica() -> None:
    async def scenario(world: World) -> tuple[list[bytes], int]:
        await world.start_bookies()
        lh = await closed_ledger(world, 30, "entry {}")
        for b in world.bookies:  # every read of two of the three replicas comes back damaged
            if b.bookie_id != lh.metadata.ensembles[0][1][2]:
                b.engine_disk.faults = DiskFaults(flip=1.0, rng=random.Random(1))
        reader = await world.client("reader").start()
        rh = await reader.open_ledger(lh.ledger_id, b"sim", recovery=False)
        entries = await rh.read(0, 29)
        flipped = sum(e.flipped for b in world.bookies if (e := b.engine()) is not None)
        return [e.payload for e in entries], flipped

    payloads, flipped = in_world(0, 3, scenario)
    assert payloads == [f"entry {i}".encode() for i in range(30)]
    assert flipped >= 30


def test_a_disk_that_fails_every_write_moves_the_writer_to_another_bookie() -> None:
    async def scenario(world: World) -> tuple[list[int], list[str], list[bytes]]:
        await world.start_bookies()
        writer = await world.client("writer").start()
        lh = await writer.create_ledger(3, 3, 3, password=b"sim")
        await lh.append(b"before")
        failing = world.bookie(lh.metadata.ensembles[0][1][0].split(":")[0])
        failing.engine_disk.faults = DiskFaults(write_error=1.0)
        ids = [await lh.append(f"after {i}".encode()) for i in range(10)]
        await lh.close()
        reader = await world.client("reader").start()
        rh = await reader.open_ledger(lh.ledger_id, b"sim")
        return ids, rh.metadata.ensembles[-1][1], [e.payload for e in await rh.read(0, 10)]

    ids, last_ensemble, payloads = in_world(0, 4, scenario)
    assert ids == list(range(1, 11))
    assert len(set(last_ensemble)) == 3
    assert payloads == [b"before", *(f"after {i}".encode() for i in range(10))]


def test_a_full_disk_fails_its_adds_and_the_writer_carries_on() -> None:
    """ENOSPC on every write of one bookie: its adds fail (the bookie checks its disks, which the
    simulation does not fill: free space is read from the real file system), and the writer
    replaces it by an ensemble change without losing an entry."""
    async def scenario(world: World) -> tuple[list[int], list[str], str]:
        await world.start_bookies()
        writer = await world.client("writer").start()
        lh = await writer.create_ledger(3, 2, 2, password=b"sim")
        full = world.bookie(lh.metadata.ensembles[0][1][0].split(":")[0])
        full.engine_disk.faults = DiskFaults(write_error=1.0, full=True)
        ids = [await lh.append(f"{i}".encode()) for i in range(10)]
        return ids, lh.metadata.ensembles[-1][1], full.bookie_id

    ids, ensemble, full = in_world(0, 4, scenario)
    assert ids == list(range(10))
    assert full not in ensemble and len(set(ensemble)) == 3


def test_seeds_with_disk_faults_replay_the_same_and_keep_every_invariant() -> None:
    first = run_seed(5, duration=20)
    assert first.ok, first.violations
    assert first.stats["disk_faults"] > 0
    assert run_seed(5, duration=20).trace_hash == first.trace_hash
