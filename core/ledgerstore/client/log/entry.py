"""The log entry format: what a log writer puts in each entry of its ledgers, and reading it back.

Pure functions over bytes (no IO), with a compiled twin of the encoder in
``ledgerstore.proto._speedups`` (the same bytes; :mod:`ledgerstore.proto.speedups` chooses); :mod:`.writer` encodes, :mod:`.reader` and :mod:`.rebuild`
decode. The format is chosen per ledger, never guessed from the bytes (a raw payload can be
anything): a writer of this release creates its ledgers with ``log.format=2`` in the ledger's
``custom`` metadata (:data:`FORMAT_KEY`), and every entry of such a ledger starts with a header.
Ledgers without the key (format 1, written by older releases) hold the bare payload.

Format 2 entry (``docs/logs.md``, "Entry format")::

    byte 0         flags: 0x00 plain, 0x01 sequenced (the other bits are reserved, must be 0)
    sequenced only:
      byte 1       n, the producer id's length in bytes (1..255)
      bytes 2..    the producer id (UTF-8, n bytes)
      next 8       the sequence, unsigned big-endian
    the rest       the payload, as given to append
"""

from __future__ import annotations

import functools
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
#: flag bit: the entry carries a producer id and a sequence
FLAG_SEQUENCED = 0x01
#: the header of an entry written without a sequence
PLAIN_HEADER = b"\x00"
#: longest producer id, in UTF-8 bytes (its length is one byte of the header)
MAX_PRODUCER_ID_BYTES = 255
#: sequences are unsigned 64-bit on the wire; Python callers get the signed range
MAX_SEQ = 2**63 - 1

_SEQ = struct.Struct(">Q")
pack_seq = _SEQ.pack


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
    once per producer, so an append only adds the 8 sequence bytes."""
    raw = check_producer_id(producer_id).encode("utf-8", "surrogatepass")
    return bytes((FLAG_SEQUENCED, len(raw))) + raw


@functools.lru_cache(maxsize=MAX_PRODUCER_ID_BYTES + 2)
def header_packer(header_size: int) -> Callable[[bytes, int], bytes]:
    """``pack(header, seq)``: a header of ``header_size`` bytes followed by the sequence, in one
    call (a third cheaper than two concatenations; one per header size, shared by producers)."""
    return struct.Struct(f">{header_size}sQ").pack


def encode(header: bytes, seq: int, payload: bytes) -> bytes:
    """A sequenced entry: ``header`` (from :func:`producer_header`), ``seq``, ``payload``."""
    fast = speedups.compiled
    if fast is not None:
        return fast.log_entry(header, seq, payload)
    return header_packer(len(header))(header, seq) + payload


def encode_many(header: bytes, first_seq: int, payloads: Iterable[bytes]) -> list[bytes]:
    """:func:`encode` of each of ``payloads``, with the sequences ``first_seq, first_seq + 1, ...``."""
    fast = speedups.compiled
    if fast is not None:
        return fast.log_entries(header, first_seq, payloads)
    pack = header_packer(len(header))
    return [pack(header, s) + x for s, x in enumerate(payloads, first_seq)]


def compiled_encoder() -> Callable[[bytes, int, bytes], bytes] | None:
    """The compiled :func:`encode` when the compiled hot path runs (``ledgerstore.proto.speedups``),
    else None: a log writer takes it once, when it is created, and packs with its producer's
    ``pack`` without it. The compiled one builds the entry in one buffer, where the pure-Python
    one packs the header and then concatenates (two copies, one call more per entry)."""
    fast = speedups.compiled
    return None if fast is None else fast.log_entry


def decode(data: bytes) -> tuple[bytes, str | None, int | None]:
    """``(payload, producer_id, seq)`` of a format 2 entry; LogError if it is not one."""
    if not data:
        raise LogError("log entry of format 2 is empty: it has no header")
    flags = data[0]
    if flags == 0:
        return data[1:], None, None
    if flags != FLAG_SEQUENCED:
        raise LogError(f"log entry has header flags {flags:#04x}; this release knows only 0x00 and 0x01")
    n = data[1] if len(data) > 1 else 0
    end = 2 + n
    if n == 0 or len(data) < end + 8:
        raise LogError(f"log entry of {len(data)} bytes is too short for its sequenced header")
    seq = _SEQ.unpack_from(data, end)[0]
    return data[end + 8:], data[2:end].decode("utf-8", "surrogatepass"), seq


#: the public names of the codec (``ledgerstore.client.log`` re-exports them)
encode_entry = encode
decode_entry = decode

__all__ = ["FLAG_SEQUENCED", "FORMAT_KEY", "FORMAT_SEQUENCED", "MAX_PRODUCER_ID_BYTES", "MAX_SEQ", "PLAIN_HEADER",
           "LogRecord", "check_producer_id", "check_seq", "compiled_encoder", "decode", "decode_entry", "encode",
           "encode_entry", "encode_many", "header_packer", "is_sequenced_format",
           "producer_header"]
