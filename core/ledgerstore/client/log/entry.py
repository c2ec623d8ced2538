"""The log entry format: what a log writer puts in each entry of its ledgers, and reading it back.

Pure functions over bytes (no IO), with a compiled twin of the encoder in
``ledgerstore.proto._speedups`` (the same bytes; :mod:`ledgerstore.proto.speedups` chooses); :mod:`.writer` encodes, :mod:`.reader` and :mod:`.rebuild`
decode. The format is chosen per ledger, never guessed from the bytes (a raw payload can be
anything): a writer of this release creates its ledgers with ``log.format=2`` in the ledger's
``custom`` metadata (:data:`FORMAT_KEY`), and every entry of such a ledger starts with a header.
Ledgers without the key (format 1, written by older releases) hold the bare payload.

Format 2 entry (``docs/logs.md``, "Entry format")::

    byte 0         flags: 0x00 plain, 0x02 sequenced, 0x01 sequenced with a fixed-size sequence
                   (written by earlier releases, still read); every other value is refused
    sequenced only:
      byte 1       n, the producer id's length in bytes (1..255)
      bytes 2..    the producer id (UTF-8, n bytes)
      next         0x02: the sequence as an unsigned LEB128 varint (7 bits a byte, the lowest
                   first, the high bit set on every byte but the last; 1 to 9 bytes)
                   0x01: the sequence in 8 bytes, unsigned big-endian
    the rest       the payload, as given to append
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ledgerstore.errors import InvalidArgumentError, LogError
from ledgerstore.meta.logs import Position
from ledgerstore.proto import speedups

#: the ledger metadata ``custom`` key naming the entry format of a log's ledger
FORMAT_KEY = "log.format"
#: the value of :data:`FORMAT_KEY` for ledgers whose entries carry a header
FORMAT_SEQUENCED = "2"
#: flags of an entry that carries a producer id and a varint sequence (what writers write)
FLAG_SEQUENCED = 0x02
#: flags of an entry that carries a producer id and an 8-byte sequence (written by releases before
#: the varint; read, never written)
FLAG_SEQUENCED_FIXED = 0x01
#: the header of an entry written without a sequence
PLAIN_HEADER = b"\x00"
#: longest producer id, in UTF-8 bytes (its length is one byte of the header)
MAX_PRODUCER_ID_BYTES = 255
#: sequences are unsigned 64-bit on the wire; Python callers get the signed range
MAX_SEQ = 2**63 - 1
#: the longest varint of a sequence (63 bits, 7 a byte)
MAX_VARINT_BYTES = 9

_SEQ = struct.Struct(">Q")
#: the varints of 0..127: one byte each, the common case of a young producer
_SMALL = [bytes((i,)) for i in range(0x80)]


class LogRecord(NamedTuple):
    """One entry of a log as :meth:`LogReader.records` returns it: its position and payload, and
    the producer and sequence it was appended with (both ``None`` for an entry appended without a
    sequence, or read from a ledger written by an older release)."""

    position: Position
    payload: bytes
    producer_id: str | None
    seq: int | None


def is_sequenced_format(custom: dict[str, str]) -> bool:
    """Whether a ledger with this ``custom`` metadata holds format 2 entries (with a header)."""
    return custom.get(FORMAT_KEY) == FORMAT_SEQUENCED


def check_producer_id(producer_id: object) -> str:
    """``producer_id`` if it can name a producer (a non-empty string of at most 255 UTF-8 bytes)."""
    if not isinstance(producer_id, str):
        raise InvalidArgumentError(f"producer_id must be a string, not {type(producer_id).__name__}")
    if not producer_id:
        raise InvalidArgumentError("producer_id must not be empty")
    size = len(producer_id.encode("utf-8", "surrogatepass"))
    if size > MAX_PRODUCER_ID_BYTES:
        raise InvalidArgumentError(
            f"producer_id is {size} bytes in UTF-8; at most {MAX_PRODUCER_ID_BYTES} are allowed")
    return producer_id


def check_seq(seq: object, what: str = "seq") -> int:
    """``seq`` if it can be a sequence (an int from 0 to 2**63-1)."""
    if type(seq) is not int:
        raise InvalidArgumentError(f"{what} must be an int, not {type(seq).__name__}")
    if not 0 <= seq <= MAX_SEQ:
        raise InvalidArgumentError(f"{what} must be between 0 and {MAX_SEQ}, got {seq}")
    return seq


def producer_header(producer_id: str) -> bytes:
    """The header bytes of a sequenced entry of ``producer_id``, before the sequence: computed
    once per producer, so an append only adds the sequence's bytes."""
    raw = check_producer_id(producer_id).encode("utf-8", "surrogatepass")
    return bytes((FLAG_SEQUENCED, len(raw))) + raw


def varint(n: int) -> bytes:
    """``n`` (0..2**63-1) as an unsigned LEB128 varint: 1 byte up to 127, 3 up to about 2 million."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos:]`` and the position after it; LogError if it is cut short or longer
    than :data:`MAX_VARINT_BYTES` (whose 63 bits cannot exceed :data:`MAX_SEQ`)."""
    value = shift = 0
    for i in range(pos, min(len(data), pos + MAX_VARINT_BYTES)):
        b = data[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    raise LogError(f"log entry of {len(data)} bytes has a sequence varint that is cut short or longer than "
                   f"{MAX_VARINT_BYTES} bytes")


def encode(header: bytes, seq: int, payload: bytes) -> bytes:
    """A sequenced entry: ``header`` (from :func:`producer_header`), ``seq``, ``payload``."""
    fast = speedups.compiled
    if fast is not None:
        return fast.log_entry_varint(header, seq, payload)
    return header + varint(seq) + payload


def encode_many(header: bytes, first_seq: int, payloads: Iterable[bytes]) -> list[bytes]:
    """:func:`encode` of each of ``payloads``, with the sequences ``first_seq, first_seq + 1, ...``."""
    fast = speedups.compiled
    if fast is not None:
        return fast.log_entries_varint(header, first_seq, payloads)
    return [header + varint(s) + x for s, x in enumerate(payloads, first_seq)]


def encoder() -> Callable[[bytes, int, bytes], bytes]:
    """The :func:`encode` a log writer takes once, when it is created: the compiled one when the
    compiled hot path runs (``ledgerstore.proto.speedups``; it builds the entry in one buffer),
    else the pure-Python one."""
    fast = speedups.compiled
    return _encode_pure if fast is None else fast.log_entry_varint


def _encode_pure(header: bytes, seq: int, payload: bytes) -> bytes:
    return header + varint(seq) + payload


def decode(data: bytes) -> tuple[bytes, str | None, int | None]:
    """``(payload, producer_id, seq)`` of a format 2 entry; LogError if it is not one."""
    if not data:
        raise LogError("log entry of format 2 is empty: it has no header")
    flags = data[0]
    if flags == 0:
        return data[1:], None, None
    if flags != FLAG_SEQUENCED and flags != FLAG_SEQUENCED_FIXED:
        raise LogError(f"log entry has header flags {flags:#04x}; this release knows only 0x00, 0x01 and 0x02")
    n = data[1] if len(data) > 1 else 0
    end = 2 + n
    if n == 0 or len(data) < end + (1 if flags == FLAG_SEQUENCED else 8):
        raise LogError(f"log entry of {len(data)} bytes is too short for its sequenced header")
    if flags == FLAG_SEQUENCED:
        if data[end] < 0x80:  # a one-byte varint
            seq, start = data[end], end + 1
        else:
            seq, start = read_varint(data, end)
    else:
        seq, start = _SEQ.unpack_from(data, end)[0], end + 8
    return data[start:], data[2:end].decode("utf-8", "surrogatepass"), seq


#: the public names of the codec (``ledgerstore.client.log`` re-exports them)
encode_entry = encode
decode_entry = decode

__all__ = ["FLAG_SEQUENCED", "FLAG_SEQUENCED_FIXED", "FORMAT_KEY", "FORMAT_SEQUENCED", "MAX_PRODUCER_ID_BYTES",
           "MAX_SEQ", "MAX_VARINT_BYTES", "PLAIN_HEADER", "LogRecord", "check_producer_id", "check_seq", "decode",
           "decode_entry", "encode", "encode_entry", "encode_many", "encoder", "is_sequenced_format",
           "producer_header", "read_varint", "varint"]
