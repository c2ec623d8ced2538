"""Recovery never closes a ledger below an acknowledged entry because a bookie that lost its data
said "no such entry".

Three bookie processes (LocalCluster), a ledger with ensemble [A, B, C], Qw = Qa = 2, entries
0 and 1 acknowledged and the writer still open: entry e is on bookies e mod 3 and e+1 mod 3, so
entry 0 is on A and B, entry 1 on B and C only, and A knows no LAC (entry 0 carries -1). B is
killed, its journal and ledger directories emptied (its cookie files and its registration kept),
C is killed and B started again. Recovery fences the ledger and reads forward from entry 0: entry 0
is found on A (and written back to B), entry 1 is asked of B and C.

Without limbo (``data_integrity_checking_enabled = false``) B answers NO_SUCH_ENTRY, one vote is
all an entry of a Qw = Qa = 2 ledger needs to be taken as never acknowledged, and the ledger is
closed at entry 0 (or at -1, when B's answer for entry 0 comes first): acknowledged entries are
lost. With limbo (the default) B answers UNKNOWN,
which is no vote: the attempt fails and the ledger stays unclosed, and once C is back recovery
closes it at entry 1 with both entries readable; B then repairs itself from A and C and leaves
limbo (``ledgerstore shell limbo`` shows none left).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from ledgerstore.aio import Client
from ledgerstore.bookie.cookie import COOKIE_FILE
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import LedgerRecoveryError
from ledgerstore.meta.ledgers import LedgerState
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status

PW = b"acknowledged"
ENTRIES = 2
A, B, C = 0, 1, 2


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 240))


def empty_directories(cluster: LocalCluster, i: int) -> None:
    """Bookie ``i``'s journal and ledger directories emptied, their cookie files kept (a restore
    from an empty backup, a reformat that kept the identity)."""
    root = cluster.config_path(i).parent
    for d in (root / "journal", root / "ledgers"):
        assert d.is_dir(), d
        for p in d.iterdir():
            if p.name != COOKIE_FILE:
                shutil.rmtree(p) if p.is_dir() else p.unlink()


async def acknowledged_then_b_emptied_and_c_down(cluster: LocalCluster) -> tuple[int, Client]:
    """Write entries 0 and 1 (both acknowledged, the writer left open), then stop C and empty B.
    Returns the ledger id and the writer's client (the caller closes it)."""
    writer = await Client(metadata=cluster.metadata).start()
    lh = await writer.create_ledger(3, 2, 2, password=PW, bookies=[cluster.bookie_id(i) for i in (A, B, C)])
    for e in range(ENTRIES):
        assert await lh.append(f"entry {e}".encode()) == e
    cluster.kill(B)
    empty_directories(cluster, B)
    cluster.kill(C)  # first: B's own repair would otherwise recover the ledger from C at once
    cluster.restart(B)
    return lh.ledger_id, writer


def in_limbo(cluster: LocalCluster, i: int) -> dict[str, Any]:
    """``ledgerstore shell limbo`` for bookie ``i``."""
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "shell", "limbo", "--config",
                          str(cluster.config_path(i)), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def start(cluster_factory: Callable[..., LocalCluster], extra: str = "") -> LocalCluster:
    cluster = cluster_factory(3, extra_bookie_config=extra)
    cluster.start()
    return cluster


def test_with_limbo_recovery_waits_for_a_real_vote_and_keeps_every_acknowledged_entry(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = start(cluster_factory)

    async def main() -> None:
        lid, writer = await acknowledged_then_b_emptied_and_c_down(cluster)
        try:
            async with Client(metadata=cluster.metadata, read_timeout_s=2.0, add_timeout_s=2.0) as reader:
                with pytest.raises(LedgerRecoveryError, match="cannot tell whether entry 1 exists"):
                    await reader.open_ledger(lid, PW)
                assert (await reader.ledger_metadata(lid)).state is LedgerState.IN_RECOVERY  # not closed short
                cluster.restart(C)
                rh = await reader.open_ledger(lid, PW)
                assert rh.metadata.last_entry_id == ENTRIES - 1
                got = [e.payload async for e in rh.iter_entries(0, ENTRIES - 1)]
                assert got == [f"entry {e}".encode() for e in range(ENTRIES)]
                # B repairs itself from A and C (retrying every few seconds) and leaves limbo
                deadline = time.monotonic() + 60
                while (left := in_limbo(cluster, B))["ledgers_in_limbo"]:
                    assert time.monotonic() < deadline, left
                    await asyncio.sleep(0.5)
                for e in range(ENTRIES):
                    resp = await reader.pool.get(cluster.bookie_id(B)).request(
                        lambda r, e=e: codec.encode_read(r, lid, e), 10)
                    assert resp.status == Status.OK
        finally:
            await writer.close()

    run(main())


def test_without_limbo_the_emptied_bookies_no_such_entry_closes_the_ledger_below_an_acknowledged_entry(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    """The hazard limbo exists for, shown on the same scenario: this is what the test above finds
    when ``data_integrity_checking_enabled`` is off."""
    cluster = start(cluster_factory, "data_integrity_checking_enabled = false\n")

    async def main() -> None:
        lid, writer = await acknowledged_then_b_emptied_and_c_down(cluster)
        try:
            async with Client(metadata=cluster.metadata, read_timeout_s=2.0, add_timeout_s=2.0) as reader:
                rh = await reader.open_ledger(lid, PW)
                # closed at entry 0, or at -1 when B's "no such entry" for entry 0 comes before A's
                # answer: either way acknowledged entries are gone
                assert rh.metadata.is_closed and rh.metadata.last_entry_id < ENTRIES - 1
        finally:
            await writer.close()

    run(main())
