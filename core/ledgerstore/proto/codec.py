"""The wire protocol: pure functions from messages to bytes and back, no IO.

Format version 1 (documented in ``docs/protocol.md``). Every frame starts with a 12-byte header::

    u8 version | u8 opcode | u16 flags (requests) or status (responses) | u64 request id

followed by an opcode-specific body; integers are big-endian. Transports carry frames; they never
look inside them. Decoding never trusts a length field: a truncated or inconsistent frame raises
:class:`~ledgerstore.errors.ProtocolError` (status ``BAD_REQUEST`` on the bookie). Every field a
request carries is range-checked as it is decoded (ledger and entry ids in ``0..2**63-1``, a known
LAC of at least -1, master keys of at most :data:`MAX_MASTER_KEY` bytes, only the flag bits the
opcode defines), so nothing out of range ever reaches a bookie's storage engine.

Each request and each response is its own class (as in aiokafka's and kazoo's protocol packages):
it names its opcode, encodes itself and decodes its body, and subclassing :class:`Request` or
:class:`Response` registers it, so :func:`decode_request` and :func:`decode_response` are a table
lookup. The ``encode_*`` functions build the same frames from fields without an object, for the
hot paths (a writer's ADD_BATCH framing, a bookie's answers).
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

import crc32c as _crc32c

from ledgerstore.errors import FrameTooLargeError, ProtocolError
from ledgerstore.proto import speedups
from ledgerstore.proto.digest import ENTRY_HEADER, Crc32cDigest, DigestManager

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">BBHQ")
HEADER_SIZE = HEADER.size


class Op(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    LONG_POLL_LAC = 4
    BOOKIE_INFO = 5
    #: many entries of one ledger in one frame; one answer with a status per entry
    ADD_BATCH = 6
    #: many entries of one ledger in one request; one answer carrying them
    READ_MULTI = 7
    #: the ledgers a bookie holds, with the last entry of each (the auditor's replicas check)
    LIST_LEDGERS = 8


class Status(enum.IntEnum):
    """Mirrors BookKeeper's BookieProtocol result codes."""

    OK = 0
    BAD_REQUEST = 100
    IO_ERROR = 101
    UNAUTHORIZED = 102
    BAD_VERSION = 103
    FENCED = 104
    READ_ONLY = 105
    TOO_MANY_REQUESTS = 106
    NO_SUCH_LEDGER = 402
    NO_SUCH_ENTRY = 403
    #: the ledger is in limbo here (the bookie lost data it may have held) and the entry or LAC
    #: asked for is not stored: the bookie cannot tell whether it ever had it (BookKeeper's
    #: EUNKNOWNLEDGERSTATE). Neither "found" nor "no such entry"
    UNKNOWN = 507


#: ADD flag: a recovery add, accepted even when the ledger is fenced.
FLAG_RECOVERY_ADD = 0x1
#: READ / READ_LAC flag: fence the ledger (the request must carry the master key).
FLAG_FENCE = 0x1
#: BOOKIE_INFO flag: the answer ends with the bookie process's instance (a u64 drawn at its start)
FLAG_INSTANCE = 0x1

_ADD = struct.Struct(">QQH")  # ledger, entry, master key length; then key, then entry bytes
_READ = struct.Struct(">QqH")  # ledger, entry, master key length; then key
_READ_LAC = struct.Struct(">QH")  # ledger, master key length; then key
_LONG_POLL = struct.Struct(">QqI")  # ledger, known lac, timeout ms
_R_ADD = struct.Struct(">QQ")
_R_READ = struct.Struct(">Qq")  # then entry bytes when OK
_R_LAC = struct.Struct(">Qqq")  # ledger, lac, last entry stored
_R_INFO = struct.Struct(">QQQB")  # free bytes, total bytes, ledgers, read-only
_R_INFO_INSTANCE = struct.Struct(">Q")  # then the process instance (absent from older bookies' answers)

_ADD_BATCH = struct.Struct(">QHI")  # ledger, key length, count; then key, then count x (u64 entry, u32 length, bytes)
_BATCH_ITEM = struct.Struct(">QI")
_CRC_ITEM = struct.Struct(">QIQQqI")  # batch item header, then a crc32c-signed entry's header and digest
_READ_MULTI = struct.Struct(">QI")  # ledger, count; then count x i64 entry
_R_BATCH = struct.Struct(">QI")  # ledger, count; then items
_R_ADD_ITEM = struct.Struct(">QH")  # entry, status
_R_READ_ITEM = struct.Struct(">qHI")  # entry, status, length; then bytes
_I64 = struct.Struct(">q")
#: most entries one batch frame may carry
MAX_BATCH = 65536
#: largest ledger or entry id (BookKeeper's ids are Java longs; negative ones mean "none")
MAX_ID = 0x7FFF_FFFF_FFFF_FFFF
#: longest master key a request may carry (keys are 32-byte digests; storage engines keep them
#: in fixed-size headers)
MAX_MASTER_KEY = 256
#: flag bits each opcode defines; a request with any other bit set is refused
_ADD_FLAGS = FLAG_RECOVERY_ADD
_READ_FLAGS = FLAG_FENCE
_INFO_FLAGS = FLAG_INSTANCE

_STATUS_VALUES = frozenset(int(s) for s in Status)


# --- LIST_LEDGERS: which ledgers a bookie holds -------------------------------------------------
#
# request body:  u64 first ledger id | u32 most ledgers to return
# response body: u32 count | count x (u64 ledger id, i64 last entry id stored, -1 if none)
# Ledgers come in ascending id order from the first asked for; fewer than asked for means there
# are no more, so a client pages by asking again from the last id returned + 1.

_LIST_LEDGERS = struct.Struct(">QI")
_R_LIST_ITEM = struct.Struct(">Qq")
_U32 = struct.Struct(">I")
#: most ledgers one LIST_LEDGERS answer carries (16 bytes each: 1 MiB)
MAX_LIST_LEDGERS = 65536


# --- the registries -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Message:
    """What requests and responses share: an opcode, a request id, a frame and a registry. A
    subclass that sets :attr:`op` is a concrete message and registers itself by being defined."""

    op: ClassVar[Op]
    #: opcode -> class of the message kind (requests or responses)
    registry: ClassVar[dict[int, type[Message]]]
    #: the frame of a message of this class, from its fields (positional, in order); the hot
    #: paths call it (or its ``encode_*`` name) without building a message
    frame: ClassVar[Callable[..., bytes]]
    request_id: int

    def __init_subclass__(cls) -> None:
        # no super() call: dataclass(slots=True) makes a new class, which the zero-argument form
        # would not recognise; object's hook does nothing anyway. That copy is the class kept,
        # and it registers last.
        if "op" in cls.__dict__:
            cls.registry[cls.op] = cls

    def encode(self) -> bytes:
        """The message's frame: its class's ``frame`` of its fields, in order."""
        return self.frame(*[getattr(self, name) for name in self.__match_args__])

    @classmethod
    def decode(cls, frame: bytes, request_id: int, word: int) -> Self:
        """The message of ``frame``, whose header the caller has read and checked (``word``: the
        request's flags or the response's status). Raises ProtocolError on a malformed or
        out-of-range body."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Request(Message):
    """A request message: one subclass per opcode, its fields after ``request_id``."""

    registry = {}


@dataclass(frozen=True, slots=True)
class Response(Message):
    """A response message: ``request_id`` and ``status`` always, then the fields of its opcode
    (defaults when a bookie answered an error with the header only)."""

    registry = {}
    status: int


def request_types() -> dict[int, type[Request]]:
    """Opcode -> request class, for every opcode this codec speaks."""
    return {op: cls for op, cls in Request.registry.items() if issubclass(cls, Request)}


def response_types() -> dict[int, type[Response]]:
    """Opcode -> response class, for every opcode this codec speaks."""
    return {op: cls for op, cls in Response.registry.items() if issubclass(cls, Response)}


# --- range checks ---------------------------------------------------------------------------------


def peek_header(frame: bytes) -> tuple[int, int, int, int]:
    """(version, op, flags-or-status, request id); ProtocolError if shorter than a header."""
    if len(frame) < HEADER_SIZE:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than the {HEADER_SIZE}-byte header")
    version, op, flags, rid = HEADER.unpack_from(frame)
    return version, op, flags, rid


def _check(frame: bytes, need: int, what: str) -> None:
    if len(frame) < need:
        raise ProtocolError(f"truncated {what}: {len(frame)} bytes, need at least {need}")


def _fixed(frame: bytes, body: struct.Struct, what: str) -> tuple[int, ...]:
    """The fixed part of a body that may be followed by more (ProtocolError if the frame is shorter)."""
    _check(frame, HEADER_SIZE + body.size, what)
    fields: tuple[int, ...] = body.unpack_from(frame, HEADER_SIZE)
    return fields


def _exact(frame: bytes, body: struct.Struct, what: str) -> tuple[int, ...]:
    """A body of exactly ``body``'s size (ProtocolError for any other length)."""
    if len(frame) != HEADER_SIZE + body.size:
        raise ProtocolError(f"{what} must be {HEADER_SIZE + body.size} bytes, got {len(frame)}")
    fields: tuple[int, ...] = body.unpack_from(frame, HEADER_SIZE)
    return fields


def _out_of_range(what: str, value: int) -> ProtocolError:
    return ProtocolError(f"{what} {value} is out of range")


def _check_keyed(what: str, lid: int, klen: int, flags: int, allowed_flags: int) -> None:
    """The range checks every request naming a ledger with a master key shares."""
    if lid > MAX_ID:
        raise _out_of_range("ledger id", lid)
    if klen > MAX_MASTER_KEY:
        raise _out_of_range("master key length", klen)
    if flags & ~allowed_flags:
        raise _out_of_range(f"{what} flags", flags)


# --- requests -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddRequest(Request):
    """ADD: one signed entry (``flags`` may carry :data:`FLAG_RECOVERY_ADD`)."""

    op = Op.ADD
    ledger_id: int
    entry_id: int
    master_key: bytes
    entry: bytes
    flags: int = 0

    @staticmethod
    def frame(request_id: int, ledger_id: int, entry_id: int, master_key: bytes, entry: bytes,
              flags: int = 0) -> bytes:
        """The frame of an add, from its fields."""
        return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.ADD, flags, request_id),
                         _ADD.pack(ledger_id, entry_id, len(master_key)), master_key, entry))

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        lid, eid, klen = _fixed(frame, _ADD, "add request")
        start = HEADER_SIZE + _ADD.size
        _check(frame, start + klen, "add request master key")
        _check_keyed("add", lid, klen, flags, _ADD_FLAGS)
        if eid > MAX_ID:
            raise _out_of_range("entry id", eid)
        return cls(request_id, lid, eid, frame[start : start + klen], frame[start + klen :], flags)


@dataclass(frozen=True, slots=True)
class ReadRequest(Request):
    """READ: one entry (``flags`` may carry :data:`FLAG_FENCE`, with the master key)."""

    op = Op.READ
    ledger_id: int
    entry_id: int
    master_key: bytes = b""
    flags: int = 0

    @staticmethod
    def frame(request_id: int, ledger_id: int, entry_id: int, master_key: bytes = b"", flags: int = 0) -> bytes:
        """The frame of a read, from its fields."""
        return (HEADER.pack(PROTOCOL_VERSION, Op.READ, flags, request_id)
                + _READ.pack(ledger_id, entry_id, len(master_key)) + master_key)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        lid, eid, klen = _fixed(frame, _READ, "read request")
        start = HEADER_SIZE + _READ.size
        if len(frame) != start + klen:
            raise ProtocolError(f"read request of {len(frame)} bytes does not match its key length {klen}")
        _check_keyed("read", lid, klen, flags, _READ_FLAGS)
        if eid < 0:
            raise _out_of_range("entry id", eid)
        return cls(request_id, lid, eid, frame[start:], flags)


@dataclass(frozen=True, slots=True)
class ReadLacRequest(Request):
    """READ_LAC: a ledger's last-add-confirmed (``flags`` may carry :data:`FLAG_FENCE`)."""

    op = Op.READ_LAC
    ledger_id: int
    master_key: bytes = b""
    flags: int = 0

    @staticmethod
    def frame(request_id: int, ledger_id: int, master_key: bytes = b"", flags: int = 0) -> bytes:
        """The frame of a LAC read, from its fields."""
        return (HEADER.pack(PROTOCOL_VERSION, Op.READ_LAC, flags, request_id)
                + _READ_LAC.pack(ledger_id, len(master_key)) + master_key)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        lid, klen = _fixed(frame, _READ_LAC, "read-LAC request")
        start = HEADER_SIZE + _READ_LAC.size
        if len(frame) != start + klen:
            raise ProtocolError(f"read-LAC request of {len(frame)} bytes does not match its key length {klen}")
        _check_keyed("read-LAC", lid, klen, flags, _READ_FLAGS)
        return cls(request_id, lid, frame[start:], flags)


@dataclass(frozen=True, slots=True)
class LongPollLacRequest(Request):
    """LONG_POLL_LAC: the LAC once it passes ``known_lac``, or after ``timeout_ms``."""

    op = Op.LONG_POLL_LAC
    ledger_id: int
    known_lac: int
    timeout_ms: int

    @staticmethod
    def frame(request_id: int, ledger_id: int, known_lac: int, timeout_ms: int) -> bytes:
        """The frame of a LAC long poll, from its fields."""
        return HEADER.pack(PROTOCOL_VERSION, Op.LONG_POLL_LAC, 0, request_id) + _LONG_POLL.pack(
            ledger_id, known_lac, timeout_ms)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        lid, known, timeout = _exact(frame, _LONG_POLL, "long-poll request")
        if lid > MAX_ID:
            raise _out_of_range("ledger id", lid)
        if known < -1:
            raise _out_of_range("known LAC", known)
        if flags:
            raise _out_of_range("long-poll flags", flags)
        return cls(request_id, lid, known, timeout)


@dataclass(frozen=True, slots=True)
class BookieInfoRequest(Request):
    """BOOKIE_INFO: the bookie's free and total space, ledger count and mode."""

    op = Op.BOOKIE_INFO
    #: ``FLAG_INSTANCE``: the answer tells the bookie process's instance too
    flags: int = 0

    @staticmethod
    def frame(request_id: int, flags: int = 0) -> bytes:
        """The frame of a bookie-info request."""
        return HEADER.pack(PROTOCOL_VERSION, Op.BOOKIE_INFO, flags, request_id)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        h = HEADER_SIZE
        if len(frame) != h:
            raise ProtocolError(f"bookie-info request must be {h} bytes, got {len(frame)}")
        if flags & ~_INFO_FLAGS:
            raise _out_of_range("bookie-info flags", flags)
        return cls(request_id, flags)


@dataclass(frozen=True, slots=True)
class AddBatchRequest(Request):
    """ADD_BATCH: many signed entries of one ledger in one frame, one answer for all."""

    op = Op.ADD_BATCH
    ledger_id: int
    master_key: bytes
    entries: tuple[tuple[int, bytes], ...]
    flags: int = 0
    #: the encoded entry section (``count x (u64 entry, u32 length, bytes)``) as received (a view
    #: of the frame), so a bookie can journal the batch without encoding or copying it again;
    #: empty when built by hand
    raw_entries: bytes | memoryview = b""

    @staticmethod
    def frame(request_id: int, ledger_id: int, master_key: bytes,
              entries: Sequence[tuple[int, bytes]], flags: int = 0) -> bytes:
        """Many entries of one ledger in one frame (the hot path of a pipelining writer)."""
        return add_batch_header(request_id, flags) + encode_add_batch_body(ledger_id, master_key, entries)

    def encode(self) -> bytes:
        return self.frame(self.request_id, self.ledger_id, self.master_key, self.entries, self.flags)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        lid, klen, count = _fixed(frame, _ADD_BATCH, "add-batch request")
        if count > MAX_BATCH:
            raise ProtocolError(f"add-batch of {count} entries exceeds the limit of {MAX_BATCH}")
        _check_keyed("add-batch", lid, klen, flags, _ADD_FLAGS)
        pos = HEADER_SIZE + _ADD_BATCH.size
        _check(frame, pos + klen, "add-batch master key")
        key = frame[pos : pos + klen]
        pos += klen
        fast = speedups.compiled
        if fast is not None and type(frame) is bytes:
            entries = fast.add_batch_entries(frame, pos, count)
        else:
            entries = add_batch_entries(frame, pos, count)
        # a view only of an immutable frame: the journal writes it after this returns
        raw = memoryview(frame)[pos:] if type(frame) is bytes else bytes(frame[pos:])
        return cls(request_id, lid, key, tuple(entries), flags, raw)


def add_batch_entries(frame: bytes, pos: int, count: int) -> list[tuple[int, bytes]]:
    """The ``(entry id, signed entry)`` items of an ADD_BATCH request's entry section, which
    starts at ``pos`` and must end the frame (the bookie's per-entry decode; compiled in
    ``_speedups``). ProtocolError when the section is truncated, too long or an id is out of range."""
    n = len(frame)
    unpack = _BATCH_ITEM.unpack_from
    isz = _BATCH_ITEM.size
    entries: list[tuple[int, bytes]] = []
    append = entries.append
    for _ in range(count):
        if n - pos < isz:
            raise ProtocolError(f"truncated add-batch: {len(entries)} of {count} entries")
        eid, size = unpack(frame, pos)
        pos += isz
        if size > n - pos or eid > MAX_ID:
            raise ProtocolError(
                f"add-batch entry {eid} of {size} bytes does not fit the frame or its id is out of range")
        append((eid, frame[pos : pos + size]))
        pos += size
    if pos != n:
        raise ProtocolError(f"add-batch frame has {n - pos} bytes after its {count} entries")
    return entries


@dataclass(frozen=True, slots=True)
class ReadMultiRequest(Request):
    """READ_MULTI: many entries of one ledger in one request, one answer carrying them."""

    op = Op.READ_MULTI
    ledger_id: int
    entry_ids: tuple[int, ...]

    @staticmethod
    def frame(request_id: int, ledger_id: int, entry_ids: Sequence[int]) -> bytes:
        """The frame of a multi-entry read, from its fields."""
        return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.READ_MULTI, 0, request_id),
                         _READ_MULTI.pack(ledger_id, len(entry_ids)),
                         struct.pack(f">{len(entry_ids)}q", *entry_ids)))

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        lid, count = _fixed(frame, _READ_MULTI, "read-multi request")
        start = HEADER_SIZE + _READ_MULTI.size
        if count > MAX_BATCH or len(frame) != start + 8 * count:
            raise ProtocolError(f"read-multi request of {len(frame)} bytes does not hold {count} entry ids")
        if lid > MAX_ID:
            raise _out_of_range("ledger id", lid)
        if flags:
            raise _out_of_range("read-multi flags", flags)
        ids: tuple[int, ...] = struct.unpack_from(f">{count}q", frame, start)
        if ids and min(ids) < 0:
            raise _out_of_range("entry id", min(ids))
        return cls(request_id, lid, ids)


@dataclass(frozen=True, slots=True)
class ListLedgersRequest(Request):
    """LIST_LEDGERS: up to ``max_ledgers`` ledgers the bookie holds, from ``first_ledger_id`` on."""

    op = Op.LIST_LEDGERS
    first_ledger_id: int = 0
    max_ledgers: int = MAX_LIST_LEDGERS

    @staticmethod
    def frame(request_id: int, first_ledger_id: int = 0, max_ledgers: int = MAX_LIST_LEDGERS) -> bytes:
        """The frame of a ledger listing, from its fields."""
        return HEADER.pack(PROTOCOL_VERSION, Op.LIST_LEDGERS, 0, request_id) + _LIST_LEDGERS.pack(
            first_ledger_id, max_ledgers)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, flags: int) -> Self:
        first, most = _exact(frame, _LIST_LEDGERS, "list-ledgers request")
        if flags:
            raise ProtocolError(f"list-ledgers flags {flags} is out of range")
        if first > MAX_ID or not 0 < most <= MAX_LIST_LEDGERS:
            raise ProtocolError(f"list-ledgers request from ledger {first} for {most} ledgers is out of range "
                                f"(at most {MAX_LIST_LEDGERS})")
        return cls(request_id, first, most)


# --- the writer's ADD_BATCH framing (hot path: functions over bytes, no object per entry) --------


def add_batch_header(request_id: int, flags: int = 0) -> bytes:
    """The header of an ADD_BATCH request: with :func:`encode_add_batch_body`, a writer encodes
    the entries once and sends them to every bookie under its own request id."""
    return HEADER.pack(PROTOCOL_VERSION, Op.ADD_BATCH, flags, request_id)


def encode_add_batch_body(ledger_id: int, master_key: bytes, entries: Sequence[tuple[int, bytes]]) -> bytes:
    """Everything of an ADD_BATCH request after its header."""
    parts = [_ADD_BATCH.pack(ledger_id, len(master_key), len(entries)), master_key]
    append = parts.append
    item = _BATCH_ITEM.pack
    for eid, data in entries:
        append(item(eid, len(data)))
        append(data)
    return b"".join(parts)


def add_batch_items(digest: DigestManager, first_entry_id: int, lac: int, payloads: Sequence[bytes]) -> list[bytes]:
    """Sign ``payloads`` as consecutive entries and return each as an ADD_BATCH item (u64 entry,
    u32 length, signed entry), ready to be joined into a body by :func:`add_batch_body_of_items`.
    Signing and framing in one pass is the writer's hot loop."""
    if type(digest) is Crc32cDigest:  # the default, inlined: header, digest and item prefix in one pack
        fast = speedups.compiled
        if fast is not None:
            return fast.crc32c_batch_items(digest.ledger_id, first_entry_id, lac, payloads)
        crc = _crc32c.crc32c
        head = ENTRY_HEADER.pack
        item = _CRC_ITEM.pack
        lid = digest.ledger_id
        extra = ENTRY_HEADER.size + 4
        out: list[bytes] = []
        append = out.append
        eid = first_entry_id
        for p in payloads:
            append(item(eid, extra + len(p), lid, eid, lac, crc(p, crc(head(lid, eid, lac)))) + p)
            eid += 1
        return out
    pack = _BATCH_ITEM.pack
    return [pack(e, len(d)) + d for e, d in enumerate(digest.sign_many(first_entry_id, lac, payloads), first_entry_id)]


def batch_max_lac(ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> int | None:
    """The highest last-add-confirmed the signed ``entries`` of an ADD_BATCH carry (-1 for
    none), or None when one of them is shorter than an entry header or does not name
    ``ledger_id`` and the id it was sent under (the bookie then stores the batch entry by entry).
    Compiled in ``_speedups``."""
    fast = speedups.compiled
    if fast is not None:
        return fast.batch_max_lac(ledger_id, entries)
    unpack = ENTRY_HEADER.unpack_from
    hsize = ENTRY_HEADER.size
    max_lac = -1
    for eid, entry in entries:
        if len(entry) < hsize:
            return None
        hl, he, lac = unpack(entry)
        if hl != ledger_id or he != eid:
            return None
        if lac > max_lac:
            max_lac = lac
    return max_lac


def item_signer(digest: DigestManager) -> Callable[[int, int, bytes], bytes]:
    """A function ``(entry_id, lac, payload) -> item``: :func:`add_batch_items` of one payload
    (a writer's ``append_async``), bound to ``digest`` and to the hot path selected now."""
    fast = speedups.compiled
    if type(digest) is Crc32cDigest and fast is not None:
        return functools.partial(fast.crc32c_item, digest.ledger_id)

    def sign(entry_id: int, lac: int, payload: bytes) -> bytes:
        return add_batch_items(digest, entry_id, lac, (payload,))[0]
    return sign


def add_batch_body_of_items(ledger_id: int, master_key: bytes, items: Sequence[bytes]) -> bytes:
    """Everything of an ADD_BATCH request after its header, from :func:`add_batch_items` items."""
    return b"".join((_ADD_BATCH.pack(ledger_id, len(master_key), len(items)), master_key, *items))


# --- responses ------------------------------------------------------------------------------------


def encode_error_response(op: int, request_id: int, status: int) -> bytes:
    """A response that carries only a status (for requests that could not be decoded past the
    header). ``op`` may be an unknown opcode: it is echoed so the peer can log it."""
    return HEADER.pack(PROTOCOL_VERSION, op & 0xFF, status, request_id)


@dataclass(frozen=True, slots=True)
class AddResponse(Response):
    """The answer to an ADD."""

    op = Op.ADD
    ledger_id: int = 0
    entry_id: int = 0

    @staticmethod
    def frame(request_id: int, status: int, ledger_id: int, entry_id: int) -> bytes:
        """The frame of an add's answer, from its fields."""
        return HEADER.pack(PROTOCOL_VERSION, Op.ADD, status, request_id) + _R_ADD.pack(ledger_id, entry_id)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, status: int) -> Self:
        lid, eid = _exact(frame, _R_ADD, "add response")
        return cls(request_id, status, lid, eid)


@dataclass(frozen=True, slots=True)
class ReadResponse(Response):
    """The answer to a READ: the signed entry when OK."""

    op = Op.READ
    ledger_id: int = 0
    entry_id: int = 0
    entry: bytes = b""

    @staticmethod
    def frame(request_id: int, status: int, ledger_id: int, entry_id: int, entry: bytes = b"") -> bytes:
        """The frame of a read's answer, from its fields."""
        return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.READ, status, request_id),
                         _R_READ.pack(ledger_id, entry_id), entry))

    @classmethod
    def decode(cls, frame: bytes, request_id: int, status: int) -> Self:
        lid, eid = _fixed(frame, _R_READ, "read response")
        return cls(request_id, status, lid, eid, frame[HEADER_SIZE + _R_READ.size :])


def encode_lac_response(op: Op, request_id: int, status: int, ledger_id: int, lac: int, last_entry_id: int) -> bytes:
    """The answer to a READ_LAC or a LONG_POLL_LAC (``op``): both carry the same fields."""
    return HEADER.pack(PROTOCOL_VERSION, op, status, request_id) + _R_LAC.pack(ledger_id, lac, last_entry_id)


@dataclass(frozen=True, slots=True)
class _LacResponse(Response):
    """The fields and format READ_LAC and LONG_POLL_LAC answers share."""

    ledger_id: int = 0
    lac: int = -1
    last_entry_id: int = -1

    def encode(self) -> bytes:
        return encode_lac_response(self.op, self.request_id, self.status, self.ledger_id, self.lac, self.last_entry_id)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, status: int) -> Self:
        lid, lac, last = _exact(frame, _R_LAC, "LAC response")
        return cls(request_id, status, lid, lac, last)


@dataclass(frozen=True, slots=True)
class ReadLacResponse(_LacResponse):
    """The answer to a READ_LAC: the bookie's LAC and the last entry it stores."""

    op = Op.READ_LAC


@dataclass(frozen=True, slots=True)
class LongPollLacResponse(_LacResponse):
    """The answer to a LONG_POLL_LAC: the bookie's LAC and the last entry it stores."""

    op = Op.LONG_POLL_LAC


@dataclass(frozen=True, slots=True)
class BookieInfoResponse(Response):
    """The answer to a BOOKIE_INFO."""

    op = Op.BOOKIE_INFO
    free_bytes: int = 0
    total_bytes: int = 0
    ledgers: int = 0
    read_only: bool = False
    #: a number the bookie process drew at its start, different at each start (0: not told, an
    #: older bookie): two answers with the same instance come from one process, which therefore
    #: kept everything it acknowledged between them
    instance: int = 0

    @staticmethod
    def frame(request_id: int, status: int, free_bytes: int, total_bytes: int, ledgers: int,
              read_only: bool, instance: int = 0) -> bytes:
        """The frame of a bookie-info answer, from its fields (the instance only when not 0:
        it is given to a request with ``FLAG_INSTANCE``, and other answers keep their format)."""
        return (HEADER.pack(PROTOCOL_VERSION, Op.BOOKIE_INFO, status, request_id)
                + _R_INFO.pack(free_bytes, total_bytes, ledgers, 1 if read_only else 0)
                + (_R_INFO_INSTANCE.pack(instance) if instance else b""))

    @classmethod
    def decode(cls, frame: bytes, request_id: int, status: int) -> Self:
        if len(frame) == HEADER_SIZE + _R_INFO.size:  # not asked for, or an older bookie: no instance
            free, total, ledgers, ro = _exact(frame, _R_INFO, "bookie-info response")
            return cls(request_id, status, free, total, ledgers, bool(ro))
        if len(frame) != HEADER_SIZE + _R_INFO.size + _R_INFO_INSTANCE.size:
            raise ProtocolError(f"bookie-info response must be {HEADER_SIZE + _R_INFO.size} or "
                                f"{HEADER_SIZE + _R_INFO.size + _R_INFO_INSTANCE.size} bytes, got {len(frame)}")
        free, total, ledgers, ro = _R_INFO.unpack_from(frame, HEADER_SIZE)
        (instance,) = _R_INFO_INSTANCE.unpack_from(frame, HEADER_SIZE + _R_INFO.size)
        return cls(request_id, status, free, total, ledgers, bool(ro), instance)


@dataclass(frozen=True, slots=True)
class AddBatchResponse(Response):
    """The answer to an ADD_BATCH: ``(entry, status)`` per entry, or the compact answer
    (``all_ok``: every one of ``count`` entries is stored, no items follow)."""

    op = Op.ADD_BATCH
    ledger_id: int = 0
    items: tuple[tuple[int, int], ...] = ()
    #: how many entries the answer covers
    count: int = 0
    all_ok: bool = False

    @staticmethod
    def frame(request_id: int, status: int, ledger_id: int, items: Sequence[tuple[int, int]]) -> bytes:
        """An answer with one ``(entry, status)`` item per entry of the request."""
        return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.ADD_BATCH, status, request_id),
                         _R_BATCH.pack(ledger_id, len(items)),
                         b"".join([_R_ADD_ITEM.pack(e, st) for e, st in items])))

    @staticmethod
    def frame_all_ok(request_id: int, ledger_id: int, count: int) -> bytes:
        """The compact answer: all ``count`` entries of the request are stored (no items follow)."""
        return HEADER.pack(PROTOCOL_VERSION, Op.ADD_BATCH, Status.OK, request_id) + _R_BATCH.pack(ledger_id, count)

    def encode(self) -> bytes:
        if self.all_ok:
            return self.frame_all_ok(self.request_id, self.ledger_id, self.count)
        return self.frame(self.request_id, self.status, self.ledger_id, self.items)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, status: int) -> Self:
        lid, count = _fixed(frame, _R_BATCH, "add-batch response")
        start = HEADER_SIZE + _R_BATCH.size
        if len(frame) == start and status == Status.OK and count:  # the compact answer: all stored
            return cls(request_id, status, lid, (), count, True)
        if len(frame) != start + _R_ADD_ITEM.size * count:
            raise ProtocolError(f"add-batch response of {len(frame)} bytes does not hold {count} results")
        flat = struct.unpack_from(f">{'QH' * count}", frame, start)
        return cls(request_id, status, lid, tuple(zip(flat[::2], flat[1::2], strict=True)), count)


@dataclass(frozen=True, slots=True)
class ReadMultiResponse(Response):
    """The answer to a READ_MULTI: ``(entry, status, signed bytes)`` per entry asked for."""

    op = Op.READ_MULTI
    ledger_id: int = 0
    items: tuple[tuple[int, int, bytes], ...] = ()

    @staticmethod
    def frame(request_id: int, status: int, ledger_id: int, items: Sequence[tuple[int, int, bytes]]) -> bytes:
        """The frame of a multi-entry read's answer, from its fields."""
        parts = [HEADER.pack(PROTOCOL_VERSION, Op.READ_MULTI, status, request_id), _R_BATCH.pack(ledger_id, len(items))]
        fast = speedups.compiled
        if fast is not None:
            parts.append(fast.read_multi_section(items))
            return b"".join(parts)
        pack = _R_READ_ITEM.pack
        for e, st, data in items:
            parts.append(pack(e, st, len(data)))
            parts.append(data)
        return b"".join(parts)

    @classmethod
    def decode(cls, frame: bytes, request_id: int, status: int) -> Self:
        lid, count = _fixed(frame, _R_BATCH, "read-multi response")
        pos = HEADER_SIZE + _R_BATCH.size
        fast = speedups.compiled
        if fast is not None and type(frame) is bytes:
            items = fast.read_multi_items(frame, pos, count)
        else:
            items = read_multi_items(frame, pos, count)
        return cls(request_id, status, lid, tuple(items))


def read_multi_items(frame: bytes, pos: int, count: int) -> list[tuple[int, int, bytes]]:
    """The ``(entry id, status, signed entry)`` items of a READ_MULTI answer, which start at
    ``pos`` and must end the frame (the reader's per-entry decode; compiled in ``_speedups``)."""
    items: list[tuple[int, int, bytes]] = []
    isz = _R_READ_ITEM.size
    for _ in range(count):
        if len(frame) - pos < isz:
            raise ProtocolError(f"truncated read-multi response: {len(items)} of {count} entries")
        e, st, size = _R_READ_ITEM.unpack_from(frame, pos)
        pos += isz
        if size > len(frame) - pos:
            raise ProtocolError(f"read-multi entry {e} of {size} bytes does not fit the frame")
        items.append((e, st, frame[pos : pos + size]))
        pos += size
    if pos != len(frame):
        raise ProtocolError(f"read-multi response has {len(frame) - pos} bytes after its {count} entries")
    return items


@dataclass(frozen=True, slots=True)
class ListLedgersResponse(Response):
    """The answer to a LIST_LEDGERS: ``(ledger id, last entry id)`` items in ascending id order."""

    op = Op.LIST_LEDGERS
    items: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def frame(request_id: int, status: int, ledgers: Sequence[tuple[int, int]]) -> bytes:
        """``ledgers``: ``(ledger id, last entry id)`` pairs in ascending ledger id order."""
        return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.LIST_LEDGERS, status, request_id),
                         _U32.pack(len(ledgers)),
                         b"".join([_R_LIST_ITEM.pack(lid, last) for lid, last in ledgers])))

    @classmethod
    def decode(cls, frame: bytes, request_id: int, status: int) -> Self:
        (count,) = _fixed(frame, _U32, "list-ledgers response")
        start = HEADER_SIZE + _U32.size
        if count > MAX_LIST_LEDGERS or len(frame) != start + _R_LIST_ITEM.size * count:
            raise ProtocolError(f"list-ledgers response of {len(frame)} bytes does not hold {count} ledgers")
        flat = struct.unpack_from(f">{'Qq' * count}", frame, start)
        return cls(request_id, status, tuple(zip(flat[::2], flat[1::2], strict=True)))


# --- frames from fields (the names callers and tools use; each is its class's ``frame``) ---------

encode_add = AddRequest.frame
encode_read = ReadRequest.frame
encode_read_lac = ReadLacRequest.frame
encode_long_poll_lac = LongPollLacRequest.frame
encode_bookie_info = BookieInfoRequest.frame
encode_add_batch = AddBatchRequest.frame
encode_read_multi = ReadMultiRequest.frame
encode_list_ledgers = ListLedgersRequest.frame
encode_add_response = AddResponse.frame
encode_read_response = ReadResponse.frame
encode_bookie_info_response = BookieInfoResponse.frame
encode_add_batch_response = AddBatchResponse.frame
encode_add_batch_all_ok = AddBatchResponse.frame_all_ok
encode_read_multi_response = ReadMultiResponse.frame
encode_list_ledgers_response = ListLedgersResponse.frame


_REQUESTS = request_types()
_RESPONSES = response_types()


# --- any message ----------------------------------------------------------------------------------


def encode_request(req: Request) -> bytes:
    """Encode any request message (convenience for tests and tools; hot paths call the
    specific encoders)."""
    return req.encode()


def encode_response(resp: Response) -> bytes:
    """Encode any response message."""
    return resp.encode()


def decode_request(frame: bytes, max_frame_size: int | None = None) -> Request:
    """Decode a request frame. Raises ProtocolError (or FrameTooLargeError) on anything malformed
    or out of range, an unknown opcode included."""
    if max_frame_size is not None and len(frame) > max_frame_size:
        raise FrameTooLargeError(f"frame of {len(frame)} bytes exceeds the limit of {max_frame_size}")
    version, op, flags, rid = peek_header(frame)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this bookie speaks {PROTOCOL_VERSION})")
    cls = _REQUESTS.get(op)
    if cls is None:
        raise ProtocolError(f"unknown opcode {op}")
    return cls.decode(frame, rid, flags)


def decode_response(frame: bytes) -> Response:
    """Decode a response frame. Raises ProtocolError on anything malformed, an unknown status or
    opcode included."""
    version, op, status, rid = peek_header(frame)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version} in response")
    if status not in _STATUS_VALUES:
        raise ProtocolError(f"unknown status {status} in response to request {rid}")
    cls = _RESPONSES.get(op)
    if cls is None:
        raise ProtocolError(f"unknown opcode {op} in response")
    if len(frame) == HEADER_SIZE and status != Status.OK:  # an error answered with the header only
        return cls(rid, status)
    return cls.decode(frame, rid, status)
