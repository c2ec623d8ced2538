"""What a fault rule sees of a frame: the entry ids it names, taken from the decoded message of
each kind (rules match on them, e.g. ``match=lambda info: 5 in info.entry_ids``)."""

from __future__ import annotations

import pytest

from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.testing.faults import Direction, FaultInjector

OK = Status.OK

FRAMES: list[tuple[Direction, bytes, tuple[int, ...]]] = [
    ("request", codec.encode_add(1, 9, 5, b"k", b"x"), (5,)),
    ("request", codec.encode_read(1, 9, 5), (5,)),
    ("request", codec.encode_add_batch(1, 9, b"k", [(5, b"x"), (6, b"y")]), (5, 6)),
    ("request", codec.encode_read_multi(1, 9, [5, 7]), (5, 7)),
    ("request", codec.encode_read_lac(1, 9), ()),
    ("request", codec.encode_list_ledgers(1, 5, 10), ()),
    ("response", codec.encode_add_response(1, OK, 9, 5), (5,)),
    ("response", codec.encode_read_response(1, OK, 9, 5, b"x"), (5,)),
    ("response", codec.encode_add_batch_response(1, OK, 9, [(5, OK), (6, Status.FENCED)]), (5, 6)),
    ("response", codec.encode_add_batch_all_ok(1, 9, 2), ()),
    ("response", codec.encode_read_multi_response(1, OK, 9, [(5, OK, b"x")]), (5,)),
    ("response", codec.encode_lac_response(codec.Op.READ_LAC, 1, OK, 9, 5, 5), ()),
    # ledger ids, not entry ids: a rule on entry 5 must not take a listing that names ledger 5
    ("response", codec.encode_list_ledgers_response(1, OK, [(5, 3), (6, -1)]), ()),
]


@pytest.mark.parametrize(("direction", "frame", "entry_ids"), FRAMES,
                         ids=[f"{d}-{codec.Op(f[1]).name}-{i}" for i, (d, f, _) in enumerate(FRAMES)])
def test_a_rule_sees_the_entry_ids_a_frame_names_and_only_those(direction: Direction, frame: bytes,
                                                                 entry_ids: tuple[int, ...]) -> None:
    info = FaultInjector._decode("b0", direction, frame)
    assert info.op == frame[1] and info.ledger_id in (9, None)
    assert info.entry_ids == entry_ids
