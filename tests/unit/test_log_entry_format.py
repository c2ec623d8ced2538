"""The log entry header (format 2) and the leader's producer table, without sockets."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerstore.client.log.entry import (
    MAX_SEQ,
    PLAIN_HEADER,
    decode,
    encode,
    encode_many,
    encoder,
    is_sequenced_format,
    producer_header,
    varint,
)
from ledgerstore.client.log.producers import ProducerTable
from ledgerstore.errors import InvalidArgumentError, LogError
from ledgerstore.meta.logs import Position
from ledgerstore.proto import speedups


@given(st.text(min_size=1, max_size=60), st.integers(0, MAX_SEQ), st.binary(max_size=64))
def test_a_sequenced_entry_decodes_to_its_producer_sequence_and_payload(pid: str, seq: int, payload: bytes) -> None:
    assert decode(encode(producer_header(pid), seq, payload)) == (payload, pid, seq)


@given(st.binary(max_size=64))
def test_a_plain_entry_is_one_zero_byte_then_the_payload(payload: bytes) -> None:
    assert decode(PLAIN_HEADER + payload) == (payload, None, None)


def leb128(n: int) -> bytes:
    """The unsigned LEB128 varint of ``n``, written from its definition (not the code under test)."""
    groups = [(n >> shift) & 0x7F for shift in range(0, max(n.bit_length(), 1), 7)]
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


def test_the_header_layout_is_flags_length_id_then_a_varint_sequence() -> None:
    assert encode(producer_header("ab"), 258, b"P") == b"\x02\x02ab\x82\x02P"
    assert [varint(n) for n in (0, 127, 128, 16383, 16384)] == [
        b"\x00", b"\x7f", b"\x80\x01", b"\xff\x7f", b"\x80\x80\x01"]
    assert varint(MAX_SEQ) == b"\xff" * 8 + b"\x7f"  # the longest: 9 bytes


@given(st.text(min_size=1, max_size=60), st.integers(0, MAX_SEQ - 20), st.lists(st.binary(max_size=64), max_size=20))
def test_the_encoders_give_the_documented_bytes_on_both_hot_paths(hot_path: str, pid: str, first: int,
                                                                    payloads: list[bytes]) -> None:
    header = producer_header(pid)
    want = [header + leb128(first + i) + x for i, x in enumerate(payloads)]
    assert encode_many(header, first, payloads) == want
    assert [encode(header, first + i, x) for i, x in enumerate(payloads)] == want
    assert [encoder()(header, first + i, x) for i, x in enumerate(payloads)] == want
    assert encode_many(header, first, [bytearray(x) for x in payloads]) == want


@given(st.text(min_size=1, max_size=60), st.integers(0, MAX_SEQ), st.binary(max_size=64))
def test_an_entry_with_the_earlier_fixed_size_sequence_still_decodes(pid: str, seq: int, payload: bytes) -> None:
    raw = pid.encode("utf-8", "surrogatepass")
    assert decode(bytes((0x01, len(raw))) + raw + seq.to_bytes(8, "big") + payload) == (payload, pid, seq)


@pytest.mark.parametrize("payload", ["text", 7, None, memoryview(b"abcd")[::2]])
def test_the_encoders_refuse_what_is_not_contiguous_bytes_with_a_type_error_on_both_hot_paths(
        hot_path: str, payload: object) -> None:
    with pytest.raises(TypeError):
        encode(producer_header("p"), 1, payload)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_many(producer_header("p"), 1, [b"ok", payload])  # type: ignore[list-item]


def test_the_writer_takes_the_compiled_encoder_only_on_the_compiled_hot_path(hot_path: str) -> None:
    fast = speedups.compiled
    if hot_path == "compiled":
        assert fast is not None and encoder() is fast.log_entry_varint
    else:
        assert fast is None and encoder().__module__ == "ledgerstore.client.log.entry"


@pytest.mark.parametrize("data", [
    b"", b"\x03\x01a\x00", b"\x80\x01a\x00",              # unknown flags
    b"\x01\x05ab", b"\x01\x00" + b"\x00" * 8,              # fixed-size: cut short, an empty id
    b"\x02x", b"\x02\x01a", b"\x02\x00\x00",                # varint: no room, no sequence, an empty id
    b"\x02\x01a\x80", b"\x02\x01a\xff\xff",                # a varint cut short
    b"\x02\x01a" + b"\x80" * 9 + b"\x00",                    # a varint longer than 9 bytes
])
def test_a_damaged_header_is_a_log_error(data: bytes) -> None:
    with pytest.raises(LogError):
        decode(data)


def test_only_ledgers_marked_format_2_are_decoded() -> None:
    assert is_sequenced_format({"log.format": "2"})
    assert not is_sequenced_format({})
    assert not is_sequenced_format({"log.format": "1"})


def test_producer_ids_are_checked_once_when_their_header_is_built() -> None:
    with pytest.raises(InvalidArgumentError, match="must not be empty"):
        producer_header("")
    with pytest.raises(InvalidArgumentError, match="at most 255"):
        producer_header("é" * 128)
    assert producer_header("é" * 127)[1] == 254


def test_the_table_keeps_the_highest_stored_sequence_and_its_snapshot_reads_back() -> None:
    table = ProducerTable()
    table.add("a").stored(5, 3, 9)
    table.add("a").stored(2, 3, 1)  # an older one (read back while rebuilding) does not lower it
    table.add("b").stored(0, 4, 0)
    snap = table.encode_snapshot(Position(4, 0))
    assert snap is not None
    again = ProducerTable()
    assert again.load_snapshot(snap) == Position(4, 0)
    assert again.last_seq_of("a") == 5 and again.get("a").position == Position(3, 9)  # type: ignore[union-attr]
    assert again.last_seq_of("b") == 0 and again.last_seq_of("c") is None


def test_expiry_forgets_only_idle_producers_with_nothing_in_flight() -> None:
    table = ProducerTable()
    table.add("old").touched = 100.0
    table.add("busy").touched = 100.0
    table.add("busy").pending = {4: None}  # type: ignore[dict-item]  # its future is not needed here
    table.add("new").touched = 1000.0
    assert table.expire(None, now=2000.0) == 0  # off by default
    assert table.expire(500.0, now=1200.0) == 1
    assert sorted(table.producers) == ["busy", "new"]


def test_a_producer_is_touched_when_its_appends_drain_and_snapshotted_as_active_while_they_are_in_flight() -> None:
    table = ProducerTable()
    busy = table.add("busy")
    busy.stored(3, 1, 2)
    busy.touched = 100.0  # long ago: but it has an append in flight, so it is active now
    busy.pending = {5: None}  # type: ignore[dict-item]  # an append of 4..5; its future is not needed here
    busy.firsts = {5: 4}
    before = time.time()
    snap = table.encode_snapshot(Position(1, 2))
    assert snap is not None
    again = ProducerTable()
    again.load_snapshot(snap)
    assert again.get("busy").touched >= before - 0.001  # type: ignore[union-attr]
    assert again.expire(60.0) == 0  # so a new leader with a TTL keeps it
    busy.stored(5, 1, 4)
    busy.settled(5)
    assert busy.pending is None and busy.touched >= before and busy.position == Position(1, 4)
    assert table.expire(60.0, now=busy.touched + 61.0) == 1  # idle from when its appends drained


def test_in_flight_appends_are_found_by_any_of_their_sequences_and_settle_in_any_order() -> None:
    loop = asyncio.new_event_loop()
    try:
        p = ProducerTable().add("p")
        one, many, other = loop.create_future(), loop.create_future(), loop.create_future()
        p.sent_one(3, one)
        p.sent_one(9, many, 5)  # an append_many of 5..9
        p.sent_one(12, other)  # a gap: 10 and 11 were never sent
        assert p.sent == 12
        assert p.in_flight(3) == (one, 0) and p.in_flight(12) == (other, 0)
        assert p.in_flight(5) == (many, 4) and p.in_flight(9) == (many, 0)
        assert p.in_flight(4) is None and p.in_flight(10) is None and p.in_flight(13) is None
        p.settled(9)  # out of order: a failure resolves it first
        assert p.in_flight(7) is None and p.firsts is None and p.in_flight(3) == (one, 0)
        p.settled(9)  # twice: nothing more
        p.settled(3)
        assert p.pending == {12: other}
        before = time.time()
        p.settled(12)
        assert p.pending is None and p.touched >= before
    finally:
        loop.close()


def test_a_corrupt_snapshot_is_a_log_error() -> None:
    with pytest.raises(LogError, match="corrupt producer snapshot"):
        ProducerTable().load_snapshot('{"v": 1, "through": "x"}')
