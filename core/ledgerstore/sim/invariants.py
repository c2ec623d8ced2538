"""The invariants of the ledger protocol, checked against what the writer saw acknowledged
(:class:`Ledger`) and what the bookies and the metadata store hold at the end of a run.
``docs/simulation.md`` lists each with its name in the public TLA+ specification."""

from __future__ import annotations

import dataclasses
from typing import Any

from ledgerstore.client.client import Client
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.sim.logs import RunView
from ledgerstore.sim.world import World

PASSWORD = b"sim"


@dataclasses.dataclass
class Ledger:
    """One ledger of the run: what its writer saw acknowledged and how recovery closed it."""

    ledger_id: int
    acked: dict[int, bytes] = dataclasses.field(default_factory=dict)
    order: list[int] = dataclasses.field(default_factory=list)
    failed: BaseException | None = None
    outstanding: int = 0
    recovered: LedgerMetadata | None = None
    #: the writer's handle (the schedule may look at its current fragment)
    handle: Any = None

    def last_ensemble(self) -> list[str]:
        """The names of the bookies of the writer's current fragment."""
        return [b.split(":")[0] for b in self.handle.md.ensembles[-1][1]]


def acks_in_order(ledger_id: int, order: list[int], eid: int) -> str | None:
    """Why the ack of ``eid``, after the acks of ``order``, breaks the ack order (None if not)."""
    if order and eid <= order[-1]:
        return f"ledger {ledger_id}: ack of entry {eid} after the ack of entry {order[-1]} (acks out of order)"
    return None


def must_recover(world: World, md: LedgerMetadata, lost: set[str], read_only: set[str]) -> str | None:
    """Why the ledger of ``md`` must be recoverable with the ``lost`` bookies still down and the
    ``read_only`` ones still read-only (None if it need not be): at most Qa−1 bookies of any
    fragment are lost, so every write quorum of the last one still has Qw−Qa+1 to fence and
    every acknowledged entry a copy recovery can read back (it reads 0..LAC to learn the
    length), and a writable bookie outside the last fragment can take each lost one's place
    (issue 14 item 2: recovery's write-back replaces a bookie that does not answer); a
    read-only bookie is running and takes recovery adds (item 6)."""
    if not lost and not read_only:
        return None
    ensemble = [b.split(":")[0] for b in md.ensembles[-1][1]]
    gone = [b for b in ensemble if b in lost]
    spares = [b for b in world.bookies if b.running and b.name not in ensemble and b.name not in read_only]
    if any(sum(b.split(":")[0] in lost for b in bookies) > md.ack_quorum - 1 for _, bookies in md.ensembles):
        return None
    if len(spares) < len(gone) or not (gone or read_only & set(ensemble)):
        return None
    return (f"{gone} lost (Qa {md.ack_quorum}), {sorted(read_only & set(ensemble))} of its last fragment "
            f"read-only, {len(spares)} writable spare bookies running")


async def check_ledger(run: RunView, led: Ledger, reader: Client) -> None:
    """The invariants of one recovered ledger against what its writer saw acknowledged."""
    md = led.recovered
    assert md is not None
    lid = led.ledger_id
    acked = led.acked
    if led.order != list(range(len(led.order))):
        run.violation(f"ledger {lid}: acknowledged entries are not a prefix 0..k: {led.order[:8]}")
    beyond = [e for e in acked if e > md.last_entry_id]
    if beyond:
        run.violation(f"ledger {lid}: entries {beyond[:5]} were acknowledged to the writer but the ledger was "
                      f"closed at {md.last_entry_id} (an ack after fencing, or recovery lost them)")
    for first, bookies in md.ensembles:
        if len(set(bookies)) != len(bookies):
            run.violation(f"ledger {lid}: the fragment at entry {first} names a bookie twice: {bookies}")
    try:
        rh = await reader.open_ledger(lid, PASSWORD, recovery=True)
        entries = await rh.read(0, md.last_entry_id) if md.last_entry_id >= 0 else []
    except LedgerStoreError as exc:
        run.violation(f"ledger {lid}: reading 0..{md.last_entry_id} failed: {exc!r}")
        return
    got = {e.entry_id: e.payload for e in entries}
    # issue 14 item 9: a recovered ledger's length is the payload bytes of entries 0..LAC, in its
    # metadata and on every handle opened afterwards
    length = sum(len(p) for p in got.values())
    if len(got) == md.last_entry_id + 1 and (md.length, rh.length) != (length, length):
        run.violation(f"ledger {lid}: closed at {md.last_entry_id} with {length} payload bytes, but its metadata "
                      f"says length {md.length} and a handle opened afterwards {rh.length}")
    for eid, payload in acked.items():
        if eid <= md.last_entry_id and got.get(eid) != payload:
            run.violation(f"ledger {lid}: acknowledged entry {eid} reads back as {got.get(eid)!r}, not {payload!r}")
    engines = {b.bookie_id: b.engine() for b in run.world.bookies}
    for eid in acked:
        if eid > md.last_entry_id:
            continue
        _, ensemble = md.ensemble_for(eid)
        holders = [ensemble[i] for i in md.write_set(eid)]
        have = 0
        for bid in holders:
            eng = engines.get(bid)
            if eng is not None and eid in eng.ledgers.get(lid, _NO_LEDGER).entries:
                have += 1
        if have < md.ack_quorum:
            run.violation(f"ledger {lid}: acknowledged entry {eid} is on {have} of its write set {holders} "
                          f"(Qa {md.ack_quorum})")


class _Empty:
    entries: dict[int, bytes] = {}


_NO_LEDGER: Any = _Empty()
