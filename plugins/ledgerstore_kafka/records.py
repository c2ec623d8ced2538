"""Kafka record batches (magic 2) as stored: parsed, checked and given their base offset.

A produce request carries one or more record batches back to back. Each batch is stored as the
producer sent it, as one log entry, with one change: its first eight bytes, the base offset, are
set to the offset the partition assigned. Kafka's CRC32C covers the batch from its attributes to
its end; the base offset, the batch length, the partition leader epoch and the magic lie before
that, so rewriting the base offset leaves the CRC valid and nothing is recomputed (the producer's
CRC is checked once, on produce).

Batch header (big-endian; bytes from the start of the batch)::

    0  base offset      int64      27 base timestamp   int64
    8  batch length     int32      35 max timestamp    int64
    12 leader epoch     int32      43 producer id      int64
    16 magic (2)        int8       51 producer epoch   int16
    17 CRC32C           uint32     53 base sequence    int32
    21 attributes       int16      57 record count     int32
    23 last offset delta int32     61 records ...
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

import crc32c

from ledgerstore.errors import LedgerStoreError

__all__ = ["HEADER_SIZE", "BatchError", "BatchInfo", "KafkaRecord", "decode_records", "parse_batch_header",
           "split_batches", "with_base_offset"]

HEADER_SIZE = 61
#: bytes before the batch length's count starts (base offset and the length itself)
LOG_OVERHEAD = 12
_CRC_START = 21
_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE = struct.Struct(">q")
#: attributes bit 4: the batch belongs to a transaction; bit 5: a control batch (commit/abort markers)
TRANSACTIONAL, CONTROL = 0x10, 0x20


class BatchError(LedgerStoreError):
    """A record batch that cannot be stored; ``error_code`` is Kafka's answer for it."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclasses.dataclass(frozen=True, slots=True)
class BatchInfo:
    """What the partition index keeps of one stored batch."""

    base_offset: int
    last_offset_delta: int
    max_timestamp: int
    record_count: int
    attributes: int
    producer_id: int
    producer_epoch: int = -1
    base_sequence: int = -1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def parse_batch_header(batch: bytes | memoryview) -> BatchInfo:
    """The header fields of one whole batch (its length already checked by :func:`split_batches`)."""
    (base, _length, _epoch, magic, _crc, attributes, last_delta, _base_ts, max_ts, producer_id, producer_epoch,
     base_sequence, count) = _HEADER.unpack_from(batch, 0)
    del magic
    return BatchInfo(base, last_delta, max_ts, count, attributes, producer_id, producer_epoch, base_sequence)


def split_batches(records: bytes, max_batch_bytes: int) -> list[bytes]:
    """The record batches of a produce request's ``records`` field, each checked: a whole batch,
    magic 2, its CRC32C right, not transactional, at most ``max_batch_bytes``.
    Raises :class:`BatchError` with Kafka's error code for the first bad one."""
    out: list[bytes] = []
    pos, end = 0, len(records)
    if end == 0:
        raise BatchError("the produce request holds no record batch", 87)  # INVALID_RECORD
    while pos < end:
        if end - pos < LOG_OVERHEAD + 5:
            raise BatchError(f"a record batch is cut short: {end - pos} bytes at byte {pos}", 2)  # CORRUPT_MESSAGE
        (length,) = struct.unpack_from(">i", records, pos + 8)
        size = LOG_OVERHEAD + length
        magic = records[pos + 16]
        if magic != 2:
            raise BatchError(f"record batches of magic {magic} are not supported (only magic 2, Kafka 0.11 and later)",
                             43)  # UNSUPPORTED_FOR_MESSAGE_FORMAT
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise BatchError(f"a record batch declares {length} bytes but {end - pos - LOG_OVERHEAD} follow", 2)
        if size > max_batch_bytes:
            raise BatchError(f"a record batch of {size} bytes is over the limit of {max_batch_bytes}", 10)  # MESSAGE_TOO_LARGE
        batch = records[pos:pos + size]
        (crc,) = struct.unpack_from(">I", batch, 17)
        if crc32c.crc32c(batch[_CRC_START:]) != crc:
            raise BatchError(f"a record batch's CRC32C does not match its bytes (batch at byte {pos})", 2)
        if parse_batch_header(batch).attributes & (TRANSACTIONAL | CONTROL):
            raise BatchError("transactional and control batches are not supported", 87)
        out.append(batch)
        pos += size
    return out


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """``batch`` with its base offset field set (outside the CRC's range: the CRC stays valid)."""
    return _BASE.pack(base_offset) + batch[8:]


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record of a stored batch, as a consumer sees it."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


#: attributes bits 0-2: the compression codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)
_CODECS = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def decode_records(batch: bytes | memoryview) -> list[KafkaRecord]:
    """The records of one stored batch (one entry of a partition's log ``kafka-<topic>-<p>``), for
    pipelines that read the log directly (a Spark job, a ledgerstore log reader). Uncompressed and
    gzip batches are decoded; another codec raises :class:`BatchError` naming it (decompress
    ``batch[61:]`` with that codec's library, then read the records the same way)."""
    data = bytes(batch)
    if len(data) < HEADER_SIZE:
        raise BatchError(f"a record batch is {len(data)} bytes, shorter than its {HEADER_SIZE}-byte header", 2)
    (base, _length, _epoch, _magic, _crc, attributes, _delta, base_ts, _max_ts, _pid, _pepoch, _seq,
     count) = _HEADER.unpack_from(data, 0)
    body = data[HEADER_SIZE:]
    codec = attributes & 0x07
    if codec == 1:
        body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
    elif codec:
        raise BatchError(f"records compressed with {_CODECS.get(codec, codec)} are not decoded here", 2)
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            if pos >= len(body):
                raise BatchError("a record runs past the end of its batch", 2)
            byte = body[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)  # zigzag
            shift += 7

    def blob() -> bytes | None:
        nonlocal pos
        n = varint()
        if n < 0:
            return None
        pos += n
        if pos > len(body):
            raise BatchError("a record runs past the end of its batch", 2)
        return body[pos - n:pos]

    out = []
    for _ in range(count):
        varint()  # the record's length
        pos += 1  # its attributes (unused)
        ts_delta, offset_delta = varint(), varint()
        key, value = blob(), blob()
        headers = []
        for _ in range(varint()):
            name = blob() or b""
            headers.append((name.decode("utf-8", errors="replace"), blob()))
        out.append(KafkaRecord(base + offset_delta, base_ts + ts_delta, key, value, tuple(headers)))
    return out
