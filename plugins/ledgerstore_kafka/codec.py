"""Kafka's primitive wire types as pure functions over bytes (no sockets here).

:class:`Reader` decodes from a request's bytes and raises :class:`MalformedRequest` on anything
short or out of range, never ``struct.error`` or ``IndexError``; :class:`Writer` appends to a
``bytearray``. Both know the classic types (INT8..INT64, STRING, NULLABLE_STRING, BYTES, ARRAY
with an INT32 length) and the flexible versions' compact ones (UNSIGNED_VARINT lengths plus one,
tagged fields), as Kafka's protocol guide defines them. The messages built from them are in
:mod:`ledgerstore_kafka.messages`; record batches in :mod:`ledgerstore_kafka.records`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TypeVar

from ledgerstore.errors import LedgerStoreError

__all__ = ["MalformedRequest", "Reader", "Writer"]

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")

#: the longest array a request may declare: more elements than its bytes could hold is malformed
#: anyway, and the check keeps a 4-byte length from making the decoder loop for long
MAX_ARRAY = 1 << 20

T = TypeVar("T")


class MalformedRequest(LedgerStoreError):
    """A request's bytes do not parse as the message its header names (truncated, a length past
    its end, a negative length where none is allowed)."""


class Reader:
    """Reads Kafka types from ``data`` starting at ``pos``."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = memoryview(data)
        self.pos = pos

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise MalformedRequest(f"the request ends {self.pos + n - len(self.data)} bytes early "
                                   f"(needed {n} at byte {self.pos} of {len(self.data)})")
        view = self.data[self.pos:self.pos + n]
        self.pos += n
        return view

    def int8(self) -> int:
        return int(_I8.unpack(self._take(1))[0])

    def boolean(self) -> bool:
        return self.int8() != 0

    def int16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise MalformedRequest(f"a varint at byte {self.pos} is longer than 10 bytes")

    def _text(self, n: int) -> str:
        try:
            return bytes(self._take(n)).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedRequest(f"a string ending at byte {self.pos} is not UTF-8") from None

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise MalformedRequest(f"a null string at byte {self.pos} where the message needs one")
        return value

    def nullable_string(self) -> str | None:
        n = self.int16()
        return None if n == -1 else self._text(n)

    def compact_string(self) -> str:
        value = self.compact_nullable_string()
        if value is None:
            raise MalformedRequest(f"a null string at byte {self.pos} where the message needs one")
        return value

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n == -1 else self._text(n)

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        return None if n == -1 else bytes(self._take(n))

    def array_length(self) -> int:
        """An ARRAY's length; ``-1`` is a null array."""
        n = self.int32()
        if n < -1 or n > MAX_ARRAY or (n > self.remaining()):
            raise MalformedRequest(f"an array at byte {self.pos - 4} declares {n} elements, which cannot be")
        return n

    def compact_array_length(self) -> int:
        """A COMPACT_ARRAY's length; ``-1`` is a null array."""
        n = self.uvarint() - 1
        if n > MAX_ARRAY or n > self.remaining():
            raise MalformedRequest(f"an array before byte {self.pos} declares {n} elements, which cannot be")
        return n

    def topics(self, partition: Callable[[Reader], T]) -> list[tuple[str, list[T]]]:
        """The topics array most requests carry: each topic a name and an array of partitions,
        each partition read by ``partition`` (a null array reads as empty)."""
        out = []
        for _ in range(max(self.array_length(), 0)):
            name = self.string()
            out.append((name, [partition(self) for _ in range(max(self.array_length(), 0))]))
        return out

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())


class Writer:
    """Appends Kafka types to :attr:`buf`."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def int8(self, v: int) -> Writer:
        self.buf += _I8.pack(v)
        return self

    def boolean(self, v: bool) -> Writer:
        return self.int8(1 if v else 0)

    def int16(self, v: int) -> Writer:
        self.buf += _I16.pack(v)
        return self

    def int32(self, v: int) -> Writer:
        self.buf += _I32.pack(v)
        return self

    def int64(self, v: int) -> Writer:
        self.buf += _I64.pack(v)
        return self

    def uvarint(self, v: int) -> Writer:
        while v >= 0x80:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)
        return self

    def nullable_string(self, v: str | None) -> Writer:
        if v is None:
            return self.int16(-1)
        raw = v.encode("utf-8")
        self.int16(len(raw))
        self.buf += raw
        return self

    def string(self, v: str) -> Writer:
        return self.nullable_string(v)

    def nullable_bytes(self, v: bytes | None) -> Writer:
        if v is None:
            return self.int32(-1)
        self.int32(len(v))
        self.buf += v
        return self

    def array_length(self, n: int) -> Writer:
        return self.int32(n)

    def topics(self, topics: Sequence[tuple[str, Sequence[T]]], partition: Callable[[Writer, T], object]) -> Writer:
        """The topics array most responses carry, each partition written by ``partition``."""
        self.array_length(len(topics))
        for name, parts in topics:
            self.string(name).array_length(len(parts))
            for p in parts:
                partition(self, p)
        return self

    def bytes(self) -> bytes:
        return bytes(self.buf)
