"""The wire codec: round trips, and refusal of anything malformed (property-based)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerstore.errors import FrameTooLargeError, ProtocolError
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Op, Status

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
    st.builds(codec.BookieInfoRequest, u64),
    st.builds(codec.AddBatchRequest, u64, lid, key,
              st.lists(st.tuples(eid, st.binary(max_size=300)), max_size=20).map(tuple),
              st.sampled_from([0, codec.FLAG_RECOVERY_ADD])).map(
        # a decoded batch also carries its entry section as received (what a bookie journals)
        lambda r: r._replace(raw_entries=b"".join(struct.pack(">QI", e, len(d)) + d for e, d in r.entries))),
    st.builds(codec.ReadMultiRequest, u64, lid, st.lists(eid, max_size=50).map(tuple)),
)
statuses = st.sampled_from(list(Status))
responses = st.one_of(
    st.builds(lambda r, s, lid, e: codec.Response(Op.ADD, s, r, lid, e), u64, statuses, u64, u64),
    st.builds(lambda r, s, lid, e, b: codec.Response(Op.READ, s, r, lid, e, b), u64, statuses, u64, i64, st.binary(max_size=500)),
    st.builds(lambda r, s, lid, a, b, op: codec.Response(op, s, r, lid, lac=a, last_entry_id=b), u64, statuses, u64, i64, i64,
              st.sampled_from([Op.READ_LAC, Op.LONG_POLL_LAC])),
    st.builds(lambda r, s, f, t, n, ro: codec.Response(Op.BOOKIE_INFO, s, r, free_bytes=f, total_bytes=t, ledgers=n, read_only=ro),
              u64, statuses, u64, u64, u64, st.booleans()),
    st.builds(lambda r, s, lid, items: codec.Response(Op.ADD_BATCH, s, r, lid, items=items, count=len(items)), u64,
              statuses, u64, st.lists(st.tuples(u64, statuses.map(int)), max_size=30).map(tuple)),
    st.builds(lambda r, lid, n: codec.Response(Op.ADD_BATCH, Status.OK, r, lid, count=n, all_ok=True), u64, u64,
              st.integers(1, 2**32 - 1)),
    st.builds(lambda r, s, lid, items: codec.Response(Op.READ_MULTI, s, r, lid, items=items), u64, statuses, u64,
              st.lists(st.tuples(i64, statuses.map(int), st.binary(max_size=100)), max_size=20).map(tuple)),
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
