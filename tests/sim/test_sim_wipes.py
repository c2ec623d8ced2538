"""The mid-run wipe (``ledgerstore.sim.wipes``): a bookie loses its data while writers,
recoverers, logs and auto-recovery are at work, and comes back under its old identity. With
limbo (the default) every invariant holds and the bookie repairs its ledgers from their other
replicas; the same seeds with limbo off are ``test_reintroduced_bugs``'s."""

from __future__ import annotations

import pytest

from ledgerstore.sim import run_seed

#: (seed, what was wiped and when) at 30 simulated seconds: a journal lost at a recovery, every
#: disk lost, the ledger directory lost, the ledger directory put back as an older copy
WIPES = [(2, "journal lost, cookie kept, ledgers [1] name it; at the recovery of L1"),
         (18, "every disk lost, cookie kept"),
         (34, "bookie-1: ledger directory lost, cookie kept"),
         (0, "ledger directory's newer state (restored from an older copy) lost, cookie kept")]


@pytest.mark.parametrize("seed, wipe", WIPES)
def test_a_bookie_wiped_mid_run_keeps_every_invariant_and_repairs_its_limbo_ledgers(seed: int, wipe: str) -> None:
    out = run_seed(seed, duration=30)
    assert out.ok, out.violations
    assert out.stats["mid_run_wipes"] == 1
    assert any(wipe in line for line in out.trace), [line for line in out.trace if "wipe" in line]
    repaired = [line for line in out.trace if " wipe.repaired " in line]
    assert repaired and "0 ledgers repaired" not in repaired[0], repaired
    assert run_seed(seed, duration=30).trace_hash == out.trace_hash
