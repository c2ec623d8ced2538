"""The invariants of the ledger protocol, each with a name: checked against what the writer saw
acknowledged (:class:`Ledger`) and what the bookies and the metadata store hold at the end of a
run, and as the run goes: at each add the writer sends (:class:`PiggybackedLac`) and at each
frame a bookie answers (:class:`FenceWatch`). ``docs/simulation.md`` lists each with its name in
the public TLA+ specification of the protocol where it has one."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from ledgerstore.client.client import Client
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Op, Status
from ledgerstore.proto.digest import ENTRY_HEADER
from ledgerstore.sim.logs import RunView
from ledgerstore.sim.world import World

PASSWORD = b"sim"
#: records a broken invariant: ``(text, name)``
Report = Callable[[str, str], None]

# the invariants' names (what shrinking compares; the TLA+ names beside them in docs/simulation.md)
#: acknowledgements reach the writer in entry order
ACKS_IN_ORDER = "acks-in-order"
#: no entry acknowledged to the writer lies past the end recovery closed the ledger at
NO_DIVERGENCE = "no-divergence"
#: every acknowledged entry reads back with its bytes
ACKED_READABLE = "acked-readable"
#: every acknowledged entry is stored on Qa bookies of its write set
ACK_QUORUM = "ack-quorum"
#: no fragment names a bookie twice
VALID_FRAGMENTS = "valid-fragments"
#: a recovered ledger's length is the payload bytes of entries 0..LAC
LENGTH = "length"
#: a healthy cluster recovers every ledger, settles every add, restarts every bookie
LIVENESS = "liveness"
#: the LAC every add carries is within the writer's contiguous acknowledged prefix
LAC_WITHIN_ACKED = "lac-within-acked-prefix"
#: a tailing reader sees only entries up to the LAC it was given, each in the final ledger
TAIL_READS_COMMITTED = "tail-reads-committed"
#: a bookie that fenced a ledger never acknowledges an add of it again, restarts or not
FENCE_IS_DURABLE = "fence-is-durable"


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
    #: the future of every add, in entry order
    futures: list[asyncio.Future[int]] = dataclasses.field(default_factory=list)
    #: the last entry of the contiguous prefix of adds acknowledged to the writer (-1: none)
    prefix: int = -1
    #: what tailing readers read: (entry id, payload, the LAC they were given)
    tailed: list[tuple[int, bytes, int]] = dataclasses.field(default_factory=list)
    #: set once a recoverer goes for the ledger during the run
    recovering: bool = False

    def cap(self, entries: int) -> int:
        """How many adds the writer may make under a cap of ``entries`` (shrinking): as many
        before the ledger's recovery begins, and as many again after (the adds that race it)."""
        return entries if not self.recovering else 2 * entries

    def last_ensemble(self) -> list[str]:
        """The names of the bookies of the writer's current fragment."""
        return [b.split(":")[0] for b in self.handle.md.ensembles[-1][1]]

    def acked_prefix(self) -> int:
        """The last entry of the contiguous prefix of adds whose futures resolved with success
        (as the writer's application sees them the moment they resolve)."""
        futs = self.futures
        k = self.prefix
        while k + 1 < len(futs):
            fut = futs[k + 1]
            if not fut.done() or fut.cancelled() or fut.exception() is not None:
                break
            k += 1
        self.prefix = k
        return k


class PiggybackedLac:
    """At every add frame the writer of ``led`` sends: the last-add-confirmed each entry carries
    is within the writer's contiguous acknowledged prefix (the LAC a reader trusts names only
    entries on Qa bookies). The writer handle's send seam (``LedgerHandle.send_observer``)."""

    def __init__(self, violation: Report, led: Ledger) -> None:
        self.violation = violation
        self.led = led
        self.broken = False

    def __call__(self, bookie_id: str, body: bytes) -> None:
        req = codec.decode_request(codec.add_batch_header(0) + body)
        assert isinstance(req, codec.AddBatchRequest)
        for eid, entry in req.entries:
            lac = ENTRY_HEADER.unpack_from(entry)[2]
            if lac > self.led.prefix and lac > self.led.acked_prefix() and not self.broken:
                self.broken = True  # once per ledger: every later add repeats it
                self.violation(
                    f"ledger {self.led.ledger_id}: entry {eid} went to {bookie_id} carrying LAC {lac}, past the "
                    f"writer's acknowledged prefix 0..{self.led.prefix}", LAC_WITHIN_ACKED)


class FenceWatch:
    """At the network seam: once a bookie has answered a fencing request of a ledger (a fenced
    READ_LAC or READ, answered only once the fence is durable), it never acknowledges a
    non-recovery add of that ledger that reached it afterwards, however often it restarts."""

    def __init__(self, violation: Report) -> None:
        self.violation = violation
        #: (connection, request id) -> ledger id of a fencing request not yet answered
        self._fencing: dict[tuple[int, int], int] = {}
        #: (connection, request id) -> (ledger id, whether the bookie had fenced it when the add
        #: first reached it); only first arrivals count (a duplicate's twin may have come earlier)
        self._adds: dict[tuple[int, int], tuple[int, bool]] = {}
        #: (bookie, ledger id) -> how many times the bookie started since it fenced the ledger
        self.fenced: dict[tuple[str, int], int] = {}
        self.starts: dict[str, int] = {}
        #: connection -> the node that opened it (its first frame is a request of that node's)
        self._client: dict[int, str] = {}

    def _is_request(self, src: str, dst: str, conn: int) -> bool | None:
        """Whether a frame from ``src`` on ``conn`` is a request (else an answer), or None when it
        cannot be told: a connection of a bookie's own process to itself (its limbo repair), whose
        requests and answers both go from that name to that name (seed 1053); its adds are
        recovery adds anyway. A bookie's repair client talks to other bookies too, so a frame's
        direction is told by who opened the connection, not by whether its sender is a bookie (an
        answer to the repair's recovery add, reaching the repairing bookie, was taken for a plain
        add reaching it, seed 3439)."""
        if src == dst:
            return None
        return self._client.setdefault(conn, src) == src

    def sent(self, src: str, dst: str, conn: int, frame: bytes) -> None:
        """``src`` sends ``frame`` on connection ``conn`` (after any hold: it leaves now)."""
        if len(frame) < codec.HEADER_SIZE:
            return
        request = self._is_request(src, dst, conn)
        if request is None:
            return
        _, op, flags, rid = codec.HEADER.unpack_from(frame)
        if request:
            if op in (Op.READ, Op.READ_LAC) and flags & FLAG_FENCE:
                self._fencing[(conn, rid)] = _ledger_of(frame)
            return
        if src not in self.starts:
            return
        lid = self._fencing.pop((conn, rid), None)  # a bookie's answer
        status = flags
        if lid is not None:
            if status in (Status.OK, Status.NO_SUCH_ENTRY):
                self.fenced.setdefault((src, lid), self.starts[src])
            return
        add = self._adds.pop((conn, rid), None)
        if add is None or not add[1] or op not in (Op.ADD, Op.ADD_BATCH) or status != Status.OK:
            return
        resp = codec.decode_response(frame)
        if isinstance(resp, codec.AddBatchResponse) and not resp.all_ok and all(st for _, st in resp.items):
            return
        lid = add[0]
        restarts = self.starts[src] - self.fenced[(src, lid)]
        self.violation(f"{src} acknowledged an add of ledger {lid} that reached it after it had fenced the "
                           f"ledger ({restarts} restarts since)", FENCE_IS_DURABLE)

    def arrived(self, src: str, dst: str, conn: int, frame: bytes) -> None:
        """``frame`` from ``src`` reaches ``dst`` on connection ``conn``: a request (see
        :meth:`_is_request`) counts when it is a plain add reaching a bookie."""
        if len(frame) < codec.HEADER_SIZE or dst not in self.starts or not self._is_request(src, dst, conn):
            return
        _, op, flags, rid = codec.HEADER.unpack_from(frame)
        if op not in (Op.ADD, Op.ADD_BATCH) or flags & FLAG_RECOVERY_ADD or (conn, rid) in self._adds:
            return
        ledger_id = _ledger_of(frame)
        self._adds[(conn, rid)] = (ledger_id, (dst, ledger_id) in self.fenced)

    def serving(self, node: str) -> None:
        """``node`` (a bookie) serves again, on the disks it had (a wiped bookie starts over only
        once every ledger is closed and its writers gone: none of its fences matter then)."""
        self.starts[node] = self.starts.get(node, 0) + 1


def _ledger_of(frame: bytes) -> int:
    """The ledger id of an ADD, ADD_BATCH, READ or READ_LAC request (each body starts with it)."""
    return int.from_bytes(frame[codec.HEADER_SIZE : codec.HEADER_SIZE + 8], "big")


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
        run.violation(f"ledger {lid}: acknowledged entries are not a prefix 0..k: {led.order[:8]}", ACKS_IN_ORDER)
    beyond = [e for e in acked if e > md.last_entry_id]
    if beyond:
        run.violation(f"ledger {lid}: entries {beyond[:5]} were acknowledged to the writer but the ledger was "
                      f"closed at {md.last_entry_id} (an ack after fencing, or recovery lost them)", NO_DIVERGENCE)
    for first, bookies in md.ensembles:
        if len(set(bookies)) != len(bookies):
            run.violation(f"ledger {lid}: the fragment at entry {first} names a bookie twice: {bookies}",
                          VALID_FRAGMENTS)
    try:
        rh = await reader.open_ledger(lid, PASSWORD, recovery=True)
        entries = await rh.read(0, md.last_entry_id) if md.last_entry_id >= 0 else []
    except LedgerStoreError as exc:
        run.violation(f"ledger {lid}: reading 0..{md.last_entry_id} failed: {exc!r}", ACKED_READABLE)
        return
    got = {e.entry_id: e.payload for e in entries}
    # issue 14 item 9: a recovered ledger's length is the payload bytes of entries 0..LAC, in its
    # metadata and on every handle opened afterwards
    length = sum(len(p) for p in got.values())
    if len(got) == md.last_entry_id + 1 and (md.length, rh.length) != (length, length):
        run.violation(f"ledger {lid}: closed at {md.last_entry_id} with {length} payload bytes, but its metadata "
                      f"says length {md.length} and a handle opened afterwards {rh.length}", LENGTH)
    for eid, payload in acked.items():
        if eid <= md.last_entry_id and got.get(eid) != payload:
            run.violation(f"ledger {lid}: acknowledged entry {eid} reads back as {got.get(eid)!r}, not {payload!r}",
                          ACKED_READABLE)
    for eid, payload, lac in led.tailed:
        if eid > md.last_entry_id or got.get(eid) != payload:
            run.violation(f"ledger {lid}: a tailing reader given LAC {lac} read entry {eid} as {payload!r}, but the "
                          f"ledger closed at {md.last_entry_id} holds {got.get(eid)!r}", TAIL_READS_COMMITTED)
            break
    stored = {b.bookie_id: b.stored([lid]).get(lid, set()) for b in run.world.bookies}
    for eid in acked:
        if eid > md.last_entry_id:
            continue
        _, ensemble = md.ensemble_for(eid)
        holders = [ensemble[i] for i in md.write_set(eid)]
        have = 0
        for bid in holders:
            if eid in stored.get(bid, ()):
                have += 1
        if have < md.ack_quorum:
            run.violation(f"ledger {lid}: acknowledged entry {eid} is on {have} of its write set {holders} "
                          f"(Qa {md.ack_quorum})", ACK_QUORUM)
