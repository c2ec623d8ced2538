"""On-disk format of the ``rocksdb`` storage engine: key layout and record codec (pure, no IO).

Keys sort by (kind, ledger id, entry id), all integers big-endian, so one ledger's entries are one
contiguous key range and a reverse seek inside it finds the last entry:

* ``b"e" + ledger_id (u64) + entry_id (u64)`` - an entry;
* ``b"g" + ledger_id (u64)`` - a deleted ledger whose key range still awaits compaction by GC;
* ``b"m" + ledger_id (u64)`` - the ledger's state (fenced flag, master key).

Every value is a record: ``version (u8) | crc32c (u32, big-endian) | payload``. The checksum covers
the key and the payload, so a value that ends up under another key fails the check as surely as a
flipped bit does. A state record's payload is ``flags (u8) | master key``.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from crc32c import crc32c

from ledgerstore.errors import BookieIOError, InvalidArgumentError

__all__ = [
    "FORMAT_VERSION",
    "ENTRY_PREFIX",
    "GC_PREFIX",
    "STATE_PREFIX",
    "LedgerState",
    "entry_key",
    "encode_entries",
    "entry_range",
    "deletion_runs",
    "ledger_key",
    "gc_key",
    "split_entry_key",
    "split_ledger_key",
    "encode_record",
    "decode_record",
    "describe_key",
    "encode_state",
    "decode_state",
]

FORMAT_VERSION = 1
ENTRY_PREFIX = b"e"
GC_PREFIX = b"g"
STATE_PREFIX = b"m"

_ENTRY_KEY = struct.Struct(">cQQ")
_LEDGER_KEY = struct.Struct(">cQ")
_ENTRY_ID = struct.Struct(">Q")
_HEADER = struct.Struct(">BI")
HEADER_SIZE = _HEADER.size
MAX_LEDGER_ID = 2**64 - 1
MAX_ENTRY_ID = 2**64 - 1

FLAG_FENCED = 0x01
FLAG_HAS_KEY = 0x02


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    """The key of one entry."""
    try:
        return _ENTRY_KEY.pack(ENTRY_PREFIX, ledger_id, entry_id)
    except struct.error:
        raise InvalidArgumentError(
            f"ledger id {ledger_id!r} and entry id {entry_id!r} must be integers in [0, 2**64)"
        ) from None


def entry_range(ledger_id: int) -> tuple[bytes, bytes]:
    """``[begin, end)`` covering every entry key of the ledger (for iteration and range deletes)."""
    begin = ledger_key(ENTRY_PREFIX, ledger_id)
    if ledger_id == MAX_LEDGER_ID:
        return begin, GC_PREFIX  # the next prefix bounds the very last ledger
    return begin, _LEDGER_KEY.pack(ENTRY_PREFIX, ledger_id + 1)


def deletion_runs(pending: Sequence[int], live: Sequence[int]) -> list[tuple[int, int]]:
    """Group sorted deleted ledger ids into ``(first, last)`` runs with no live (sorted) ledger
    id between them, so GC compacts adjacent deletions as one key range (from
    ``entry_range(first)[0]`` to ``entry_range(last)[1]``) without rewriting live ledgers' data."""
    runs: list[tuple[int, int]] = []
    for ledger_id in pending:
        if runs:
            first, last = runs[-1]
            nxt = bisect.bisect_right(live, last)
            if nxt == len(live) or live[nxt] >= ledger_id:
                runs[-1] = (first, ledger_id)
                continue
        runs.append((ledger_id, ledger_id))
    return runs


def ledger_key(prefix: bytes, ledger_id: int) -> bytes:
    """A per-ledger key (``STATE_PREFIX`` or ``GC_PREFIX``, or the start of its entry range)."""
    try:
        return _LEDGER_KEY.pack(prefix, ledger_id)
    except struct.error:
        raise InvalidArgumentError(f"ledger id {ledger_id!r} must be an integer in [0, 2**64)") from None


def gc_key(ledger_id: int) -> bytes:
    """The key marking a deleted ledger that GC has not compacted yet."""
    return ledger_key(GC_PREFIX, ledger_id)


def split_entry_key(key: bytes) -> tuple[int, int]:
    """``(ledger_id, entry_id)`` of an entry key."""
    _, ledger_id, entry_id = _ENTRY_KEY.unpack(key)
    return ledger_id, entry_id


def split_ledger_key(key: bytes) -> int:
    """The ledger id of a per-ledger key."""
    return int(_LEDGER_KEY.unpack(key)[1])


def encode_record(key: bytes, payload: bytes) -> bytes:
    """The stored value for ``payload`` under ``key``: version, checksum, payload."""
    return _HEADER.pack(FORMAT_VERSION, crc32c(payload, crc32c(key))) + payload


def encode_entries(ledger_id: int, entries: Iterable[tuple[int, bytes]]) -> list[tuple[bytes, bytes]]:
    """``(key, stored value)`` of each ``(entry_id, payload)`` of one ledger: what
    :func:`entry_key` and :func:`encode_record` give, computed in one pass for batch writes.
    InvalidArgumentError, naming the first bad id, if any id is out of range."""
    prefix = ledger_key(ENTRY_PREFIX, ledger_id)
    pack_id = _ENTRY_ID.pack
    pack_header = _HEADER.pack
    out: list[tuple[bytes, bytes]] = []
    append = out.append
    entry_id: object = None
    try:
        for entry_id, payload in entries:
            key = prefix + pack_id(entry_id)
            append((key, pack_header(FORMAT_VERSION, crc32c(payload, crc32c(key))) + payload))
    except struct.error:
        raise InvalidArgumentError(
            f"ledger id {ledger_id!r} and entry id {entry_id!r} must be integers in [0, 2**64)"
        ) from None
    return out


def describe_key(key: bytes) -> str:
    """Human words for a key, for error messages: ``ledger 5 entry 7``, ``ledger 5 state``."""
    if len(key) == _ENTRY_KEY.size and key[:1] == ENTRY_PREFIX:
        ledger_id, entry_id = split_entry_key(key)
        return f"ledger {ledger_id} entry {entry_id}"
    if len(key) == _LEDGER_KEY.size:
        kind = {STATE_PREFIX: "state", GC_PREFIX: "gc marker"}.get(key[:1], f"record {key[:1]!r}")
        return f"ledger {split_ledger_key(key)} {kind}"
    return f"key {key.hex()}"


def decode_record(key: bytes, value: bytes) -> bytes:
    """The payload of a stored value; BookieIOError naming the ledger (and entry) if it fails
    verification."""
    if len(value) < HEADER_SIZE:
        what = describe_key(key)
        raise BookieIOError(
            f"{what}: stored record is {len(value)} bytes, shorter than its {HEADER_SIZE}-byte header; "
            "the record is corrupt: re-replicate the ledger from other bookies"
        )
    version, expected = _HEADER.unpack_from(value)
    if version != FORMAT_VERSION:
        what = describe_key(key)
        raise BookieIOError(
            f"{what}: stored record has format version {version}, this engine reads version "
            f"{FORMAT_VERSION}; the record is corrupt or written by a newer release"
        )
    payload = memoryview(value)[HEADER_SIZE:]
    actual = crc32c(payload, crc32c(key))
    if actual != expected:
        what = describe_key(key)
        raise BookieIOError(
            f"{what}: checksum mismatch (stored crc32c {expected:#010x}, computed {actual:#010x}); "
            "the record is corrupt: re-replicate the ledger from other bookies"
        )
    return value[HEADER_SIZE:]


class LedgerState(NamedTuple):
    """What the engine keeps per ledger besides its entries."""

    fenced: bool = False
    master_key: bytes | None = None


def encode_state(key: bytes, state: LedgerState) -> bytes:
    """The stored value of a ledger's state record."""
    flags = (FLAG_FENCED if state.fenced else 0) | (FLAG_HAS_KEY if state.master_key is not None else 0)
    return encode_record(key, bytes((flags,)) + (state.master_key or b""))


def decode_state(key: bytes, value: bytes) -> LedgerState:
    """Decode and verify a ledger's state record (BookieIOError if corrupt)."""
    payload = decode_record(key, value)
    if not payload:
        raise BookieIOError(f"{describe_key(key)}: record has no flags byte; the record is corrupt")
    flags = payload[0]
    master_key = payload[1:] if flags & FLAG_HAS_KEY else None
    return LedgerState(bool(flags & FLAG_FENCED), master_key)
