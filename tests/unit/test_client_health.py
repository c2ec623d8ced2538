"""The client's bookie health check without sockets: which failures count against a bookie, the
per-interval threshold and reset, quarantine and its end, the cluster-wide switch, and placement
that avoids quarantined bookies while enough others exist."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.client.health import BookieHealth, HealthChecker, counts_as_error
from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.metrics import ClientMetrics
from ledgerstore.client.placement import EnsemblePlacement
from ledgerstore.errors import (
    BookieIOError,
    BookieUnavailableError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    TimeoutError_,
    TooManyRequestsError,
)
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.plugins import load_driver
from ledgerstore.proto.codec import Op, Status
from ledgerstore.proto.digest import password_check
from ledgerstore.testing.faults import FaultInjector
from ledgerstore.testing.placement import make_bookies
from tests.unit.memory_bookies import MemoryContext, run_in_memory


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SwitchStore:
    """The one key the health check reads: present = disabled."""

    def __init__(self) -> None:
        self.disabled = False

    async def get(self, key: str) -> Any:
        assert key == "/disableHealthCheck"
        return (b"{}", 1) if self.disabled else None


async def new_ledger(ctx: MemoryContext) -> LedgerHandle:
    """A ledger on b0, b1, b2 whose adds wait for all three (E=Qw=Qa=3)."""
    lid = await ctx.ledgers.new_ledger_id()
    md = await ctx.ledgers.create(LedgerMetadata(
        ledger_id=lid, ensemble_size=3, write_quorum=3, ack_quorum=3, digest_type="crc32c",
        password_check=password_check(b""), ensembles=[(0, ["b0", "b1", "b2"])]))
    return LedgerHandle(ctx, md, b"")


def health() -> tuple[BookieHealth, Clock, ClientMetrics]:
    clock, metrics = Clock(), ClientMetrics()
    return BookieHealth(metrics, clock), clock, metrics


def test_timeouts_lost_connections_and_io_errors_count_but_protocol_answers_and_throttling_do_not() -> None:
    for counted in (TimeoutError_("t"), BookieUnavailableError("lost"), BookieIOError("eio"),
                    Status.IO_ERROR, Status.BAD_REQUEST):
        assert counts_as_error(counted), counted
    for answer in (LedgerFencedError("f"), NoSuchEntryError("e"), NoSuchLedgerError("l"), TooManyRequestsError("t"),
                   Status.FENCED, Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER, Status.READ_ONLY, Status.UNAUTHORIZED,
                   Status.TOO_MANY_REQUESTS, Status.OK):
        assert not counts_as_error(answer), answer


def test_a_bookie_is_faulty_once_its_errors_in_one_interval_reach_the_threshold_and_counts_restart() -> None:
    h, _, _ = health()
    for _ in range(3):
        h.record_error("a", TimeoutError_("t"))
    for _ in range(2):
        h.record_error("b", Status.IO_ERROR)
    for _ in range(10):
        h.record_error("c", Status.NO_SUCH_ENTRY)  # a protocol answer: never counted
    assert (h.error_count("a"), h.error_count("b"), h.error_count("c")) == (3, 2, 0)
    assert h.take_faulty(3) == ["a"]  # reaching the threshold is enough, as BookKeeper's getFaultyBookies
    assert h.error_count("a") == 0
    h.record_error("b", Status.IO_ERROR)  # b's two earlier errors belong to the last interval
    assert h.take_faulty(3) == []


def test_a_quarantine_ends_after_its_time_and_is_not_extended_by_new_errors() -> None:
    h, clock, metrics = health()
    assert h.quarantine("a", 60) is True
    clock.now += 30
    assert h.quarantine("a", 60) is False
    assert h.quarantined == {"a"} and metrics.bookie_quarantines == 1
    assert sum(metrics.quarantined_bookies.values()) == 1
    clock.now += 30
    assert h.quarantined == frozenset()
    assert sum(metrics.quarantined_bookies.values()) == 0
    text = metrics.render().decode()
    assert "\nbookkeeper_client_BOOKIE_QUARANTINE 1.0\n" in text
    assert "\nledgerstore_client_bookie_quarantines_total 1.0\n" in text
    assert "\nledgerstore_client_quarantined_bookies 0.0\n" in text


def test_a_check_quarantines_faulty_bookies_only_while_the_switch_is_on_and_disabling_lifts_them() -> None:
    h, _, _ = health()
    store = SwitchStore()
    checker = HealthChecker(h, store, interval_s=60, threshold=2, quarantine_s=1800)  # type: ignore[arg-type]

    async def main() -> None:
        h.record_error("a", TimeoutError_("t"))
        h.record_error("a", TimeoutError_("t"))
        h.record_error("b", TimeoutError_("t"))
        assert await checker.check() == ["a"]
        assert h.quarantined == {"a"}
        store.disabled = True
        h.record_error("b", TimeoutError_("t"))
        h.record_error("b", TimeoutError_("t"))
        assert await checker.check() == []
        assert h.quarantined == frozenset()  # lifted at the first check after the switch went off
        assert h.error_count("b") == 0  # and the interval's counts are gone with it
        store.disabled = False
        h.record_error("b", TimeoutError_("t"))
        h.record_error("b", TimeoutError_("t"))
        assert await checker.check() == ["b"]
        assert checker.checks == 3

    asyncio.run(main())


def test_an_interval_of_zero_runs_no_check() -> None:
    h, _, _ = health()

    async def main() -> None:
        checker = HealthChecker(h, SwitchStore(), interval_s=0, threshold=1, quarantine_s=1)  # type: ignore[arg-type]
        checker.start()
        assert not checker.running
        await checker.stop()

    asyncio.run(main())


def test_new_ensembles_and_replacements_avoid_quarantined_bookies_while_enough_others_exist() -> None:
    policy = load_driver("placement", "random")()
    bookies = make_bookies(5)
    ids = [b.bookie_id for b in bookies]
    h, _, _ = health()
    placement = EnsemblePlacement(policy, h)
    h.quarantine(ids[0], 600)
    h.quarantine(ids[1], 600)
    for _ in range(30):
        assert set(placement.new_ensemble(3, 2, 2, bookies)) == set(ids[2:])
    ensemble = [ids[2], ids[3], ids[4]]
    for _ in range(30):
        # ids[4] failed: the only healthy candidates are in the ensemble, so a quarantined one is used
        assert placement.replace_bookie(ensemble, 2, 2, 2, bookies, exclude=frozenset({ids[4]})) in ids[:2]
    h.release_all()
    h.quarantine(ids[0], 600)
    for _ in range(30):
        assert placement.replace_bookie(ensemble, 2, 2, 2, bookies, exclude=frozenset({ids[4]})) == ids[1]
        # too few healthy bookies for E=5: the quarantined one is used rather than fail
        assert set(placement.new_ensemble(5, 2, 2, bookies)) == set(ids)
    with pytest.raises(NotEnoughBookiesError):
        placement.new_ensemble(6, 2, 2, bookies)


def test_a_writers_ensemble_change_replaces_a_failed_bookie_with_a_healthy_one_not_a_quarantined_one(
        tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        ctx.ensemble_placement.health.quarantine("b3", 600)
        faults = FaultInjector().install(ctx)
        faults.drop("b1", ops={Op.ADD_BATCH})  # b1 fails every ledger's first add: each changes its ensemble
        handles = [await new_ledger(ctx) for _ in range(10)]
        assert await asyncio.gather(*(lh.append(b"x") for lh in handles)) == [0] * 10
        for lh in handles:
            md = await ctx.ledgers.read(lh.ledger_id)
            # b3 or b4 would each be chosen half the time at random; the quarantine leaves only b4
            assert md.ensembles == [(0, ["b0", "b4", "b2"])], md.ensembles
            await lh.close()

    run_in_memory(tmp_path, test, names=["b0", "b1", "b2", "b3", "b4"], add_timeout_s=0.3)
