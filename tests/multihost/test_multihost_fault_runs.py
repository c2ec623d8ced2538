"""Randomized fault runs across hosts: a writer on one host writes E3 Qw2 Qa2 while bookie hosts
go silent or are cut off from the writer, the metadata server or each other, one at a time
(:func:`ledgerstore.testing.netns.random_partitions`). After each run the ledger is recovered from
another host and the protocol invariants are checked: every acknowledged entry is there, in order,
with its own payload. Seeds replay as in ``tests/integration/test_fault_runs.py``
(``LEDGERSTORE_FAULT_SEED=<n>``, ``LEDGERSTORE_FAULT_SEEDS=<n>``)."""

from __future__ import annotations

import random

import pytest

from ledgerstore.testing.netns import random_partitions
from tests.integration.invariants import fault_seeds
from tests.multihost.conftest import ADD_TIMEOUT_S, BOOKIES, MultiHost

pytestmark = pytest.mark.multihost

SEEDS = fault_seeds(2)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_partitions_keep_the_invariants(cluster: MultiHost, seed: int) -> None:
    rnd = random.Random(seed)
    writer = cluster.agent("c1")
    cluster.wait_bookies(writer)
    ledger = writer.ask("create", e=3, qw=2, qa=2)["ledger"]
    seconds = rnd.uniform(6.0, 9.0)
    writer.send("write_for", seconds=seconds + 2 * ADD_TIMEOUT_S, batch=20)
    actions = random_partitions(cluster.net, rnd, BOOKIES, ["c1", "meta", *BOOKIES], seconds)
    run = writer.answer(timeout=120)
    acked = run["acked"]
    context = f"seed {seed}: {actions}; writer error: {run['error']}"
    assert acked == list(range(len(acked))), f"acknowledgements out of order or with holes ({context})"
    reader = cluster.agent("c2")
    last = reader.ask("recover", ledger=ledger)["last"]
    assert not acked or max(acked) <= last, f"acknowledged {max(acked)} beyond the recovered end {last} ({context})"
    read = reader.ask("read", ledger=ledger)
    assert read["count"] == last + 1 and read["bad"] == [], f"{read} ({context})"
