"""Randomized fault runs: bookies and writer processes killed and restarted at random moments
during writes; after each run the protocol invariants of DESIGN.md are checked.

Every run is reproducible from its seed (printed on failure):
``LEDGERSTORE_FAULT_SEED=<seed> pytest tests/integration/test_fault_runs.py``.
CI runs ``LEDGERSTORE_FAULT_SEEDS`` seeds (default 30); the ``nightly`` tox env runs 500.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from tests.integration.invariants import check_closed_ledger, fault_seeds

WRITER = str(Path(__file__).with_name("writer_proc.py"))
SEEDS = fault_seeds(30)
pytestmark = pytest.mark.slow


class Writer:
    """A writer process; a thread collects the entry ids it saw acknowledged."""

    def __init__(self, metadata: str, e: int, qw: int, qa: int) -> None:
        self.proc = subprocess.Popen([sys.executable, WRITER, metadata, str(e), str(qw), str(qa), "pw"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.ledger_id = int(self.proc.stdout.readline().split()[1])  # type: ignore[union-attr]
        self.acked: list[int] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith("ack "):
                self.acked.append(int(line.split()[1]))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._t.join(10)


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    cluster = LocalCluster(tmp_path_factory.mktemp("faults"), bookies=4, port_base=None,
                           extra_bookie_config="gc_wait_time_ms = 0\n")
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_keep_the_invariants(fault_cluster: LocalCluster, seed: int) -> None:
    cluster = fault_cluster
    rnd = random.Random(seed)
    qw = rnd.choice([2, 3])
    qa = rnd.randint(1, qw) if qw == 3 else 2
    writer = Writer(cluster.metadata, 3, qw, qa)
    down: list[int] = []
    try:
        deadline = time.monotonic() + rnd.uniform(1.0, 2.5)
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.05, 0.4))
            action = rnd.random()
            if action < 0.35 and not down:  # one bookie down at a time keeps every entry available
                victim = rnd.randrange(4)
                cluster.kill(victim)
                down.append(victim)
            elif action < 0.6 and down:
                cluster.restart(down.pop())
            elif action < 0.7:
                break  # the writer dies early
    finally:
        writer.kill()
        for i in down:
            cluster.restart(i)
    acked = list(writer.acked)
    failure = f"seed {seed} (E=3 Qw={qw} Qa={qa}, ledger {writer.ledger_id}, {len(acked)} acked)"

    async def check() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=5) as a, Client(metadata=cluster.metadata) as b:
            ra, rb = await asyncio.gather(a.open_ledger(writer.ledger_id, b"pw"),
                                          b.open_ledger(writer.ledger_id, b"pw"))
            # concurrent recoverers converge on one last entry; then the invariants of a closed ledger
            md = await check_closed_ledger(a, writer.ledger_id, b"pw", acked, failure=failure,
                                           copies_of=acked if len(acked) <= 600 else rnd.sample(acked, 600))
            assert ra.last_add_confirmed == rb.last_add_confirmed == md.last_entry_id, failure

    asyncio.run(asyncio.wait_for(check(), 120))
