"""Auto-recovery in the simulation: the real auditor and replication workers, a bookie that loses
its disks, and the auto-recovery invariants (nothing left below its write quorum, no duplicate
bookie in an ensemble, no acknowledged entry lost)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest

from ledgerstore.api import Notification
from ledgerstore.client.recovery import recover
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.meta import layout
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.recovery import worker as worker_module
from ledgerstore.sim import run_seed
from ledgerstore.sim.auditor import AutoRecovery
from ledgerstore.sim.metadata import _Watch
from ledgerstore.sim.world import World
from tests.sim._worlds import closed_ledger, in_world


def setup_module() -> None:
    logging.disable(logging.CRITICAL)  # the code under test logs every fault it survives


def teardown_module() -> None:
    logging.disable(logging.NOTSET)


@dataclasses.dataclass
class _Run:
    """The little of a schedule's run that :class:`AutoRecovery` uses."""

    world: World
    duration: float = 30.0
    kinds: tuple[str, ...] = ()
    healed: bool = True
    violations: list[str] = dataclasses.field(default_factory=list)

    def violation(self, text: str) -> None:
        self.violations.append(text)


def _wiped_bookie_run(seed: int, restart_after: float, delay: float,
                      stall_registration: bool = False) -> tuple[list[str], LedgerMetadata | None]:
    """Four bookies, two auto-recovery processes (lost-bookie delay ``delay``); a closed ledger
    (E3 Qw3 Qa2) of 20 entries; one of its bookies loses its disks and cookie and starts again
    empty after ``restart_after`` seconds (``stall_registration``: the bookie stalls for a
    second between writing its new cookie and registering). Returns the violations found once
    no marker is left, and the ledger's metadata."""
    violations: list[str] = []

    async def scenario(world: World) -> LedgerMetadata | None:
        run = _Run(world, violations=violations)
        recovery = AutoRecovery(run, AutoRecoveryConfig(lost_bookie_recovery_delay_s=delay,
                                                        replicas_check_interval_s=0.0))
        await world.start_bookies()
        await recovery.start()
        lh = await closed_ledger(world, 20)
        await asyncio.sleep(2.0)  # the auditor has seen every bookie registered
        victim = world.bookie(lh.metadata.ensembles[0][1][0].split(":")[0])
        recovery.wipe(victim, restart_after)
        if stall_registration:
            def stall(_n: Notification) -> None:
                if f"{layout.COOKIES}/{victim.bookie_id}" in world.meta.data and victim.name not in world.net.held:
                    world.net.hold(victim.name)
                    world.loop.call_later(1.0, world.net.release, victim.name)
                    watch.cancel()

            watch = _Watch(world.meta, f"{layout.COOKIES}/{victim.bookie_id}", stall)
            world.meta.watches.append(watch)
        await recovery.settle()
        return recovery.current(lh.ledger_id)

    md = in_world(seed, 4, scenario)
    return violations, md


def test_a_bookie_back_with_empty_disks_gets_what_it_held_re_replicated() -> None:
    """The wiped bookie writes its new cookie and only a second later registers; the cookie's
    notification wakes the auditor in between. The auditor must still see the bookie back as
    another incarnation, mark the ledger, and the workers copy its share to a replacement
    (the auditor took it for the old incarnation back and nothing was copied)."""
    violations, md = _wiped_bookie_run(0, restart_after=0.5, delay=10.0, stall_registration=True)
    assert not violations, violations
    assert md is not None and len(set(md.ensembles[0][1])) == 3


def test_a_bookie_gone_longer_than_the_delay_gets_its_ledgers_re_replicated() -> None:
    violations, md = _wiped_bookie_run(1, restart_after=60.0, delay=2.0)
    assert not violations, violations
    assert md is not None and len(set(md.ensembles[0][1])) == 3


def test_a_replacement_restarted_on_an_older_copy_between_its_copy_and_the_swap_gets_the_copy_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 3558 of the 10,000-seed run, directed. A worker copies a lost bookie's share to a
    replacement; before the worker's swap names it, the replacement checkpoints (the copy is in
    its ledger directory, the journal's mark past it), crashes and comes back on a ledger
    directory restored from a copy taken before the copy. It finds it lost data and lists the
    ledgers that name it, which this one does not yet: nothing puts it in limbo. The swap then
    named a bookie holding none of its share. The worker now asks the replacement's process
    instance before the copy and after the swap, and copies again to a new instance."""
    restored: list[str] = []
    swap = worker_module.ReplicationWorker._swap

    async def scenario(world: World) -> tuple[LedgerMetadata | None, dict[str, dict[int, set[int]]]]:
        run = _Run(world)
        recovery = AutoRecovery(run, AutoRecoveryConfig(lost_bookie_recovery_delay_s=2.0,
                                                        replicas_check_interval_s=0.0))
        await world.start_bookies()
        await recovery.start()
        older = {b.name: b.files.engine_snapshot() for b in world.bookies}
        lh = await closed_ledger(world, 20)
        await asyncio.sleep(2.0)

        async def restore_then_swap(self: worker_module.ReplicationWorker, ledger_id: int, first: int, index: int,
                                    old: str, new: str) -> LedgerMetadata | None:
            if not restored:
                node = next(b for b in world.bookies if b.bookie_id == new)
                assert node.bookie is not None
                node.bookie.checkpoint()
                node.crash()
                node.files.restore_engine(older[node.name])
                await node.start()
                restored.append(node.bookie_id)
            return await swap(self, ledger_id, first, index, old, new)

        monkeypatch.setattr(worker_module.ReplicationWorker, "_swap", restore_then_swap)
        recovery.wipe(world.bookie(lh.metadata.ensembles[0][1][0].split(":")[0]), restart_after=120.0)
        await recovery.settle()
        return recovery.current(lh.ledger_id), {b.bookie_id: b.stored([lh.ledger_id]) for b in world.bookies}

    md, stored = in_world(1, 4, scenario)
    assert restored and md is not None
    assert restored[0] in md.ensembles[0][1], md.ensembles
    assert all(stored[b].get(md.ledger_id) == set(range(20)) for b in md.ensembles[0][1]), stored


#: with the open-ledger swap put back, the first seed (30 simulated seconds) that catches it is 23
#: (9 before the tailing reader and the directed faults joined the schedules)
SWAP_BUG_SEEDS = (23,)


def test_the_simulation_catches_auto_recovery_swapping_an_open_ledgers_last_fragment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 1 put back: a worker swaps the missing bookie of an open ledger's last
    fragment for an empty replacement in the metadata (IN_RECOVERY) and only then recovers the
    new ensemble, which never fences or reads the bookie it swapped out."""

    async def swap_then_recover(self: worker_module.ReplicationWorker, md: LedgerMetadata, password: bytes,
                                missing: set[str]) -> None:
        ensemble = list(md.current_ensemble)
        for i, b in enumerate(ensemble):
            if b in missing:
                ensemble[i] = await self._choose(md, ensemble, i, set(missing))
        swapped = dataclasses.replace(md, ensembles=[*md.ensembles[:-1], (md.ensembles[-1][0], ensemble)],
                                      state=LedgerState.IN_RECOVERY)
        await recover(self.client, await self.client.ledgers.write(swapped), password)

    monkeypatch.setattr(worker_module.ReplicationWorker, "_recover_open", swap_then_recover)
    caught = next((out for seed in SWAP_BUG_SEEDS if not (out := run_seed(seed, duration=30)).ok), None)
    assert caught is not None, f"none of seeds {SWAP_BUG_SEEDS} caught the swap of an open ledger's fragment"



#: with a formatted bookie taken for the one it replaced, the first seed (30 simulated seconds)
#: that catches it is 8: it wipes a bookie that comes back before its ledgers are re-replicated
CAME_BACK_BUG_SEEDS = 9


def test_the_simulation_catches_a_marker_cleared_because_a_formatted_bookie_came_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 5 (the auditor's part) put back: a worker takes any registered bookie for
    one that holds what its markers say it lacks, although it came back as a new incarnation
    (formatted, its cookie changed) holding nothing of the old ledgers."""

    async def registered_is_back(self: worker_module.ReplicationWorker, missing: set[str]) -> set[str]:
        registered = {b.bookie_id for b in await self.client.bookie_infos(max_age=0)}
        return {b for b in missing if b not in registered or b in await self.markers.decommissioning()}

    monkeypatch.setattr(worker_module.ReplicationWorker, "_still_missing", registered_is_back)
    caught = next((out for seed in range(CAME_BACK_BUG_SEEDS) if not (out := run_seed(seed, duration=30)).ok), None)
    assert caught is not None, f"none of seeds 0..{CAME_BACK_BUG_SEEDS - 1} caught a marker cleared for a formatted bookie"
    assert any("copies lost with a wiped bookie were not re-replicated" in v for v in caught.violations), caught.violations
