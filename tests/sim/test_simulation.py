"""The deterministic simulation: virtual time, replay by seed, and every invariant over many seeds."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerstore.bookie.journal import ADD, encode_record
from ledgerstore.sim import VirtualTimeLoop, run_seed
from ledgerstore.sim.disk import JournalDisk, SimJournal

#: seeds every CI run checks (the tox env ``sim`` runs 10,000)
CI_SEEDS = 200


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    # the code under test logs every fault it survives; thousands of lines say nothing here
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def test_an_hour_of_virtual_timeouts_passes_without_waiting() -> None:
    loop = VirtualTimeLoop()
    fired: list[float] = []

    async def sleeper() -> None:
        for _ in range(60):
            await asyncio.sleep(60)
            fired.append(loop.time())

    t0 = time.perf_counter()
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        runner.run(sleeper())
    assert fired[-1] == pytest.approx(3600.0)
    assert time.perf_counter() - t0 < 1.0


def test_a_crash_keeps_only_the_journal_records_that_were_synced() -> None:
    loop = VirtualTimeLoop()
    disk = JournalDisk()
    answered: list[list[str]] = []

    async def scenario() -> None:
        journal: SimJournal[str] = SimJournal(_path(), answered.append, disk=disk, rng=random.Random(1),
                                              fsync_delay=(0.01, 0.01))
        journal.start(asyncio.get_running_loop())
        journal.append(encode_record(ADD, 1, 0, b"synced"), "e0")
        await asyncio.sleep(0.02)  # the first group is synced and answered
        journal.append(encode_record(ADD, 1, 1, b"lost"), "e1")  # written, its sync still running
        journal.crash()
        disk.crash()
        replayed: list[tuple[int, bytes]] = []
        again: SimJournal[str] = SimJournal(_path(), answered.append, disk=disk, rng=random.Random(2))
        again.replay(lambda rec: replayed.append((rec.entry_id, rec.data)))
        assert replayed == [(0, b"synced")]

    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        runner.run(scenario())
    assert answered == [["e0"]]


def _path() -> Path:
    return Path("/nonexistent/sim-journal")


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    first = run_seed(7, duration=30)
    again = run_seed(7, duration=30)
    other = run_seed(8, duration=30)
    assert first.trace_hash == again.trace_hash
    assert first.trace == again.trace
    assert other.trace_hash != first.trace_hash
    assert any("bookie.crash" in line or "net." in line for line in first.trace + other.trace)


def test_every_invariant_holds_over_a_couple_of_hundred_fault_schedules() -> None:
    failing = {}
    for seed in range(CI_SEEDS):
        out = run_seed(seed, duration=30)
        if not out.ok:
            failing[seed] = out.violations
    assert not failing, f"seeds that broke an invariant (replay: ledgerstore sim --seeds 1 --seed S): {failing}"
