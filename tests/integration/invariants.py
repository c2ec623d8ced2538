"""The protocol invariants of DESIGN.md as checks over a closed ledger, shared by the randomized
fault runs, and the seed list those runs take from the environment."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence

from ledgerstore.aio import Client
from ledgerstore.errors import DigestMismatchError, LedgerStoreError
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DigestManager


def fault_seeds(default: int) -> list[int]:
    """``LEDGERSTORE_FAULT_SEED=<n>`` replays seed n alone; ``LEDGERSTORE_FAULT_SEEDS=<n>`` runs
    seeds 1..n; otherwise seeds 1..``default``."""
    if os.environ.get("LEDGERSTORE_FAULT_SEED"):
        return [int(os.environ["LEDGERSTORE_FAULT_SEED"])]
    return list(range(1, int(os.environ.get("LEDGERSTORE_FAULT_SEEDS", str(default))) + 1))


def payload_of(entry_id: int) -> bytes:
    """The payload fault-run writers give entry ``entry_id`` (as ``writer_proc.py`` does)."""
    return b"entry-%08d" % entry_id


async def holders(client: Client, md: LedgerMetadata, password: bytes, entry_ids: Iterable[int],
                  timeout: float = 10.0) -> dict[int, list[str]]:
    """For each entry, the bookies of its write set that return a valid copy to a plain READ
    (no fencing, no fallback: each replica asked on its own)."""
    dm = DigestManager(md.ledger_id, md.digest_type, password)

    async def has_copy(bookie: str, entry_id: int) -> bool:
        try:
            r = await client.pool.get(bookie).request(
                lambda rid: codec.encode_read(rid, md.ledger_id, entry_id), timeout)
        except LedgerStoreError:
            return False
        if r.status != Status.OK:
            return False
        try:
            dm.verify(r.entry, entry_id)
        except DigestMismatchError:
            return False
        return True

    async def of(entry_id: int) -> list[str]:
        _, ensemble = md.ensemble_for(entry_id)
        bookies = [ensemble[i] for i in md.write_set(entry_id)]
        found = await asyncio.gather(*(has_copy(b, entry_id) for b in bookies))
        return [b for b, ok in zip(bookies, found, strict=True) if ok]

    ids = list(entry_ids)
    return dict(zip(ids, await asyncio.gather(*(of(e) for e in ids)), strict=True))


async def check_closed_ledger(client: Client, ledger_id: int, password: bytes, acked: Sequence[int], *,
                              failure: str, copies_of: Iterable[int] | None = None) -> LedgerMetadata:
    """Check a ledger after its writer is gone and recovery closed it:

    - it is closed, and the writer's acknowledgements came in entry order (0, 1, 2, ...);
    - no divergence: every acknowledged entry is at or below the closed ledger's last entry;
    - entries 0..last read back, in order, with the writer's payloads (:func:`payload_of`);
    - every entry of ``copies_of`` (default: all of 0..last) has at least Qa valid copies in its
      write set, so it stays readable after the loss of any Qa - 1 of its bookies.

    Returns the closed metadata. ``failure`` (the seed and schedule) starts every message.
    """
    md = await client.ledger_metadata(ledger_id)
    last = md.last_entry_id
    assert md.state is LedgerState.CLOSED, f"{failure}: ledger {ledger_id} is {md.state.value}, not closed"
    assert list(acked) == list(range(len(acked))), f"{failure}: acknowledgements out of entry order: {list(acked)[:50]}"
    assert not acked or acked[-1] <= last, (
        f"{failure}: divergence: the writer acknowledged up to {acked[-1]}, the ledger was closed at {last}")
    reader = await client.open_ledger(ledger_id, password)
    got = await reader.read(0, last) if last >= 0 else []
    assert [e.payload for e in got] == [payload_of(i) for i in range(last + 1)], (
        f"{failure}: entries 0..{last} do not read back as written")
    entries = range(last + 1) if copies_of is None else copies_of
    found = await holders(client, md, password, entries)
    low = {e: h for e, h in found.items() if len(h) < md.ack_quorum}
    assert not low, (f"{failure}: entries with fewer than Qa={md.ack_quorum} valid copies in their write set "
                     f"(lost with one more bookie): {dict(list(low.items())[:10])}")
    return md
