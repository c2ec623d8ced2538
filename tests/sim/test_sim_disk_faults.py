"""Disk faults in the simulation: writes that fail (EIO, ENOSPC) and reads with a flipped bit,
faults aimed at the journal's steps (a crash before an fsync, a torn write, a failed write or
fsync, a crash inside a checkpoint), and crashes inside the entry-log engine's compaction and GC,
which lose nothing a bookie acknowledged."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.sim import run_seed
from ledgerstore.sim.disk import DiskFaults
from ledgerstore.sim.diskfaults import JOURNAL_FAULTS, STORAGE_FAULTS, aim_journal_fault
from ledgerstore.sim.world import World
from tests.sim._worlds import closed_ledger, in_world


def setup_module() -> None:
    logging.disable(logging.CRITICAL)  # the code under test logs every fault it survives


def teardown_module() -> None:
    logging.disable(logging.NOTSET)


def test_a_flipped_bit_fails_the_entry_logs_checksum_and_the_entry_is_read_from_another_replica() -> None:
    """The bookies' entry-log engine reads the damaged record, its CRC32C fails, the bookie
    answers with an error and the client reads the entry from the one healthy replica."""
    async def scenario(world: World) -> tuple[list[bytes], int]:
        await world.start_bookies()
        lh = await closed_ledger(world, 30, "entry {}")
        for b in world.bookies:  # a checkpoint: the entries leave the engines' write buffers for the files
            assert b.bookie is not None
            b.bookie.checkpoint()
        for b in world.bookies:  # every read of two of the three replicas comes back damaged
            if b.bookie_id != lh.metadata.ensembles[0][1][2]:
                b.disk_faults = DiskFaults(flip=1.0, rng=random.Random(1))
        reader = await world.client("reader").start()
        rh = await reader.open_ledger(lh.ledger_id, b"sim", recovery=False)
        entries = await rh.read(0, 29)
        flipped = sum(b.files.flipped for b in world.bookies)
        return [e.payload for e in entries], flipped

    payloads, flipped = in_world(0, 3, scenario)
    assert payloads == [f"entry {i}".encode() for i in range(30)]
    assert flipped >= 2  # a window of records is one read: one flip damages one record of it


def test_a_disk_that_fails_every_write_moves_the_writer_to_another_bookie() -> None:
    async def scenario(world: World) -> tuple[list[int], list[str], list[bytes]]:
        await world.start_bookies()
        writer = await world.client("writer").start()
        lh = await writer.create_ledger(3, 3, 3, password=b"sim")
        await lh.append(b"before")
        failing = world.bookie(lh.metadata.ensembles[0][1][0].split(":")[0])
        failing.disk_faults = DiskFaults(write_error=1.0)
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
        full.disk_faults = DiskFaults(write_error=1.0, full=True)
        # entries larger than the engine's write buffer: each add writes to the (full) disk
        ids = [await lh.append(f"{i}".encode() * 1024) for i in range(10)]
        return ids, lh.metadata.ensembles[-1][1], full.bookie_id

    ids, ensemble, full = in_world(0, 4, scenario)
    assert ids == list(range(10))
    assert full not in ensemble and len(set(ensemble)) == 3


def test_seeds_with_disk_faults_replay_the_same_and_keep_every_invariant() -> None:
    first = run_seed(5, duration=20)
    assert first.ok, first.violations
    assert first.stats["disk_faults"] > 0
    assert run_seed(5, duration=20).trace_hash == first.trace_hash


@pytest.mark.parametrize("kind", list(JOURNAL_FAULTS))
def test_a_journal_fault_loses_no_entry_the_bookie_acknowledged(kind: str) -> None:
    """One bookie of an E3 Qw3 Qa3 ledger meets the fault after it acknowledged five adds, while
    a writer goes on appending; it crashes (or
    its journal fails and it is stopped) and comes back a second later. Every add it answered OK
    is in its storage after the restart (replayed from its journal), and every entry the writer
    was acknowledged reads back after the ledger is closed."""
    async def scenario(world: World) -> tuple[set[int], set[int], list[bytes], int, list[str]]:
        await world.start_bookies()
        writer = await world.client("writer").start()
        lh = await writer.create_ledger(3, 3, 3, password=b"sim")
        node = world.bookie(lh.metadata.ensembles[0][1][0].split(":")[0])
        answered: set[int] = set()
        sent: dict[int, list[int]] = {}  # request id -> entries, of the writer's adds to the bookie

        def watch(src: str, dst: str, frame: bytes) -> float:
            if src == "writer" and dst == node.name:
                req = codec.decode_request(frame)
                if isinstance(req, codec.AddBatchRequest):
                    sent[req.request_id] = [e for e, _ in req.entries]
            elif src == node.name and dst == "writer":
                r = codec.decode_response(frame)
                if isinstance(r, codec.AddBatchResponse) and r.status == Status.OK:
                    ok = [e for e, st in r.items if st == Status.OK] if not r.all_ok else sent[r.request_id]
                    answered.update(ok)
            return 0.0

        world.net.intercept = watch
        back = asyncio.Event()

        async def restart() -> None:
            await node.start()
            back.set()

        acked = [await lh.append(str(i).encode()) for i in range(5)]
        aim_journal_fault(node, kind, lambda: world.loop.call_later(1.0, lambda: world.loop.create_task(restart())))
        while not back.is_set() or len(acked) < 20:
            acked.append(await lh.append(str(len(acked)).encode()))
            await asyncio.sleep(0.1)
        assert node.engine() is not None
        stored = node.stored([lh.ledger_id])[lh.ledger_id]
        await lh.close()
        reader = await world.client("reader").start()
        rh = await reader.open_ledger(lh.ledger_id, b"sim")
        payloads = [e.payload for e in await rh.read(0, rh.last_add_confirmed)]
        return answered, stored, payloads, len(acked), [line for line in world.trace.lines if "disk.journal" in line]

    answered, stored, payloads, acked, hits = in_world(1, 4, scenario)
    assert len(hits) == 1, hits
    assert answered and answered <= stored, sorted(answered - stored)
    assert payloads[:acked] == [str(i).encode() for i in range(acked)]


@pytest.mark.parametrize("kind", ["crash-in-checkpoint", *STORAGE_FAULTS])
def test_a_crash_inside_a_storage_step_loses_no_acknowledged_entry(kind: str) -> None:
    """The directed scenario: that fault alone, aimed at a bookie about every 8 s; the bookie
    crashes at that step of its checkpoint, compaction or GC pass, restarts on what its files
    kept, and every invariant holds. The fault is met, and the run replays the same."""
    first = run_seed(0, duration=30, scenario=kind)
    assert first.ok, first.violations
    hits = [line for line in first.trace if f" {kind}: " in line]
    assert hits, "the fault never met its step"
    assert any("bookie.crash" in line for line in first.trace)
    assert run_seed(0, duration=30, scenario=kind).trace_hash == first.trace_hash
