"""The Kafka wire codec and record batches, without sockets: what a malformed request raises,
what a stored batch looks like, and the decoders fuzzed with random bytes."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerstore_kafka.admin_messages import (
    TXN_SUPPORTED,
    AdminApiKey,
    decode_create_topics,
    decode_delete_topics,
    decode_describe_configs,
    encode_txn_refusal,
)
from ledgerstore_kafka.codec import MalformedRequest, Reader, Writer
from ledgerstore_kafka.messages import (
    SUPPORTED,
    ApiKey,
    decode_fetch,
    decode_init_producer_id,
    decode_list_offsets,
    decode_metadata,
    decode_produce,
)
from ledgerstore_kafka.records import (
    BatchError,
    decode_records,
    parse_batch_header,
    split_batches,
    with_base_offset,
)
from ledgerstore_kafka.sasl_messages import (
    SASL_SUPPORTED,
    SaslApiKey,
    decode_sasl_authenticate,
    decode_sasl_handshake,
)


def record_batch(n: int, *, magic: int = 2, attributes: int = 0, payload: bytes = b"v") -> bytes:
    """A magic-2 batch of ``n`` uncompressed records (as a producer builds it, CRC32C included)."""
    records = b""
    for i in range(n):
        body = bytes([0]) + _varint(0) + _varint(i) + _varint(-1) + _varint(len(payload)) + payload + _varint(0)
        records += _varint(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", attributes, n - 1, 1000, 1000 + n, -1, -1, -1, n) + records
    crc = crc32c.crc32c(after_crc)
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(after_crc), 0, magic, crc)
    return head + after_crc


def _varint(v: int) -> bytes:
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def test_a_batch_is_split_checked_and_its_base_offset_rewritten_without_touching_the_crc() -> None:
    a, b = record_batch(3), record_batch(2)
    assert split_batches(a + b, 1 << 20) == [a, b]
    stored = with_base_offset(a, 1234)
    info = parse_batch_header(stored)
    assert (info.base_offset, info.last_offset, info.record_count, info.max_timestamp) == (1234, 1236, 3, 1003)
    assert split_batches(stored, 1 << 20) == [stored]  # its CRC is still right


def test_a_flipped_bit_fails_the_crc_with_corrupt_message() -> None:
    batch = bytearray(record_batch(3))
    batch[-2] ^= 0x01
    with pytest.raises(BatchError) as info:
        split_batches(bytes(batch), 1 << 20)
    assert info.value.error_code == 2


@pytest.mark.parametrize(("batch", "limit", "code"), [
    (record_batch(3)[:-1], 1 << 20, 2),                 # cut short
    (record_batch(3, magic=1), 1 << 20, 43),            # an old message format
    (record_batch(3, attributes=0x10), 1 << 20, 87),    # transactional
    (record_batch(3, payload=b"x" * 500), 400, 10),     # over the limit: MESSAGE_TOO_LARGE
    (b"", 1 << 20, 87),                                 # no batch at all
])
def test_batches_that_cannot_be_stored_get_kafkas_error_code(batch: bytes, limit: int, code: int) -> None:
    with pytest.raises(BatchError) as info:
        split_batches(batch, limit)
    assert info.value.error_code == code


def test_a_truncated_request_raises_malformed_request_not_struct_error() -> None:
    full = Writer().nullable_string(None).int16(-1).int32(1000).array_length(1).string("t").array_length(1) \
        .int32(0).nullable_bytes(record_batch(1)).bytes()
    assert decode_produce(Reader(full), 8).topics[0][0] == "t"
    for cut in range(len(full)):
        with pytest.raises(MalformedRequest):
            decode_produce(Reader(full[:cut]), 8)


def test_an_array_longer_than_its_bytes_is_malformed() -> None:
    with pytest.raises(MalformedRequest):
        decode_metadata(Reader(Writer().array_length(1_000_000).bytes()), 8)


DECODERS = {ApiKey.PRODUCE: decode_produce, ApiKey.FETCH: decode_fetch, ApiKey.LIST_OFFSETS: decode_list_offsets,
            ApiKey.METADATA: decode_metadata, ApiKey.INIT_PRODUCER_ID: decode_init_producer_id,
            AdminApiKey.CREATE_TOPICS: decode_create_topics, AdminApiKey.DELETE_TOPICS: decode_delete_topics,
            AdminApiKey.DESCRIBE_CONFIGS: decode_describe_configs,
            SaslApiKey.SASL_HANDSHAKE: decode_sasl_handshake, SaslApiKey.SASL_AUTHENTICATE: decode_sasl_authenticate}
VERSIONS = {**SUPPORTED, **SASL_SUPPORTED}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(DECODERS)), st.data(), st.binary(max_size=300))
def test_decoders_given_random_bytes_raise_only_malformed_request(key: int, data: st.DataObject, raw: bytes) -> None:
    low, high = VERSIONS[key]
    version = data.draw(st.integers(low, high))
    try:
        DECODERS[key](Reader(raw), version)
    except MalformedRequest:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(TXN_SUPPORTED)), st.data(), st.binary(max_size=200))
def test_transaction_requests_given_random_bytes_raise_only_malformed_request(key: int, data: st.DataObject,
                                                                             raw: bytes) -> None:
    low, high = TXN_SUPPORTED[key]
    try:
        encode_txn_refusal(key, Reader(raw), data.draw(st.integers(low, high)), 35)
    except MalformedRequest:
        pass


def test_stored_batches_decode_into_their_records_with_offsets_keys_values_and_headers() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, 1000, b"k0", b"v0", [("h", b"x")])
    builder.append(1, 1005, None, b"v1", [])
    stored = with_base_offset(bytes(builder.build()), 40)
    records = decode_records(stored)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (40, 1000, b"k0", b"v0", (("h", b"x"),)), (41, 1005, None, b"v1", ())]
    gzip = DefaultRecordBatchBuilder(2, 1, False, -1, -1, -1, 1 << 20)
    gzip.append(0, 7, b"k", b"compressed", [])
    assert [r.value for r in decode_records(bytes(gzip.build()))] == [b"compressed"]
    with pytest.raises(BatchError):
        decode_records(stored[:-3])
