"""Logs in the simulation: writers that take a log over from each other, readers, and the log
invariants (order kept, only the newest ledgers open, readers see a prefix, nothing acknowledged lost)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.log import base as log_base
from ledgerstore.client.log import writer as log_writer
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.logs import LogMetadata
from ledgerstore.sim import VirtualTimeLoop, run_seed
from ledgerstore.sim.world import World

#: with the roll-past-a-failed-close bug put back, the first seed that catches it (30 simulated
#: seconds each) is 61: seeds 0..60 do not, and running them all would cost CI half a minute, so
#: the test runs the first one that does (it was 5, then 37, 82, 35 as each change moved every
#: later step of a seed; 51 since the tailing reader and the directed faults joined the schedules;
#: 37 since the entry-log engine, the scratch ledgers and the storage faults did; 78 since the
#: ledger directories' checkpoint marks and the wipes of a ledger directory did; 37 since
#: auto-recovery confirms a replacement's process instance; 61 since sequenced log entries carry
#: a varint sequence, shorter by 5 bytes)
ROLL_BUG_SEEDS = (61,)


def setup_module() -> None:
    logging.disable(logging.CRITICAL)  # the code under test logs every fault it survives


def teardown_module() -> None:
    logging.disable(logging.NOTSET)


def test_a_seed_with_log_writers_and_readers_replays_the_same() -> None:
    first = run_seed(4, duration=20)
    again = run_seed(4, duration=20)
    assert first.ok, first.violations
    assert first.trace_hash == again.trace_hash
    assert first.stats["log_acked"] > 0 and first.stats["log_sessions"] > 1
    assert first.stats["log_reads"] > 0 and first.stats["log_ledgers"] > 1


def test_a_log_writer_rolls_by_interval_on_the_loops_clock() -> None:
    """The roll interval runs on the loop's clock: 20 simulated seconds of appends with a 5 s
    interval roll at least three times, though they take milliseconds of wall time."""
    loop = VirtualTimeLoop()
    world = World(0, loop, bookies=3)

    async def scenario() -> list[int]:
        await world.start_bookies()
        client = await world.client("log-a").start()
        w = await client.open_log("interval", ensemble=3, write_quorum=2, ack_quorum=2, roll_interval_s=5.0)
        for i in range(40):
            await w.append(f"{i}".encode())
            await asyncio.sleep(0.5)
        await w.close()
        return w.ledger_ids

    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            ids = runner.run(scenario())
    finally:
        world.close()
    assert len(ids) >= 4, ids


def test_the_simulation_catches_a_log_that_rolls_past_a_ledger_that_failed_to_close(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 4 put back: a roll closes the previous ledger once and goes on whether or
    not that close succeeded, and a new leader recovers only the last two ledgers. Flaky
    metadata writes on the leading writer make a roll's close fail; the list invariant (only
    the newest two ledgers open) and the final read catch it (seed 61 first)."""

    async def close_once(self: log_writer.LogWriter, lh: LedgerHandle) -> None:
        await lh.close()

    async def close_sealed(self: log_writer.LogWriter, seg: log_writer._Segment) -> None:
        try:
            await self._close_ledger(seg.lh)
        except LedgerStoreError:
            pass  # the bug: nobody hears of the failed close

    async def last_two(client: log_base.LogClient, md: LogMetadata) -> list[int]:
        return md.ledger_ids[-2:]

    monkeypatch.setattr(log_writer.LogWriter, "_close_ledger", close_once)
    monkeypatch.setattr(log_writer.LogWriter, "_close_sealed", close_sealed)
    monkeypatch.setattr(log_writer, "unclosed", last_two)
    caught = next((out for seed in ROLL_BUG_SEEDS if not (out := run_seed(seed, duration=30)).ok), None)
    assert caught is not None, f"none of seeds {ROLL_BUG_SEEDS} caught the roll past a failed close"
    assert any("rolled past a ledger that was not closed" in v for v in caught.violations), caught.violations


def test_writers_resend_from_earlier_sequences_across_takeovers_and_each_is_stored_once() -> None:
    """Seed 1: four leaderships of one producer, two of them resuming before the application's
    checkpoint (a producer resending after a crash); every acknowledged sequence is in the final
    log once, where it was acknowledged."""
    out = run_seed(1, duration=30)
    assert out.ok, out.violations
    assert out.stats["log_sessions"] > 2 and out.stats["log_resumed_back"] > 0
    assert out.stats["log_seqs"] > 0


def test_appends_after_a_roll_wait_for_the_previous_ledger_so_a_resend_is_never_refused() -> None:
    """Seed 65: a writer fenced during a roll. Were the appends after the switch sent to the new
    ledger at once, entries of it would survive the takeover behind entries of the old ledger
    that did not (sequences 13 missing, 14 stored), and the producer's resend of 13 would be
    refused as "not in the log". Parked until the old ledger's adds resolve, they fail unsent
    instead. (Sending them at once, seed 65 is the first of 0..65 that fails.)"""
    out = run_seed(65, duration=30)
    assert out.ok, out.violations
