"""Entry format and digests: what a writer signs and every reader verifies.

An entry as stored on bookies and sent on the wire::

    u64 ledger id | u64 entry id | i64 last-add-confirmed | digest (0, 4 or 32 bytes) | payload

The digest covers the 24-byte header and the payload. Types: ``crc32c`` (default), ``crc32``,
``hmac-sha256`` (keyed with a key derived from the ledger password) and ``none``.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import crc32c as _crc32c

from ledgerstore.errors import DigestMismatchError, InvalidArgumentError

ENTRY_HEADER = struct.Struct(">QQq")
_CRC_HEADER = struct.Struct(">QQqI")  # entry header followed by a crc32c digest
_U32 = struct.Struct(">I")

DIGEST_TYPES = ("crc32c", "crc32", "hmac-sha256", "none")

# BookKeeper's DigestType names (CRC32, CRC32C, MAC, DUMMY), in any case, beside ours.
_DIGEST_ALIASES = {"crc32c": "crc32c", "crc32": "crc32", "mac": "hmac-sha256", "hmac-sha256": "hmac-sha256",
                   "dummy": "none", "none": "none"}


def normalize_digest_type(name: str) -> str:
    """Our name for a digest type given as ours or as BookKeeper spells it (``MAC`` -> ``hmac-sha256``,
    ``DUMMY`` -> ``none``); an unknown name is returned unchanged so the caller's check names it."""
    return _DIGEST_ALIASES.get(name.strip().lower(), name)


def master_key(password: bytes) -> bytes:
    """The key a bookie stores per ledger and checks on adds and fences (BookKeeper derives it
    from the password the same way, with SHA-1)."""
    return hashlib.sha256(b"ledger\0" + password).digest()


def password_check(password: bytes) -> str:
    """What ledger metadata stores to refuse a wrong password at open, without storing it."""
    return hashlib.sha256(b"ledgerstore-password-check\0" + password).hexdigest()


class Entry(NamedTuple):
    """An entry read back and verified."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    payload: bytes


class DigestManager:
    """Signs and verifies entries of one ledger."""

    __slots__ = ("digest_type", "size", "_fn", "ledger_id")

    def __init__(self, ledger_id: int, digest_type: str, password: bytes = b"") -> None:
        self.ledger_id = ledger_id
        digest_type = normalize_digest_type(digest_type)
        self.digest_type = digest_type
        self._fn: Callable[[bytes, bytes], bytes]
        if digest_type == "crc32c":
            self.size = 4
            self._fn = lambda h, p: _U32.pack(_crc32c.crc32c(p, _crc32c.crc32c(h)))
        elif digest_type == "crc32":
            self.size = 4
            self._fn = lambda h, p: _U32.pack(zlib.crc32(p, zlib.crc32(h)))
        elif digest_type == "hmac-sha256":
            self.size = 32
            key = hashlib.sha256(b"mac\0" + password).digest()

            def mac(h: bytes, p: bytes) -> bytes:
                m = hmac.new(key, h, hashlib.sha256)
                m.update(p)
                return m.digest()

            self._fn = mac
        elif digest_type == "none":
            self.size = 0
            self._fn = lambda h, p: b""
        else:
            raise InvalidArgumentError(f"unknown digest type {digest_type!r}; choose one of {', '.join(DIGEST_TYPES)}")

    def sign(self, entry_id: int, lac: int, payload: bytes) -> bytes:
        """The bytes of a signed entry."""
        header = ENTRY_HEADER.pack(self.ledger_id, entry_id, lac)
        return b"".join((header, self._fn(header, payload), payload))

    def sign_many(self, first_entry_id: int, lac: int, payloads: Sequence[bytes]) -> list[bytes]:
        """The signed bytes of ``payloads`` as consecutive entries from ``first_entry_id``."""
        pack = ENTRY_HEADER.pack
        lid = self.ledger_id
        if self.digest_type == "crc32c":  # the default, inlined: the writer's hot loop
            crc = _crc32c.crc32c
            u32 = _U32.pack
            out = []
            append = out.append
            eid = first_entry_id
            for p in payloads:
                h = pack(lid, eid, lac)
                append(h + u32(crc(p, crc(h))) + p)
                eid += 1
            return out
        fn = self._fn
        return [b"".join((h, fn(h, p), p)) for h, p in
                ((pack(lid, e, lac), p) for e, p in enumerate(payloads, first_entry_id))]

    def verify_into(self, items: Iterable[tuple[int, int, bytes]], out: dict[int, Entry]) -> None:
        """Verify ``(entry id, status, data)`` items of a READ_MULTI answer: each item with
        status 0 (OK) and a valid copy goes into ``out`` by entry id; anything else is left out."""
        lid = self.ledger_id
        if self.digest_type == "crc32c":  # the default, inlined: the reader's hot loop
            crc = _crc32c.crc32c
            unpack = _CRC_HEADER.unpack_from
            hsize, size = ENTRY_HEADER.size, _CRC_HEADER.size
            new = tuple.__new__
            for eid, status, data in items:
                if status or len(data) < size:
                    continue
                l2, e2, lac, c = unpack(data)
                payload = data[size:]
                if l2 == lid and e2 == eid and crc(payload, crc(data[:hsize])) == c:
                    out[eid] = new(Entry, (lid, eid, lac, payload))
            return
        for eid, status, data in items:
            if not status:
                try:
                    out[eid] = self.verify(data, eid)
                except DigestMismatchError:
                    pass

    def verify(self, data: bytes, expected_entry_id: int | None = None) -> Entry:
        """Check an entry's digest and ids; DigestMismatchError if anything is off."""
        if self.digest_type == "crc32c" and len(data) >= _CRC_HEADER.size:
            # the hot read path: compare checksums as integers, no digest bytes built
            lid, eid, lac, crc = _CRC_HEADER.unpack_from(data)
            payload = data[_CRC_HEADER.size :]
            if (lid == self.ledger_id and (expected_entry_id is None or eid == expected_entry_id)
                    and _crc32c.crc32c(payload, _crc32c.crc32c(data[: ENTRY_HEADER.size])) == crc):
                return Entry(lid, eid, lac, payload)
        hsize = ENTRY_HEADER.size
        if len(data) < hsize + self.size:
            raise DigestMismatchError(
                f"entry of ledger {self.ledger_id} is {len(data)} bytes, shorter than its header and digest"
            )
        lid, eid, lac = ENTRY_HEADER.unpack_from(data)
        if lid != self.ledger_id or (expected_entry_id is not None and eid != expected_entry_id):
            raise DigestMismatchError(
                f"entry header says ledger {lid} entry {eid}; expected ledger {self.ledger_id} entry {expected_entry_id}"
            )
        header = data[:hsize]
        digest = data[hsize : hsize + self.size]
        payload = data[hsize + self.size :]
        if self.size and not hmac.compare_digest(digest, self._fn(header, payload)):
            raise DigestMismatchError(
                f"digest ({self.digest_type}) mismatch on ledger {lid} entry {eid}: corrupt data or wrong password"
            )
        return Entry(lid, eid, lac, payload)


def parse_entry_header(data: bytes) -> tuple[int, int, int]:
    """(ledger id, entry id, lac) of a signed entry, without verifying it (bookie side)."""
    if len(data) < ENTRY_HEADER.size:
        raise DigestMismatchError(f"entry of {len(data)} bytes is shorter than its {ENTRY_HEADER.size}-byte header")
    return ENTRY_HEADER.unpack_from(data)
