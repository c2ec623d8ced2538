"""The simulation's fence watch (``ledgerstore.sim.invariants.FenceWatch``) on hand-made frames: a
bookie that fenced a ledger and then acknowledges a plain add of it that arrived afterwards is
reported; the adds of a bookie's own limbo repair, on a connection of its process to itself, are
not (seeds 1053 and 3439 of the 10,000-seed run: with a request and its answer both going "from bookie-5 to
bookie-5", the answer of a recovery add was taken for a plain add arriving, and the answer to its
duplicate for the acknowledgement)."""

from __future__ import annotations

from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Status
from ledgerstore.sim.invariants import FenceWatch

LEDGER = 1
KEY = b"k" * 20


def fenced_watch() -> tuple[FenceWatch, list[str]]:
    """A watch over bookie ``b`` that has answered a fencing read of the ledger from a recoverer."""
    found: list[str] = []
    watch = FenceWatch(lambda message, *_: found.append(message))
    watch.serving("b")
    watch.sent("recoverer", "b", 1, codec.encode_read(7, LEDGER, 0, KEY, FLAG_FENCE))
    watch.sent("b", "recoverer", 1, codec.encode_read_response(7, Status.OK, LEDGER, 0, b"entry"))
    return watch, found


def add_batch(rid: int, flags: int) -> bytes:
    return codec.AddBatchRequest.frame(rid, LEDGER, KEY, [(e, b"x") for e in range(3)], flags)


def repair_with_a_duplicate(watch: FenceWatch, repairer: str, conn: int, rid: int) -> None:
    """A repair's recovery add to bookie ``b`` on ``conn``: it arrives, its answer goes back and
    arrives, the request arrives again (a duplicate) and is answered again."""
    request, answer = add_batch(rid, FLAG_RECOVERY_ADD), codec.encode_add_batch_all_ok(rid, LEDGER, 3)
    watch.arrived(repairer, "b", conn, request)
    watch.sent("b", repairer, conn, answer)
    watch.arrived("b", repairer, conn, answer)
    watch.arrived(repairer, "b", conn, request)
    watch.sent("b", repairer, conn, answer)


def test_a_plain_add_acknowledged_after_the_fence_is_reported() -> None:
    watch, found = fenced_watch()
    watch.arrived("writer", "b", 2, add_batch(40, 0))
    watch.sent("b", "writer", 2, codec.encode_add_batch_all_ok(40, LEDGER, 3))
    assert found and "acknowledged an add of ledger 1" in found[0]


def test_a_recovery_add_acknowledged_after_the_fence_is_not() -> None:
    watch, found = fenced_watch()
    watch.arrived("recoverer", "b", 2, add_batch(40, FLAG_RECOVERY_ADD))
    watch.sent("b", "recoverer", 2, codec.encode_add_batch_all_ok(40, LEDGER, 3))
    assert found == []


def test_the_repair_of_a_bookie_on_its_own_connection_is_not_taken_for_a_plain_add() -> None:
    """The order of seed 1053 on the repair's connection (17): the recovery add arrives, its
    answer arrives back (looking like a plain add of the ledger: status 0 in the flags' place),
    the request arrives again (a duplicate) and is answered."""
    watch, found = fenced_watch()
    repair_with_a_duplicate(watch, "b", 17, 40)
    assert found == []


def test_the_repair_of_another_bookie_is_not_taken_for_a_plain_add() -> None:
    """Seed 3439: bookie ``r``'s limbo repair writes recovery adds to bookie ``b``. Both are
    bookies, so ``b``'s answer reaching ``r`` once looked like a plain add reaching a bookie, and
    ``b``'s answer to the request's duplicate like its acknowledgement. Who opened the connection
    says which frames are requests."""
    watch, found = fenced_watch()
    watch.serving("r")  # r had fenced the ledger too, before it lost its data
    watch.sent("recoverer", "r", 5, codec.encode_read(8, LEDGER, 0, KEY, FLAG_FENCE))
    watch.sent("r", "recoverer", 5, codec.encode_read_response(8, Status.OK, LEDGER, 0, b"entry"))
    watch.sent("r", "b", 43, add_batch(11, FLAG_RECOVERY_ADD))  # r opens connection 43
    repair_with_a_duplicate(watch, "r", 43, 11)
    assert found == []


def test_a_plain_add_from_another_bookies_process_after_the_fence_is_reported() -> None:
    watch, found = fenced_watch()
    watch.serving("r")
    watch.sent("r", "b", 44, add_batch(12, 0))
    watch.arrived("r", "b", 44, add_batch(12, 0))
    watch.sent("b", "r", 44, codec.encode_add_batch_all_ok(12, LEDGER, 3))
    assert found and "acknowledged an add of ledger 1" in found[0]
