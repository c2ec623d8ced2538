"""How auto-recovery and a bookie's limbo repair keep out of each other's way, piece by piece:
the bookie publishes its limbo count (throttled, zero at once), the registration carries it, and
the replicas check leaves the shortfalls of a bookie in limbo to it while its count keeps falling.
The whole story on real bookie processes is ``tests/integration/test_limbo_autorecovery.py``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.api import BookieInfo
from ledgerstore.bookie.limbo_announce import LimboAnnouncer
from ledgerstore.client.channel import ChannelPool
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import MetadataError
from ledgerstore.meta.bookies import BookieRegistry, info_from_bytes, info_to_bytes
from ledgerstore.meta.ledgers import LedgerManager, LedgerMetadata, LedgerState
from ledgerstore.plugins import create_metadata_store
from ledgerstore.recovery.limbo_patience import LimboPatience
from ledgerstore.recovery.markers import UnderReplicationManager
from ledgerstore.recovery.replicas import ReplicasCheck


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def info(bookie: str, limbo: int) -> BookieInfo:
    return BookieInfo(bookie, ledgers_in_limbo=limbo)


# --- the registration ------------------------------------------------------------------------------


def test_the_registration_carries_the_limbo_count_and_an_older_one_reads_as_none() -> None:
    assert info_from_bytes(info_to_bytes(info("b:1", 7))).ledgers_in_limbo == 7
    assert info_from_bytes(b'{"bookie_id": "b:1", "endpoint": "tcp://b:1"}').ledgers_in_limbo == 0


def test_limbo_patience_must_not_be_negative() -> None:
    assert any("limbo_patience_s" in p for p in AutoRecoveryConfig(limbo_patience_s=-1).validate())
    assert any("limbo_patience_s" in p for p in AutoRecoveryConfig(limbo_patience_s=float("nan")).validate())
    assert not AutoRecoveryConfig(limbo_patience_s=0).validate()


# --- the patience ----------------------------------------------------------------------------------


def test_a_bookie_in_limbo_is_left_to_its_repair_and_one_out_of_limbo_is_not() -> None:
    patience = LimboPatience(60, Clock())
    assert patience.left_to_repair([info("a", 0), info("b", 5), info("c", 1)]) == {"b": 5, "c": 1}


def test_a_repair_that_makes_no_progress_is_checked_again_after_the_patience_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    patience = LimboPatience(60, clock)
    assert patience.left_to_repair([info("b", 5)]) == {"b": 5}
    clock.now += 59
    assert patience.left_to_repair([info("b", 5)]) == {"b": 5}
    clock.now += 2
    with caplog.at_level(logging.WARNING, "ledgerstore.recovery.limbo_patience"):
        assert patience.left_to_repair([info("b", 5)]) == {}
        clock.now += 100
        assert patience.left_to_repair([info("b", 5)]) == {}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "bookie b has had 5 ledgers in limbo for 61s without repairing one" in warnings[0]


def test_progress_restarts_the_patience() -> None:
    clock = Clock()
    patience = LimboPatience(60, clock)
    patience.left_to_repair([info("b", 5)])
    clock.now += 50
    assert patience.left_to_repair([info("b", 4)]) == {"b": 4}  # one repaired
    clock.now += 50
    assert patience.left_to_repair([info("b", 4)]) == {"b": 4}  # 50 s since it fell
    clock.now += 11
    assert patience.left_to_repair([info("b", 4)]) == {}


def test_a_bookie_restarted_in_limbo_does_not_start_its_patience_again() -> None:
    clock = Clock()
    patience = LimboPatience(60, clock)
    patience.left_to_repair([info("b", 5)])
    clock.now += 40
    assert patience.left_to_repair([]) == {}  # unregistered for a while
    clock.now += 30
    assert patience.left_to_repair([info("b", 5)]) == {}  # back, no progress for 70 s


def test_a_bookie_back_in_limbo_after_leaving_it_gets_a_new_patience() -> None:
    clock = Clock()
    patience = LimboPatience(60, clock)
    patience.left_to_repair([info("b", 5)])
    clock.now += 100
    assert patience.left_to_repair([info("b", 0)]) == {}
    assert patience.left_to_repair([info("b", 3)]) == {"b": 3}  # lost its data again


def test_with_no_patience_no_bookie_is_left_to_its_repair() -> None:
    assert LimboPatience(0, Clock()).left_to_repair([info("b", 5)]) == {}


# --- the announcer ---------------------------------------------------------------------------------


class Registrations:
    """What a bookie's registration would publish: the count at each call."""

    def __init__(self, count: list[int], fail: int = 0, interval_s: float = 0.3) -> None:
        self.count, self.fail = count, fail
        self.published: list[int] = []
        self.announcer = LimboAnnouncer(lambda: self.count[0], self.register, interval_s=interval_s)

    async def register(self) -> None:
        if self.fail:
            self.fail -= 1
            self.announcer.published(None)
            raise MetadataError("the metadata store is away")
        self.published.append(self.count[0])
        self.announcer.published(self.count[0])


def announce(test: Any) -> None:
    async def main() -> None:
        await asyncio.wait_for(test(), 20)

    asyncio.run(main())


def test_changes_within_the_interval_are_published_once_at_its_end() -> None:
    async def main() -> None:
        count = [5]
        regs = Registrations(count, interval_s=0.3)
        await regs.register()  # the bookie's first registration
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        task = loop.create_task(regs.announcer.run())
        try:
            for n in (4, 3, 2):  # three ledgers repaired within the interval: one registration
                count[0] = n
                regs.announcer.changed()
                await asyncio.sleep(0)
            while regs.published == [5]:
                await asyncio.sleep(0.01)
            assert regs.published == [5, 2] and loop.time() - t0 >= 0.3
            regs.announcer.changed()  # nothing new: nothing published
            await asyncio.sleep(0.4)
            assert regs.published == [5, 2] and regs.announcer.announcements == 1
        finally:
            task.cancel()

    announce(main)


def test_zero_is_published_at_once_whatever_the_interval() -> None:
    async def main() -> None:
        count = [2]
        regs = Registrations(count, interval_s=3600)
        await regs.register()
        task = asyncio.get_running_loop().create_task(regs.announcer.run())
        try:
            count[0] = 1
            regs.announcer.changed()
            await asyncio.sleep(0.1)
            assert regs.published == [2]  # within the interval: waits
            count[0] = 0
            regs.announcer.changed()
            while regs.published[-1] != 0:
                await asyncio.sleep(0.01)
            assert regs.published == [2, 0]
        finally:
            task.cancel()

    announce(main)


def test_a_registration_that_fails_is_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        count = [0]
        regs = Registrations(count, fail=2)
        task = asyncio.get_running_loop().create_task(regs.announcer.run())
        try:
            with caplog.at_level(logging.WARNING, "ledgerstore.bookie.limbo_announce"):
                regs.announcer.changed()
                while not regs.published:
                    await asyncio.sleep(0.01)
            assert regs.published == [0]
            assert len([r for r in caplog.records if "could not publish the limbo count" in r.getMessage()]) == 1
        finally:
            task.cancel()

    announce(main)


# --- the replicas check ----------------------------------------------------------------------------


class Holdings(ReplicasCheck):
    """The replicas check with each bookie's LIST_LEDGERS answer given (``held``); ``asked``
    records who was asked, and ``after_answers`` runs once every bookie answered the first round."""

    def __init__(self, *args: Any, held: dict[str, dict[int, int]], after_answers: Any = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.held, self.asked, self.after_answers = held, [], after_answers

    async def holdings(self, bookie_id: str, first: int = 0, most: int | None = None) -> dict[int, int] | None:
        self.asked.append(bookie_id)
        if most is None and self.after_answers is not None and len(self.asked) == len(self.held):
            hook, self.after_answers = self.after_answers, None
            await hook()
        return dict(self.held[bookie_id])


def replicas_check(tmp_path: Path, limbo: dict[str, int], held: dict[str, dict[int, int]],
                   entered_limbo: dict[str, int] | None = None) -> tuple[dict[str, Any], list[str], list[int]]:
    """One replicas check over bookies a, b, c holding one closed ledger of 10 entries (E3 Qw3):
    ``limbo`` their registered limbo counts, ``entered_limbo`` counts registered once the bookies
    answered the check's first round. Returns its result, the bookies asked, and the ledgers marked."""

    async def main() -> tuple[dict[str, Any], list[str], list[int]]:
        store = create_metadata_store(f"sqlite://{tmp_path}/meta.db")
        await store.start()
        pool = ChannelPool(lambda b: None, {}, 1 << 20)  # type: ignore[arg-type,return-value]
        try:
            registry = BookieRegistry(store)
            for b in "abc":
                await registry.register(BookieInfo(b, f"tcp://{b}", ledgers_in_limbo=limbo.get(b, 0)))
            mgr = LedgerManager(store)
            lid = await mgr.new_ledger_id()
            await mgr.create(LedgerMetadata(lid, 3, 3, 2, "crc32c", "check", [(0, ["a", "b", "c"])],
                                            state=LedgerState.CLOSED, last_entry_id=9))

            async def enter_limbo() -> None:
                for b, n in (entered_limbo or {}).items():
                    await registry.register(BookieInfo(b, f"tcp://{b}", ledgers_in_limbo=n))

            check = Holdings(store, pool, recheck_delay_s=0.0, limbo=LimboPatience(60),
                             held={b: {lid: h} if h >= 0 else {} for b, h in
                                   ((b, held[b].get(0, -2)) for b in "abc")},
                             after_answers=enter_limbo)
            result = await check.run()
            return result, check.asked, await UnderReplicationManager(store).ledger_ids()
        finally:
            await pool.close()
            await store.close()

    return asyncio.run(asyncio.wait_for(main(), 30))  # type: ignore[no-any-return]


FULL, EMPTY = {0: 9}, {0: -2}


def test_the_replicas_check_leaves_a_bookie_in_limbo_unasked_and_unmarked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "ledgerstore.recovery.replicas"):
        result, asked, marked = replicas_check(tmp_path, {"b": 1}, {"a": FULL, "b": EMPTY, "c": FULL})
    assert asked == ["a", "c"] and marked == []
    assert result["bookies_repairing"] == {"b": 1} and result["ledgers_marked"] == []
    said = [r.getMessage() for r in caplog.records]
    assert "replicas check: bookie b is repairing 1 ledgers in limbo itself: its shortfalls are left to it " \
           "(checked again once it reports none)" in said
    assert "replicas check: every closed ledger is held by its bookies (1 ledgers, 2 bookies); " \
           "1 left to repair their limbo ledgers" in said


def test_the_replicas_check_marks_a_short_bookie_that_is_not_in_limbo(tmp_path: Path) -> None:
    result, asked, marked = replicas_check(tmp_path, {}, {"a": FULL, "b": EMPTY, "c": FULL})
    assert sorted(set(asked)) == ["a", "b", "c"] and len(marked) == 1
    assert result["bookies_repairing"] == {}


def test_a_bookie_that_enters_limbo_between_the_two_rounds_is_not_marked(tmp_path: Path) -> None:
    """It was restarted without its data after the first answer: the second round re-reads the
    registrations and leaves it to its repair."""
    result, _, marked = replicas_check(tmp_path, {}, {"a": FULL, "b": EMPTY, "c": FULL}, entered_limbo={"b": 1})
    assert marked == [] and result["ledgers_marked"] == []
