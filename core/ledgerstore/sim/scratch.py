"""Scratch ledgers: a process that writes short-lived ledgers and deletes them, so that the
bookies' garbage collection and compaction have work while the writer's ledgers live.

Its entries go into the same entry logs as the writer's. Once it deletes a ledger, each
bookie's GC pass (every few simulated seconds: ``ledgerstore.sim.world.GC``) deletes the
ledger's index, deletes the entry logs left with no live ledger and compacts the sparse ones,
copying the writer's live entries forward: the final checks then read every acknowledged entry
back from bookies whose logs were compacted, crashed in, and replayed. Nothing it writes is
checked (the ledgers are gone); it tolerates every failure the faults cause.
"""

from __future__ import annotations

import asyncio

from ledgerstore.client.client import Client
from ledgerstore.errors import LedgerStoreError
from ledgerstore.sim.invariants import PASSWORD
from ledgerstore.sim.world import World


class ScratchLedgers:
    """The ``scratch`` process (:meth:`run` until the end of the faults)."""

    def __init__(self, world: World, until: float) -> None:
        self.world = world
        self.until = until
        self.rng = world.rng_for("scratch")
        self.stats = {"scratch_ledgers": 0, "scratch_deleted": 0}

    async def run(self, client: Client) -> None:
        """Write a ledger of 10 to 60 entries of 100 to 400 bytes, close it, delete it 0.5 to 5
        seconds later; again, until ``until``."""
        loop = self.world.loop
        rng = self.rng
        n = len(self.world.bookies)
        while loop.time() < self.until:
            await asyncio.sleep(rng.uniform(0.2, 2.0))
            ens = min(3, n)
            try:
                lh = await client.create_ledger(ens, ens, max(1, ens - 1), password=PASSWORD)
                self.stats["scratch_ledgers"] += 1
                size = rng.randint(100, 400)
                for i in range(rng.randint(10, 60)):
                    await lh.append(bytes([i % 251]) * size)
                await lh.close()
            except (TimeoutError, LedgerStoreError):
                continue
            loop.call_later(rng.uniform(0.5, 5.0), self._start_delete, client, lh.ledger_id)

    def _start_delete(self, client: Client, ledger_id: int) -> None:
        self.world.loop.create_task(self._delete(client, ledger_id))

    async def _delete(self, client: Client, ledger_id: int) -> None:
        try:
            await client.delete_ledger(ledger_id)
        except (TimeoutError, LedgerStoreError):
            return
        self.stats["scratch_deleted"] += 1
        self.world.trace("scratch.deleted", f"L{ledger_id}")
