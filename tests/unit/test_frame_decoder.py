"""The TCP transport's frame decoder: whatever way a stream is cut into reads, the frames come
out whole, in order and once, and the decoder's buffer stays as small as the stream lets it."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerstore.errors import FrameTooLargeError
from ledgerstore_tcp import FrameDecoder

LIMIT = 64 * 1024


def _wire(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(f)) + f for f in frames)


def _cuts(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        step = sizes[i % len(sizes)] if sizes else len(data)
        out.append(data[pos:pos + step])
        pos += step
        i += 1
    return out


def _read_into(decoder: FrameDecoder, data: bytes, most: int) -> list[bytes]:
    """As a buffered protocol's transport does: read at most ``most`` bytes into get_buffer()."""
    frames: list[bytes] = []
    pos = 0
    while pos < len(data):
        room = decoder.get_buffer(-1)
        assert len(room) >= 1
        take = min(len(room), most, len(data) - pos)
        room[:take] = data[pos:pos + take]
        pos += take
        frames += decoder.buffer_updated(take)
    return frames


frames_st = st.lists(st.one_of(st.binary(max_size=40), st.binary(min_size=1000, max_size=LIMIT)), max_size=12)


@settings(max_examples=150, deadline=None)
@given(frames=frames_st, sizes=st.lists(st.integers(1, 70_000), max_size=6), chunk=st.sampled_from([16, 4096, 65536]))
def test_any_cut_of_the_stream_gives_the_frames_back(frames: list[bytes], sizes: list[int], chunk: int) -> None:
    data = _wire(frames)
    by_feed = FrameDecoder(LIMIT, chunk=chunk)
    got = [f for piece in _cuts(data, sizes) for f in by_feed.feed(piece)]
    assert got == frames
    assert by_feed.buffered == 0
    by_read = FrameDecoder(LIMIT, chunk=chunk)
    assert _read_into(by_read, data, max(sizes, default=len(data) or 1)) == frames
    assert by_read.buffered == 0
    if not frames or len(frames[-1]) + 4 <= chunk:  # back to small frames: the large ones' room is given back
        assert len(by_read._buf) <= chunk
    else:  # never more than twice the largest frame
        assert len(by_read._buf) <= max(chunk, 2 * (max(map(len, frames)) + 4))


def test_an_unfinished_frame_is_kept_and_counted() -> None:
    d = FrameDecoder(LIMIT, chunk=4096)
    data = _wire([b"a" * 3000, b"b" * 3000])
    assert d.feed(data[:3500]) == [b"a" * 3000]
    assert d.buffered == 3500 - 3004
    assert d.feed(data[3500:]) == [b"b" * 3000]
    assert d.buffered == 0


def test_room_grows_with_the_bytes_that_arrived_not_the_announced_length() -> None:
    d = FrameDecoder(8 * 1024 * 1024, chunk=4096)
    d.feed(struct.pack(">I", 8 * 1024 * 1024 - 4) + b"x" * 10)
    assert d.capacity == 512
    d.feed(b"x" * 30_000)
    assert d.buffered == 30_014
    assert len(d._buf) <= 2 * 30_014
    d.clear()
    assert d.buffered == 0 and d.capacity == 0


def test_a_silent_connection_holds_no_buffer_and_one_byte_holds_the_initial_room() -> None:
    d = FrameDecoder(LIMIT)
    assert d.capacity == 0
    assert _read_into(d, b"\x00", 1) == []
    assert d.capacity == 512 and d.buffered == 1


def test_room_grows_for_a_streaming_peer_and_is_given_back_when_it_quiets() -> None:
    d = FrameDecoder(1024 * 1024, chunk=65536)
    stream = _wire([b"s" * 100] * 3000)  # small frames arriving faster than they are read
    assert len(_read_into(d, stream, 1 << 20)) == 3000
    assert d.capacity == 65536  # doubled after each full read, up to chunk
    assert _read_into(d, _wire([b"q"]), 1 << 20) == [b"q"]  # a quiet read: the room goes back
    assert d.capacity == 512
    big = b"b" * 200_000  # one frame larger than chunk: room for it, then back
    assert _read_into(d, _wire([big]), 1 << 20) == [big]
    assert 200_004 <= d.capacity <= 2 * 200_004
    assert _read_into(d, _wire([b"q"]), 1 << 20) == [b"q"]
    assert d.capacity == 512


def test_a_pipeline_of_large_frames_keeps_its_room_from_one_frame_to_the_next() -> None:
    d = FrameDecoder(1024 * 1024, chunk=4096)
    batch = b"p" * 100_000  # a writer's ADD_BATCH: the next one is as large
    wire = _wire([batch])
    assert _read_into(d, wire[:-10], 1 << 20) == []
    assert _read_into(d, wire[-10:], 1 << 20) == [batch]  # its tail is a small read
    room = d.capacity
    # the next batch fits the room offered at once: one read, no regrowth from 512 bytes
    assert len(d.get_buffer(-1)) >= len(wire)
    assert _read_into(d, wire, 1 << 20) == [batch] and d.capacity == room
    assert _read_into(d, _wire([b"q"]), 1 << 20) == [b"q"]  # a small frame: the peer quieted
    assert d.capacity == 512


def test_an_oversized_prefix_is_refused_before_its_bytes_arrive() -> None:
    d = FrameDecoder(1024)
    with pytest.raises(FrameTooLargeError, match="frame of 1025 bytes; the limit is 1024"):
        d.feed(struct.pack(">I", 1025))


def test_a_batch_decoded_from_a_mutable_frame_keeps_its_entry_section() -> None:
    """The bookie journals an ADD_BATCH's entry section after decode returns: taken from a
    ``bytes`` frame it is a view, from a buffer that may change it is a copy."""
    from ledgerstore.proto import codec

    frame = codec.AddBatchRequest.frame(7, 1, b"k" * 20, [(0, b"a" * 40), (1, b"b" * 40)])
    whole = codec.decode_request(frame)
    assert isinstance(whole, codec.AddBatchRequest) and isinstance(whole.raw_entries, memoryview)
    buf = bytearray(frame)
    req = codec.decode_request(buf)  # type: ignore[arg-type]
    assert isinstance(req, codec.AddBatchRequest)
    buf[len(buf) - 40:] = b"z" * 40
    assert bytes(req.raw_entries) == bytes(whole.raw_entries)
