"""The wire codec: round trips, and refusal of anything malformed (property-based)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerstore.errors import FrameTooLargeError, ProtocolError
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Op, Status

# every test here runs on the compiled hot path and on the pure-Python one
pytestmark = pytest.mark.usefixtures("hot_path")

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
eid = st.integers(0, 2**63 - 1)
lid = eid  # ledger ids are Java longs too: 0..2**63-1 on the wire
key = st.binary(max_size=64)

requests = st.one_of(
    st.builds(codec.AddRequest, u64, lid, eid, key, st.binary(max_size=2000), st.sampled_from([0, codec.FLAG_RECOVERY_ADD])),
    st.builds(codec.ReadRequest, u64, lid, eid, key, st.sampled_from([0, codec.FLAG_FENCE])),
    st.builds(codec.ReadLacRequest, u64, lid, key, st.sampled_from([0, codec.FLAG_FENCE])),
    st.builds(codec.LongPollLacRequest, u64, lid, st.integers(-1, 2**63 - 1), st.integers(0, 2**32 - 1)),
    st.builds(codec.BookieInfoRequest, u64, st.sampled_from([0, codec.FLAG_INSTANCE])),
    st.builds(codec.AddBatchRequest, u64, lid, key,
              st.lists(st.tuples(eid, st.binary(max_size=300)), max_size=20).map(tuple),
              st.sampled_from([0, codec.FLAG_RECOVERY_ADD])).map(
        # a decoded batch also carries its entry section as received (what a bookie journals)
        lambda r: dataclasses.replace(r, raw_entries=b"".join(struct.pack(">QI", e, len(d)) + d for e, d in r.entries))),
    st.builds(codec.ReadMultiRequest, u64, lid, st.lists(eid, max_size=50).map(tuple)),
    st.builds(codec.ListLedgersRequest, u64, lid, st.integers(1, codec.MAX_LIST_LEDGERS)),
)
statuses = st.sampled_from(list(Status))
responses = st.one_of(
    st.builds(codec.AddResponse, u64, statuses, u64, u64),
    st.builds(codec.ReadResponse, u64, statuses, u64, i64, st.binary(max_size=500)),
    st.builds(codec.ReadLacResponse, u64, statuses, u64, i64, i64),
    st.builds(codec.LongPollLacResponse, u64, statuses, u64, i64, i64),
    st.builds(codec.BookieInfoResponse, u64, statuses, u64, u64, u64, st.booleans(), st.one_of(st.just(0), u64)),
    st.builds(lambda r, s, lid, items: codec.AddBatchResponse(r, s, lid, items, len(items)), u64,
              statuses, u64, st.lists(st.tuples(u64, statuses.map(int)), max_size=30).map(tuple)),
    st.builds(lambda r, lid, n: codec.AddBatchResponse(r, Status.OK, lid, count=n, all_ok=True), u64, u64,
              st.integers(1, 2**32 - 1)),
    st.builds(codec.ReadMultiResponse, u64, statuses, u64,
              st.lists(st.tuples(i64, statuses.map(int), st.binary(max_size=100)), max_size=20).map(tuple)),
    st.builds(codec.ListLedgersResponse, u64, statuses,
              st.lists(st.tuples(lid, i64), max_size=30).map(tuple)),
)


@given(requests)
def test_request_round_trip(req: codec.Request) -> None:
    assert codec.decode_request(codec.encode_request(req)) == req


@given(responses)
def test_response_round_trip(resp: codec.Response) -> None:
    assert codec.decode_response(codec.encode_response(resp)) == resp


@given(requests.filter(lambda r: not isinstance(r, codec.AddRequest)), st.data())
def test_truncated_requests_are_refused(req: codec.Request, data: st.DataObject) -> None:
    frame = codec.encode_request(req)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ProtocolError):
        codec.decode_request(frame[:cut])


@given(st.builds(codec.AddRequest, u64, lid, eid, st.binary(min_size=1, max_size=64), st.binary(max_size=100), st.just(0)), st.data())
def test_truncated_add_header_or_key_is_refused(req: codec.AddRequest, data: st.DataObject) -> None:
    frame = codec.encode_request(req)
    cut = data.draw(st.integers(0, codec.HEADER_SIZE + 18 + len(req.master_key) - 1))
    with pytest.raises(ProtocolError):
        codec.decode_request(frame[:cut])


@given(requests.filter(lambda r: not isinstance(r, codec.AddRequest)), st.binary(min_size=1, max_size=20))
def test_trailing_garbage_is_refused(req: codec.Request, extra: bytes) -> None:
    with pytest.raises(ProtocolError):
        codec.decode_request(codec.encode_request(req) + extra)


@given(st.binary(max_size=200))
@settings(max_examples=2000)
def test_random_bytes_never_crash_the_decoder(frame: bytes) -> None:
    try:
        codec.decode_request(frame)
    except ProtocolError:
        pass
    try:
        codec.decode_response(frame)
    except ProtocolError:
        pass


@given(st.integers(max(Op) + 1, 255))
def test_unknown_opcode_is_refused(op: int) -> None:
    frame = codec.HEADER.pack(codec.PROTOCOL_VERSION, op, 0, 7)
    with pytest.raises(ProtocolError, match="unknown opcode"):
        codec.decode_request(frame)


def test_wrong_version_is_refused() -> None:
    frame = bytearray(codec.encode_bookie_info(1))
    frame[0] = 99
    with pytest.raises(ProtocolError, match="version 99"):
        codec.decode_request(bytes(frame))


def test_oversized_frame_is_refused_before_decoding() -> None:
    frame = codec.encode_add(1, 2, 3, b"k", b"x" * 2000)
    with pytest.raises(FrameTooLargeError):
        codec.decode_request(frame, max_frame_size=1000)


def test_header_layout_is_stable() -> None:
    """The documented layout (docs/protocol.md): version, op, flags, request id, big-endian."""
    frame = codec.encode_read(0x0102030405060708, 9, 10, b"", codec.FLAG_FENCE)
    assert frame[:12] == struct.pack(">BBHQ", 1, 2, 1, 0x0102030405060708)


@given(st.lists(st.tuples(eid, st.binary(max_size=50)), min_size=1, max_size=10), st.data())
def test_add_batch_lengths_that_lie_are_refused(entries: list[tuple[int, bytes]], data: st.DataObject) -> None:
    frame = bytearray(codec.encode_add_batch(1, 2, b"k", entries))
    # claim one more entry than the frame carries, or cut the last one short
    if data.draw(st.booleans()):
        struct.pack_into(">I", frame, codec.HEADER_SIZE + 10, len(entries) + 1)
    else:
        frame = frame[: len(frame) - 1] if entries[-1][1] else frame + b"x"
    with pytest.raises(ProtocolError):
        codec.decode_request(bytes(frame))


@pytest.mark.parametrize("dtype", ["crc32c", "crc32", "hmac-sha256", "none"])
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=20), first=eid, lac=st.integers(-1, 2**62))
def test_signed_batch_items_make_the_same_frame_as_encode_add_batch(dtype: str, payloads: list[bytes], first: int,
                                                                    lac: int) -> None:
    from ledgerstore.proto.digest import DigestManager

    first = min(first, 2**63 - 1 - len(payloads))
    dm = DigestManager(9, dtype, b"pw")
    items = codec.add_batch_items(dm, first, lac, payloads)
    frame = codec.add_batch_header(77) + codec.add_batch_body_of_items(9, b"key", items)
    signed = [(first + i, dm.sign(first + i, lac, p)) for i, p in enumerate(payloads)]
    assert frame == codec.encode_add_batch(77, 9, b"key", signed)
    req = codec.decode_request(frame)
    assert isinstance(req, codec.AddBatchRequest) and [dm.verify(d, e).payload for e, d in req.entries] == payloads


# --- range checks: every field out of range is refused (BAD_REQUEST on the bookie) ---------------

too_big_id = st.integers(2**63, 2**64 - 1)
below_minus_one = st.integers(-(2**63), -2)


def _refused(frame: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        codec.decode_request(frame)


@given(too_big_id)
def test_a_ledger_id_past_2_63_is_refused_by_every_request(ledger_id: int) -> None:
    for frame in (codec.encode_add(1, ledger_id, 0, b"k", b"x"),
                  codec.encode_read(1, ledger_id, 0),
                  codec.encode_read_lac(1, ledger_id, b"k", codec.FLAG_FENCE),
                  codec.encode_long_poll_lac(1, ledger_id, -1, 10),
                  codec.encode_add_batch(1, ledger_id, b"k", [(0, b"x")]),
                  codec.encode_read_multi(1, ledger_id, [0])):
        _refused(frame, "ledger id")


@given(st.integers(-(2**63), -1), st.sampled_from([0, codec.FLAG_FENCE]))
def test_a_read_of_a_negative_entry_is_refused(entry_id: int, flags: int) -> None:
    _refused(codec.encode_read(1, 5, entry_id, b"k", flags), "entry id")
    _refused(codec.encode_read_multi(1, 5, [0, entry_id, 1]), "entry id")


@given(too_big_id)
def test_an_add_of_an_entry_past_2_63_is_refused(entry_id: int) -> None:
    _refused(codec.encode_add(1, 5, entry_id, b"k", b"x"), "entry id")
    _refused(codec.encode_add_batch(1, 5, b"k", [(0, b"x"), (entry_id, b"y")]), "out of range")


@given(below_minus_one)
def test_a_long_poll_below_lac_minus_one_is_refused(known: int) -> None:
    _refused(codec.encode_long_poll_lac(1, 5, known, 10), "known LAC")


def test_an_oversized_master_key_is_refused() -> None:
    k = b"k" * (codec.MAX_MASTER_KEY + 1)
    for frame in (codec.encode_add(1, 5, 0, k, b"x"), codec.encode_read(1, 5, 0, k, codec.FLAG_FENCE),
                  codec.encode_read_lac(1, 5, k, codec.FLAG_FENCE), codec.encode_add_batch(1, 5, k, [(0, b"x")])):
        _refused(frame, "master key length")
    assert isinstance(codec.decode_request(codec.encode_add(1, 5, 0, k[:-1], b"x")), codec.AddRequest)


@given(st.integers(2, 0xFFFF))
def test_undefined_flag_bits_are_refused(flags: int) -> None:
    _refused(codec.encode_add(1, 5, 0, b"k", b"x", flags), "flags")
    _refused(codec.encode_read(1, 5, 0, b"k", flags), "flags")
    _refused(codec.encode_read_lac(1, 5, b"k", flags), "flags")
    _refused(codec.encode_add_batch(1, 5, b"k", [(0, b"x")], flags), "flags")
    frame = bytearray(codec.encode_bookie_info(1))
    struct.pack_into(">H", frame, 2, flags)
    _refused(bytes(frame), "flags")


def test_the_edges_of_every_range_are_accepted() -> None:
    top = codec.MAX_ID
    assert codec.decode_request(codec.encode_add(1, top, top, b"k", b"x")).ledger_id == top
    assert codec.decode_request(codec.encode_read(1, top, top)).entry_id == top
    assert codec.decode_request(codec.encode_read(1, 0, 0)).entry_id == 0
    assert codec.decode_request(codec.encode_long_poll_lac(1, top, -1, 0)).known_lac == -1
    assert codec.decode_request(codec.encode_read_multi(1, top, [0, top])).entry_ids == (0, top)


# --- one class per message, registered by opcode ---------------------------------------------------

#: frames of format version 1 as the codec wrote them before messages were classes: the wire
#: format must not move by a byte
GOLDEN = [
    (codec.AddRequest(1, 2, 3, b"key", b"entry", codec.FLAG_RECOVERY_ADD),
     "0101000100000000000000010000000000000002000000000000000300036b6579656e747279"),
    (codec.ReadRequest(4, 5, 6, b"k", codec.FLAG_FENCE), "0102000100000000000000040000000000000005000000000000000600016b"),
    (codec.ReadLacRequest(7, 8, b"kk", codec.FLAG_FENCE), "010300010000000000000007000000000000000800026b6b"),
    (codec.LongPollLacRequest(9, 10, -1, 500),
     "010400000000000000000009000000000000000affffffffffffffff000001f4"),
    (codec.BookieInfoRequest(11), "01050000000000000000000b"),
    (codec.AddBatchRequest(12, 13, b"k", ((0, b"a"), (1, b"bc")), 0, bytes.fromhex("000000000000000000000001610000000000000001000000026263")),
     "01060000000000000000000c000000000000000d0001000000026b000000000000000000000001610000000000000001000000026263"),
    (codec.ReadMultiRequest(14, 15, (0, 2)),
     "01070000000000000000000e000000000000000f0000000200000000000000000000000000000002"),
    (codec.ListLedgersRequest(16, 17, 100), "010800000000000000000010000000000000001100000064"),
    (codec.AddResponse(18, Status.FENCED, 19, 20), "01010068000000000000001200000000000000130000000000000014"),
    (codec.ReadResponse(21, Status.OK, 22, 23, b"data"),
     "0102000000000000000000150000000000000016000000000000001764617461"),
    (codec.LongPollLacResponse(24, Status.OK, 25, 26, 27),
     "0104000000000000000000180000000000000019000000000000001a000000000000001b"),
    (codec.BookieInfoResponse(28, Status.OK, 1000, 2000, 3, True),
     "01050000000000000000001c00000000000003e800000000000007d0000000000000000301"),
    # the process instance, told only when asked (FLAG_INSTANCE): the answers above are unchanged
    (codec.BookieInfoRequest(36, codec.FLAG_INSTANCE), "010500010000000000000024"),
    (codec.BookieInfoResponse(37, Status.OK, 1000, 2000, 3, False, 0x0102030405060708),
     "01050000000000000000002500000000000003e800000000000007d00000000000000003000102030405060708"),
    (codec.AddBatchResponse(29, Status.OK, 30, ((0, 0), (1, Status.FENCED)), 2),
     "01060000000000000000001d000000000000001e000000020000000000000000000000000000000000010068"),
    (codec.AddBatchResponse(31, Status.OK, 32, count=50, all_ok=True),
     "01060000000000000000001f000000000000002000000032"),
    (codec.ReadMultiResponse(33, Status.OK, 34, ((0, 0, b"x"), (1, Status.NO_SUCH_ENTRY, b""))),
     "0107000000000000000000210000000000000022000000020000000000000000000000000001780000000000000001019300000000"),
    (codec.ListLedgersResponse(35, Status.OK, ((1, -1), (2, 7))),
     "010800000000000000000023000000020000000000000001ffffffffffffffff00000000000000020000000000000007"),
]


@pytest.mark.parametrize(("message", "frame"), GOLDEN, ids=[type(m).__name__ for m, _ in GOLDEN])
def test_every_message_class_keeps_the_version_1_wire_format(message: codec.Request | codec.Response,
                                                             frame: str) -> None:
    assert message.encode().hex() == frame
    decode = codec.decode_request if isinstance(message, codec.Request) else codec.decode_response
    assert decode(bytes.fromhex(frame)) == message


def test_every_opcode_has_one_request_and_one_response_class() -> None:
    requests, responses = codec.request_types(), codec.response_types()
    assert set(requests) == set(responses) == set(Op)
    for op in Op:
        assert requests[op].op == responses[op].op == op
        assert requests[op].__name__.endswith("Request") and responses[op].__name__.endswith("Response")
    # every class has a golden frame (READ_LAC's answer shares LONG_POLL_LAC's format)
    assert {type(m) for m, _ in GOLDEN} | {codec.ReadLacResponse} == set(requests.values()) | set(responses.values())


@pytest.mark.parametrize("op", list(Op))
@given(rid=u64, status=st.sampled_from([s for s in Status if s != Status.OK]))
def test_an_error_answered_with_the_header_only_decodes_to_its_class_with_defaults(op: Op, rid: int,
                                                                                   status: Status) -> None:
    resp = codec.decode_response(codec.encode_error_response(op, rid, status))
    assert type(resp) is codec.response_types()[op] and (resp.request_id, resp.status) == (rid, status)


@given(st.integers(max(Op) + 1, 255))
def test_a_response_with_an_unknown_opcode_is_refused(op: int) -> None:
    with pytest.raises(ProtocolError, match=f"unknown opcode {op} in response"):
        codec.decode_response(codec.HEADER.pack(codec.PROTOCOL_VERSION, op, 0, 7))


def test_a_message_class_compares_by_type_not_just_fields() -> None:
    """READ_LAC and LONG_POLL_LAC answers carry the same fields; they are still different answers."""
    assert codec.ReadLacResponse(1, Status.OK, 2, 3, 4) != codec.LongPollLacResponse(1, Status.OK, 2, 3, 4)
    frame = codec.encode_lac_response(Op.READ_LAC, 1, Status.OK, 2, 3, 4)
    assert type(codec.decode_response(frame)) is codec.ReadLacResponse
