"""Entry format and digests: what a writer signs and every reader verifies.

An entry as stored on bookies and sent on the wire::

    u64 ledger id | u64 entry id | i64 last-add-confirmed | digest (0, 4 or 32 bytes) | payload

The digest covers the 24-byte header and the payload. Types: ``crc32c`` (default), ``crc32``,
``hmac-sha256`` (keyed with a key derived from the ledger password) and ``none``. Each type is a
subclass of :class:`DigestManager` that owns its signing and verifying and registers its names
(ours and BookKeeper's ``DigestType``) by being defined; ``DigestManager(ledger_id, name, password)``
builds the one the name asks for.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import ClassVar, NamedTuple

import crc32c as _crc32c

from ledgerstore.errors import DigestMismatchError, InvalidArgumentError, MetadataError
from ledgerstore.proto import speedups

ENTRY_HEADER = struct.Struct(">QQq")
_CRC_HEADER = struct.Struct(">QQqI")  # entry header followed by a crc32c digest
_U32 = struct.Struct(">I")

#: digest types by every name they answer to (lower case): ours and BookKeeper's
_DIGESTS: dict[str, type[DigestManager]] = {}


def normalize_digest_type(name: str) -> str:
    """Our name for a digest type given as ours or as BookKeeper spells it (``MAC`` -> ``hmac-sha256``,
    ``DUMMY`` -> ``none``); an unknown name is returned unchanged so the caller's check names it."""
    cls = _DIGESTS.get(name.strip().lower())
    return name if cls is None else cls.name


def master_key(password: bytes) -> bytes:
    """The key a bookie stores per ledger and checks on adds and fences (BookKeeper derives it
    from the password the same way, with SHA-1)."""
    return hashlib.sha256(b"ledger\0" + password).digest()


#: scrypt's default cost for a new password check (the client's ``password_check_cost``):
#: N=2**13, r=8, p=1 takes 8 MiB and about 20 ms of one core (measured on a 2-core build
#: machine), paid once per ledger create and per open (a client remembers the checks it verified,
#: so re-opening costs nothing). That makes an offline guess thousands of times dearer than the
#: unsalted SHA-256 it replaces, while a workload that creates a ledger per second spends 2% of a
#: core on it. Raise it as hardware gets faster: every check carries its own parameters, and a
#: check made with smaller ones is rewritten the next time its password is verified
#: (:func:`check_needs_upgrade`).
SCRYPT_N = 2**13
#: the range of N a client may be configured with (1 MiB to 1 GiB of memory at r=8)
SCRYPT_N_RANGE = (2**10, 2**20)
SCRYPT_R = 8
SCRYPT_P = 1
_SALT_BYTES = 16
_HASH_BYTES = 32
#: the largest parameters a stored check may ask for (a corrupt or hostile check must not make
#: an open allocate gigabytes): N * r * 128 bytes stays within 256 MiB
_SCRYPT_MAX_MEM = 256 * 1024 * 1024
#: the check written before salted checks: unsalted SHA-256 hex of a fixed prefix and the password
_LEGACY_PREFIX = b"ledgerstore-password-check\0"
_LEGACY = re.compile(r"[0-9a-f]{64}")
_SCRYPT = re.compile(r"scrypt\$n=(\d{1,9})\$r=(\d{1,4})\$p=(\d{1,4})\$([A-Za-z0-9+/=]{4,64})\$([A-Za-z0-9+/=]{4,128})")


def password_check(password: bytes, n: int | None = None) -> str:
    """What ledger metadata stores to refuse a wrong password at open, without storing it: a
    salted scrypt hash, self-describing as ``scrypt$n=N$r=R$p=P$<salt b64>$<hash b64>`` so its
    parameters can be raised later. ``n`` is scrypt's cost (default :data:`SCRYPT_N`)."""
    n = SCRYPT_N if n is None else n
    salt = os.urandom(_SALT_BYTES)
    digest = _scrypt(password, salt, n, SCRYPT_R, SCRYPT_P)
    return (f"scrypt$n={n}$r={SCRYPT_R}$p={SCRYPT_P}$"
            f"{base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}")


def legacy_password_check(password: bytes) -> str:
    """The unsalted check older releases stored (still accepted at open, then rewritten)."""
    return hashlib.sha256(_LEGACY_PREFIX + password).hexdigest()


def verify_password(check: str, password: bytes) -> bool:
    """Whether ``password`` is the one ``check`` (from :func:`password_check`, or an older
    release's unsalted check) was made from; compared in constant time. MetadataError
    when ``check`` is in no known format (the metadata is corrupt)."""
    if _LEGACY.fullmatch(check):
        return hmac.compare_digest(check, legacy_password_check(password))
    n, r, p, salt, expected = _parse_scrypt(check)
    return hmac.compare_digest(expected, _scrypt(password, salt, n, r, p, len(expected)))


def check_needs_upgrade(check: str, n: int | None = None) -> bool:
    """Whether ``check`` is weaker than what :func:`password_check` makes with cost ``n`` (the
    unsalted form, or scrypt with smaller parameters): rewrite it once the password is verified."""
    if _LEGACY.fullmatch(check):
        return True
    got_n, r, p, _, _ = _parse_scrypt(check)
    return got_n * r * p < (SCRYPT_N if n is None else n) * SCRYPT_R * SCRYPT_P


def _parse_scrypt(check: str) -> tuple[int, int, int, bytes, bytes]:
    m = _SCRYPT.fullmatch(check)
    if m is None:
        raise MetadataError("the ledger's stored password check is in no known format (corrupt metadata)")
    n, r, p = int(m[1]), int(m[2]), int(m[3])
    if n < 2 or n & (n - 1) or r < 1 or p < 1 or 128 * n * r * p > _SCRYPT_MAX_MEM:
        raise MetadataError(f"the ledger's stored password check asks for scrypt n={n} r={r} p={p}, "
                                   "outside what this release accepts (corrupt metadata)")
    try:
        return n, r, p, base64.b64decode(m[4], validate=True), base64.b64decode(m[5], validate=True)
    except binascii.Error:
        raise MetadataError("the ledger's stored password check is not valid base64 (corrupt metadata)") from None


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, size: int = _HASH_BYTES) -> bytes:
    # maxmem must cover 128*N*r*p plus scrypt's working block; OpenSSL's default is 32 MiB
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=size, maxmem=_SCRYPT_MAX_MEM + 2**20)


class Entry(NamedTuple):
    """An entry read back and verified."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    payload: bytes


class DigestManager:
    """Signs and verifies entries of one ledger. ``DigestManager(ledger_id, digest_type,
    password)`` returns the subclass registered for ``digest_type`` (our name or BookKeeper's, in
    any case); InvalidArgumentError for an unknown one. A subclass sets :attr:`name`,
    :attr:`aliases` and :attr:`size` and implements :meth:`digest`."""

    __slots__ = ("ledger_id",)
    #: our name of the digest type
    name: ClassVar[str]
    #: other names it answers to (BookKeeper's ``DigestType``)
    aliases: ClassVar[tuple[str, ...]] = ()
    #: bytes of digest between an entry's header and its payload
    size: ClassVar[int]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "name" in cls.__dict__:  # a digest type, not a shared base
            for alias in (cls.name, *cls.aliases):
                _DIGESTS[alias.lower()] = cls

    def __new__(cls, ledger_id: int, digest_type: str | None = None, password: bytes = b"") -> DigestManager:
        wanted = cls if digest_type is None else _DIGESTS.get(digest_type.strip().lower())
        if wanted is None or wanted is DigestManager:
            raise InvalidArgumentError(f"unknown digest type {digest_type!r}; choose one of {', '.join(DIGEST_TYPES)}")
        if cls is not DigestManager and wanted is not cls:
            raise InvalidArgumentError(f"digest type {digest_type!r} is not {cls.name!r}")
        return object.__new__(wanted)

    def __init__(self, ledger_id: int, digest_type: str | None = None, password: bytes = b"") -> None:
        self.ledger_id = ledger_id

    @property
    def digest_type(self) -> str:
        """Our name of this digest type."""
        return self.name

    def digest(self, header: bytes, payload: bytes) -> bytes:
        """The digest of an entry's ``header`` and ``payload``."""
        raise NotImplementedError

    def sign(self, entry_id: int, lac: int, payload: bytes) -> bytes:
        """The bytes of a signed entry."""
        header = ENTRY_HEADER.pack(self.ledger_id, entry_id, lac)
        return b"".join((header, self.digest(header, payload), payload))

    def sign_many(self, first_entry_id: int, lac: int, payloads: Sequence[bytes]) -> list[bytes]:
        """The signed bytes of ``payloads`` as consecutive entries from ``first_entry_id``."""
        pack = ENTRY_HEADER.pack
        lid = self.ledger_id
        fn = self.digest
        return [b"".join((h, fn(h, p), p)) for h, p in
                ((pack(lid, e, lac), p) for e, p in enumerate(payloads, first_entry_id))]

    def verify_into(self, items: Iterable[tuple[int, int, bytes]], out: dict[int, Entry]) -> None:
        """Verify ``(entry id, status, data)`` items of a READ_MULTI answer: each item with
        status 0 (OK) and a valid copy goes into ``out`` by entry id; anything else is left out."""
        for eid, status, data in items:
            if not status:
                try:
                    out[eid] = self.verify(data, eid)
                except DigestMismatchError:
                    pass

    def verify(self, data: bytes, expected_entry_id: int | None = None) -> Entry:
        """Check an entry's digest and ids; DigestMismatchError if anything is off."""
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
        if self.size and not hmac.compare_digest(digest, self.digest(header, payload)):
            raise DigestMismatchError(
                f"digest ({self.name}) mismatch on ledger {lid} entry {eid}: corrupt data or wrong password"
            )
        return Entry(lid, eid, lac, payload)


class _CrcDigest(DigestManager):
    """A 4-byte CRC of the header and then the payload."""

    __slots__ = ()
    size = 4
    def crc(self, data: bytes, value: int) -> int:
        """The CRC of ``data`` continuing from ``value``."""
        raise NotImplementedError

    def digest(self, header: bytes, payload: bytes) -> bytes:
        crc = self.crc
        return _U32.pack(crc(payload, crc(header, 0)))


class Crc32cDigest(_CrcDigest):
    """CRC32C (Castagnoli), the default: signing and verifying are inlined for the hot loops."""

    __slots__ = ()
    name = "crc32c"

    def crc(self, data: bytes, value: int) -> int:
        return _crc32c.crc32c(data, value)

    def sign_many(self, first_entry_id: int, lac: int, payloads: Sequence[bytes]) -> list[bytes]:
        pack = ENTRY_HEADER.pack
        lid = self.ledger_id
        crc = _crc32c.crc32c
        u32 = _U32.pack
        out: list[bytes] = []
        append = out.append
        eid = first_entry_id
        for p in payloads:  # the writer's hot loop
            h = pack(lid, eid, lac)
            append(h + u32(crc(p, crc(h))) + p)
            eid += 1
        return out

    def verify_into(self, items: Iterable[tuple[int, int, bytes]], out: dict[int, Entry]) -> None:
        fast = speedups.compiled
        if fast is not None:
            fast.crc32c_verify_into(self.ledger_id, items, out, Entry)
            return
        lid = self.ledger_id
        crc = _crc32c.crc32c
        unpack = _CRC_HEADER.unpack_from
        hsize, size = ENTRY_HEADER.size, _CRC_HEADER.size
        new = tuple.__new__
        for eid, status, data in items:  # the reader's hot loop
            if status or len(data) < size:
                continue
            l2, e2, lac, c = unpack(data)
            payload = data[size:]
            if l2 == lid and e2 == eid and crc(payload, crc(data[:hsize])) == c:
                out[eid] = new(Entry, (lid, eid, lac, payload))

    def verify(self, data: bytes, expected_entry_id: int | None = None) -> Entry:
        if len(data) >= _CRC_HEADER.size:
            # the hot read path: compare checksums as integers, no digest bytes built
            lid, eid, lac, crc = _CRC_HEADER.unpack_from(data)
            payload = data[_CRC_HEADER.size :]
            if (lid == self.ledger_id and (expected_entry_id is None or eid == expected_entry_id)
                    and _crc32c.crc32c(payload, _crc32c.crc32c(data[: ENTRY_HEADER.size])) == crc):
                return Entry(lid, eid, lac, payload)
        return DigestManager.verify(self, data, expected_entry_id)  # says what is wrong


class Crc32Digest(_CrcDigest):
    """CRC32 (zlib's polynomial)."""

    __slots__ = ()
    name = "crc32"

    def crc(self, data: bytes, value: int) -> int:
        return zlib.crc32(data, value)


class HmacSha256Digest(DigestManager):
    """HMAC-SHA256 keyed with a key derived from the ledger password (BookKeeper's ``MAC``)."""

    __slots__ = ("_key",)
    name = "hmac-sha256"
    aliases = ("mac",)
    size = 32

    def __init__(self, ledger_id: int, digest_type: str | None = None, password: bytes = b"") -> None:
        super().__init__(ledger_id, digest_type, password)
        self._key = hashlib.sha256(b"mac\0" + password).digest()

    def digest(self, header: bytes, payload: bytes) -> bytes:
        m = hmac.new(self._key, header, hashlib.sha256)
        m.update(payload)
        return m.digest()


class NoDigest(DigestManager):
    """No digest: only the ledger and entry ids of the header are checked (BookKeeper's ``DUMMY``)."""

    __slots__ = ()
    name = "none"
    aliases = ("dummy",)
    size = 0

    def digest(self, header: bytes, payload: bytes) -> bytes:
        return b""


#: our names of the digest types, the default first
DIGEST_TYPES = tuple(dict.fromkeys(cls.name for cls in _DIGESTS.values()))


def parse_entry_header(data: bytes) -> tuple[int, int, int]:
    """(ledger id, entry id, lac) of a signed entry, without verifying it (bookie side)."""
    if len(data) < ENTRY_HEADER.size:
        raise DigestMismatchError(f"entry of {len(data)} bytes is shorter than its {ENTRY_HEADER.size}-byte header")
    return ENTRY_HEADER.unpack_from(data)
