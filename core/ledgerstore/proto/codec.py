"""The wire protocol: pure functions from messages to bytes and back, no IO.

Format version 1 (documented in ``docs/protocol.md``). Every frame starts with a 12-byte header::

    u8 version | u8 opcode | u16 flags (requests) or status (responses) | u64 request id

followed by an opcode-specific body; integers are big-endian. Transports carry frames; they never
look inside them. Decoding never trusts a length field: a truncated or inconsistent frame raises
:class:`~ledgerstore.errors.ProtocolError` (status ``BAD_REQUEST`` on the bookie). Every field a
request carries is range-checked as it is decoded (ledger and entry ids in ``0..2**63-1``, a known
LAC of at least -1, master keys of at most :data:`MAX_MASTER_KEY` bytes, only the flag bits the
opcode defines), so nothing out of range ever reaches a bookie's storage engine.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c as _crc32c

from ledgerstore.errors import FrameTooLargeError, ProtocolError
from ledgerstore.proto.digest import ENTRY_HEADER, DigestManager

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


#: ADD flag: a recovery add, accepted even when the ledger is fenced.
FLAG_RECOVERY_ADD = 0x1
#: READ / READ_LAC flag: fence the ledger (the request must carry the master key).
FLAG_FENCE = 0x1

_ADD = struct.Struct(">QQH")  # ledger, entry, master key length; then key, then entry bytes
_READ = struct.Struct(">QqH")  # ledger, entry, master key length; then key
_READ_LAC = struct.Struct(">QH")  # ledger, master key length; then key
_LONG_POLL = struct.Struct(">QqI")  # ledger, known lac, timeout ms
_R_ADD = struct.Struct(">QQ")
_R_READ = struct.Struct(">Qq")  # then entry bytes when OK
_R_LAC = struct.Struct(">Qqq")  # ledger, lac, last entry stored
_R_INFO = struct.Struct(">QQQB")  # free bytes, total bytes, ledgers, read-only

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

_STATUS_VALUES = frozenset(int(s) for s in Status)


# --- message types ------------------------------------------------------------------------------


class AddRequest(NamedTuple):
    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes
    entry: bytes
    flags: int = 0


class ReadRequest(NamedTuple):
    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes = b""
    flags: int = 0


class ReadLacRequest(NamedTuple):
    request_id: int
    ledger_id: int
    master_key: bytes = b""
    flags: int = 0


class LongPollLacRequest(NamedTuple):
    request_id: int
    ledger_id: int
    known_lac: int
    timeout_ms: int


class BookieInfoRequest(NamedTuple):
    request_id: int


class AddBatchRequest(NamedTuple):
    request_id: int
    ledger_id: int
    master_key: bytes
    entries: tuple[tuple[int, bytes], ...]
    flags: int = 0
    #: the encoded entry section (``count x (u64 entry, u32 length, bytes)``) as received, so a
    #: bookie can journal the batch without encoding it again; empty when built by hand
    raw_entries: bytes = b""


class ReadMultiRequest(NamedTuple):
    request_id: int
    ledger_id: int
    entry_ids: tuple[int, ...]


Request = (AddRequest | ReadRequest | ReadLacRequest | LongPollLacRequest | BookieInfoRequest | AddBatchRequest
           | ReadMultiRequest)


class Response(NamedTuple):
    """Every response: ``op`` and ``status`` always; other fields per op (zero when absent)."""

    op: Op
    status: int
    request_id: int
    ledger_id: int = 0
    entry_id: int = 0
    entry: bytes = b""
    lac: int = -1
    last_entry_id: int = -1
    free_bytes: int = 0
    total_bytes: int = 0
    ledgers: int = 0
    read_only: bool = False
    #: ADD_BATCH: ((entry, status), ...); READ_MULTI: ((entry, status, bytes), ...)
    items: tuple[tuple[int, ...] | tuple[int, int, bytes], ...] = ()
    #: ADD_BATCH: how many entries the answer covers; ``all_ok`` says every one of them was
    #: stored (the compact answer, which carries no per-entry items)
    count: int = 0
    all_ok: bool = False


# --- encoding ------------------------------------------------------------------------------------


def encode_add(request_id: int, ledger_id: int, entry_id: int, master_key: bytes, entry: bytes, flags: int = 0) -> bytes:
    return b"".join(
        (
            HEADER.pack(PROTOCOL_VERSION, Op.ADD, flags, request_id),
            _ADD.pack(ledger_id, entry_id, len(master_key)),
            master_key,
            entry,
        )
    )


def encode_read(request_id: int, ledger_id: int, entry_id: int, master_key: bytes = b"", flags: int = 0) -> bytes:
    return (
        HEADER.pack(PROTOCOL_VERSION, Op.READ, flags, request_id)
        + _READ.pack(ledger_id, entry_id, len(master_key))
        + master_key
    )


def encode_read_lac(request_id: int, ledger_id: int, master_key: bytes = b"", flags: int = 0) -> bytes:
    return (
        HEADER.pack(PROTOCOL_VERSION, Op.READ_LAC, flags, request_id)
        + _READ_LAC.pack(ledger_id, len(master_key))
        + master_key
    )


def encode_long_poll_lac(request_id: int, ledger_id: int, known_lac: int, timeout_ms: int) -> bytes:
    return HEADER.pack(PROTOCOL_VERSION, Op.LONG_POLL_LAC, 0, request_id) + _LONG_POLL.pack(
        ledger_id, known_lac, timeout_ms
    )


def encode_bookie_info(request_id: int) -> bytes:
    return HEADER.pack(PROTOCOL_VERSION, Op.BOOKIE_INFO, 0, request_id)


def encode_add_batch(request_id: int, ledger_id: int, master_key: bytes, entries: list[tuple[int, bytes]] |
                     tuple[tuple[int, bytes], ...], flags: int = 0) -> bytes:
    """Many entries of one ledger in one frame (the hot path of a pipelining writer)."""
    return add_batch_header(request_id, flags) + encode_add_batch_body(ledger_id, master_key, entries)


def add_batch_header(request_id: int, flags: int = 0) -> bytes:
    """The header of an ADD_BATCH request: with :func:`encode_add_batch_body`, a writer encodes
    the entries once and sends them to every bookie under its own request id."""
    return HEADER.pack(PROTOCOL_VERSION, Op.ADD_BATCH, flags, request_id)


def encode_add_batch_body(ledger_id: int, master_key: bytes,
                          entries: list[tuple[int, bytes]] | tuple[tuple[int, bytes], ...]) -> bytes:
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
    if digest.digest_type == "crc32c":
        crc = _crc32c.crc32c
        head = ENTRY_HEADER.pack
        item = _CRC_ITEM.pack
        lid = digest.ledger_id
        extra = ENTRY_HEADER.size + 4
        out = []
        append = out.append
        eid = first_entry_id
        for p in payloads:
            append(item(eid, extra + len(p), lid, eid, lac, crc(p, crc(head(lid, eid, lac)))) + p)
            eid += 1
        return out
    pack = _BATCH_ITEM.pack
    return [pack(e, len(d)) + d for e, d in enumerate(digest.sign_many(first_entry_id, lac, payloads), first_entry_id)]


def add_batch_body_of_items(ledger_id: int, master_key: bytes, items: Sequence[bytes]) -> bytes:
    """Everything of an ADD_BATCH request after its header, from :func:`add_batch_items` items."""
    return _ADD_BATCH.pack(ledger_id, len(master_key), len(items)) + master_key + b"".join(items)


def encode_read_multi(request_id: int, ledger_id: int, entry_ids: list[int] | tuple[int, ...]) -> bytes:
    return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.READ_MULTI, 0, request_id),
                     _READ_MULTI.pack(ledger_id, len(entry_ids)),
                     struct.pack(f">{len(entry_ids)}q", *entry_ids)))


def encode_add_batch_response(request_id: int, status: int, ledger_id: int, items: list[tuple[int, int]]) -> bytes:
    """An answer with one ``(entry, status)`` item per entry of the request."""
    return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.ADD_BATCH, status, request_id),
                     _R_BATCH.pack(ledger_id, len(items)),
                     b"".join([_R_ADD_ITEM.pack(e, st) for e, st in items])))


def encode_add_batch_all_ok(request_id: int, ledger_id: int, count: int) -> bytes:
    """The compact answer: all ``count`` entries of the request are stored (no items follow)."""
    return HEADER.pack(PROTOCOL_VERSION, Op.ADD_BATCH, Status.OK, request_id) + _R_BATCH.pack(ledger_id, count)


def encode_read_multi_response(request_id: int, status: int, ledger_id: int,
                               items: list[tuple[int, int, bytes]]) -> bytes:
    parts = [HEADER.pack(PROTOCOL_VERSION, Op.READ_MULTI, status, request_id), _R_BATCH.pack(ledger_id, len(items))]
    pack = _R_READ_ITEM.pack
    for e, st, data in items:
        parts.append(pack(e, st, len(data)))
        parts.append(data)
    return b"".join(parts)


def encode_request(req: Request) -> bytes:
    """Encode any request message (convenience for tests and tools; hot paths call the
    specific encoders)."""
    if isinstance(req, AddRequest):
        return encode_add(req.request_id, req.ledger_id, req.entry_id, req.master_key, req.entry, req.flags)
    if isinstance(req, ReadRequest):
        return encode_read(req.request_id, req.ledger_id, req.entry_id, req.master_key, req.flags)
    if isinstance(req, ReadLacRequest):
        return encode_read_lac(req.request_id, req.ledger_id, req.master_key, req.flags)
    if isinstance(req, LongPollLacRequest):
        return encode_long_poll_lac(req.request_id, req.ledger_id, req.known_lac, req.timeout_ms)
    if isinstance(req, BookieInfoRequest):
        return encode_bookie_info(req.request_id)
    if isinstance(req, AddBatchRequest):
        return encode_add_batch(req.request_id, req.ledger_id, req.master_key, req.entries, req.flags)
    if isinstance(req, ReadMultiRequest):
        return encode_read_multi(req.request_id, req.ledger_id, req.entry_ids)
    raise TypeError(f"not a request: {req!r}")


def encode_add_response(request_id: int, status: int, ledger_id: int, entry_id: int) -> bytes:
    return HEADER.pack(PROTOCOL_VERSION, Op.ADD, status, request_id) + _R_ADD.pack(ledger_id, entry_id)


def encode_read_response(request_id: int, status: int, ledger_id: int, entry_id: int, entry: bytes = b"") -> bytes:
    return b"".join(
        (HEADER.pack(PROTOCOL_VERSION, Op.READ, status, request_id), _R_READ.pack(ledger_id, entry_id), entry)
    )


def encode_lac_response(op: Op, request_id: int, status: int, ledger_id: int, lac: int, last_entry_id: int) -> bytes:
    return HEADER.pack(PROTOCOL_VERSION, op, status, request_id) + _R_LAC.pack(ledger_id, lac, last_entry_id)


def encode_bookie_info_response(
    request_id: int, status: int, free_bytes: int, total_bytes: int, ledgers: int, read_only: bool
) -> bytes:
    return HEADER.pack(PROTOCOL_VERSION, Op.BOOKIE_INFO, status, request_id) + _R_INFO.pack(
        free_bytes, total_bytes, ledgers, 1 if read_only else 0
    )


def encode_error_response(op: int, request_id: int, status: int) -> bytes:
    """A response that carries only a status (for requests that could not be decoded past the
    header). ``op`` may be an unknown opcode: it is echoed so the peer can log it."""
    return HEADER.pack(PROTOCOL_VERSION, op & 0xFF, status, request_id)


def encode_response(resp: Response) -> bytes:
    """Encode any response message."""
    op = resp.op
    if op == Op.ADD:
        return encode_add_response(resp.request_id, resp.status, resp.ledger_id, resp.entry_id)
    if op == Op.READ:
        return encode_read_response(resp.request_id, resp.status, resp.ledger_id, resp.entry_id, resp.entry)
    if op in (Op.READ_LAC, Op.LONG_POLL_LAC):
        return encode_lac_response(Op(op), resp.request_id, resp.status, resp.ledger_id, resp.lac, resp.last_entry_id)
    if op == Op.BOOKIE_INFO:
        return encode_bookie_info_response(
            resp.request_id, resp.status, resp.free_bytes, resp.total_bytes, resp.ledgers, resp.read_only
        )
    if op == Op.ADD_BATCH:
        if resp.all_ok:
            return encode_add_batch_all_ok(resp.request_id, resp.ledger_id, resp.count)
        return encode_add_batch_response(resp.request_id, resp.status, resp.ledger_id,
                                         [(int(i[0]), int(i[1])) for i in resp.items])
    if op == Op.READ_MULTI:
        return encode_read_multi_response(resp.request_id, resp.status, resp.ledger_id,
                                          [(int(i[0]), int(i[1]), bytes(i[2])) for i in resp.items])  # type: ignore[misc]
    raise TypeError(f"unknown op {op!r}")


# --- decoding ------------------------------------------------------------------------------------


def peek_header(frame: bytes) -> tuple[int, int, int, int]:
    """(version, op, flags-or-status, request id); ProtocolError if shorter than a header."""
    if len(frame) < HEADER_SIZE:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than the {HEADER_SIZE}-byte header")
    return HEADER.unpack_from(frame)


def _check(frame: bytes, need: int, what: str) -> None:
    if len(frame) < need:
        raise ProtocolError(f"truncated {what}: {len(frame)} bytes, need at least {need}")


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


def decode_request(frame: bytes, max_frame_size: int | None = None) -> Request:
    """Decode a request frame. Raises ProtocolError (or FrameTooLargeError) on anything malformed
    or out of range."""
    if max_frame_size is not None and len(frame) > max_frame_size:
        raise FrameTooLargeError(f"frame of {len(frame)} bytes exceeds the limit of {max_frame_size}")
    version, op, flags, rid = peek_header(frame)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this bookie speaks {PROTOCOL_VERSION})")
    h = HEADER_SIZE
    if op == Op.ADD:
        _check(frame, h + _ADD.size, "add request")
        lid, eid, klen = _ADD.unpack_from(frame, h)
        start = h + _ADD.size
        _check(frame, start + klen, "add request master key")
        _check_keyed("add", lid, klen, flags, _ADD_FLAGS)
        if eid > MAX_ID:
            raise _out_of_range("entry id", eid)
        return AddRequest(rid, lid, eid, frame[start : start + klen], frame[start + klen :], flags)
    if op == Op.READ:
        _check(frame, h + _READ.size, "read request")
        lid, eid, klen = _READ.unpack_from(frame, h)
        start = h + _READ.size
        if len(frame) != start + klen:
            raise ProtocolError(f"read request of {len(frame)} bytes does not match its key length {klen}")
        _check_keyed("read", lid, klen, flags, _READ_FLAGS)
        if eid < 0:
            raise _out_of_range("entry id", eid)
        return ReadRequest(rid, lid, eid, frame[start:], flags)
    if op == Op.READ_LAC:
        _check(frame, h + _READ_LAC.size, "read-LAC request")
        lid, klen = _READ_LAC.unpack_from(frame, h)
        start = h + _READ_LAC.size
        if len(frame) != start + klen:
            raise ProtocolError(f"read-LAC request of {len(frame)} bytes does not match its key length {klen}")
        _check_keyed("read-LAC", lid, klen, flags, _READ_FLAGS)
        return ReadLacRequest(rid, lid, frame[start:], flags)
    if op == Op.LONG_POLL_LAC:
        if len(frame) != h + _LONG_POLL.size:
            raise ProtocolError(f"long-poll request must be {h + _LONG_POLL.size} bytes, got {len(frame)}")
        lid, known, timeout = _LONG_POLL.unpack_from(frame, h)
        if lid > MAX_ID:
            raise _out_of_range("ledger id", lid)
        if known < -1:
            raise _out_of_range("known LAC", known)
        if flags:
            raise _out_of_range("long-poll flags", flags)
        return LongPollLacRequest(rid, lid, known, timeout)
    if op == Op.BOOKIE_INFO:
        if len(frame) != h:
            raise ProtocolError(f"bookie-info request must be {h} bytes, got {len(frame)}")
        if flags:
            raise _out_of_range("bookie-info flags", flags)
        return BookieInfoRequest(rid)
    if op == Op.ADD_BATCH:
        return _decode_add_batch(frame, rid, flags)
    if op == Op.READ_MULTI:
        _check(frame, h + _READ_MULTI.size, "read-multi request")
        lid, count = _READ_MULTI.unpack_from(frame, h)
        start = h + _READ_MULTI.size
        if count > MAX_BATCH or len(frame) != start + 8 * count:
            raise ProtocolError(f"read-multi request of {len(frame)} bytes does not hold {count} entry ids")
        if lid > MAX_ID:
            raise _out_of_range("ledger id", lid)
        if flags:
            raise _out_of_range("read-multi flags", flags)
        ids = struct.unpack_from(f">{count}q", frame, start)
        if ids and min(ids) < 0:
            raise _out_of_range("entry id", min(ids))
        return ReadMultiRequest(rid, lid, ids)
    if op == Op.LIST_LEDGERS:
        return decode_list_ledgers(frame, rid, flags)  # type: ignore[return-value]
    raise ProtocolError(f"unknown opcode {op}")


def _decode_add_batch(frame: bytes, rid: int, flags: int) -> AddBatchRequest:
    h = HEADER_SIZE
    _check(frame, h + _ADD_BATCH.size, "add-batch request")
    lid, klen, count = _ADD_BATCH.unpack_from(frame, h)
    if count > MAX_BATCH:
        raise ProtocolError(f"add-batch of {count} entries exceeds the limit of {MAX_BATCH}")
    _check_keyed("add-batch", lid, klen, flags, _ADD_FLAGS)
    pos = h + _ADD_BATCH.size
    _check(frame, pos + klen, "add-batch master key")
    key = frame[pos : pos + klen]
    pos += klen
    n = len(frame)
    unpack = _BATCH_ITEM.unpack_from
    isz = _BATCH_ITEM.size
    entries = []
    append = entries.append
    start = pos
    for _ in range(count):
        if n - pos < isz:
            raise ProtocolError(f"truncated add-batch: {len(entries)} of {count} entries")
        eid, size = unpack(frame, pos)
        pos += isz
        if size > n - pos or eid > MAX_ID:
            raise ProtocolError(f"add-batch entry {eid} of {size} bytes does not fit the frame or its id is out of range")
        append((eid, frame[pos : pos + size]))
        pos += size
    if pos != n:
        raise ProtocolError(f"add-batch frame has {n - pos} bytes after its {count} entries")
    return AddBatchRequest(rid, lid, key, tuple(entries), flags, frame[start:])


def decode_response(frame: bytes) -> Response:
    """Decode a response frame. Raises ProtocolError on anything malformed."""
    version, op, status, rid = peek_header(frame)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version} in response")
    if status not in _STATUS_VALUES:
        raise ProtocolError(f"unknown status {status} in response to request {rid}")
    h = HEADER_SIZE
    if op == Op.LIST_LEDGERS:
        return decode_list_ledgers_response(frame, status, rid)
    if op not in (1, 2, 3, 4, 5, 6, 7):
        raise ProtocolError(f"unknown opcode {op} in response")
    if len(frame) == h and status != Status.OK:
        return Response(Op(op), status, rid)
    if op == Op.ADD:
        if len(frame) != h + _R_ADD.size:
            raise ProtocolError(f"add response must be {h + _R_ADD.size} bytes, got {len(frame)}")
        lid, eid = _R_ADD.unpack_from(frame, h)
        return Response(Op.ADD, status, rid, lid, eid)
    if op == Op.READ:
        _check(frame, h + _R_READ.size, "read response")
        lid, eid = _R_READ.unpack_from(frame, h)
        return Response(Op.READ, status, rid, lid, eid, frame[h + _R_READ.size :])
    if op in (Op.READ_LAC, Op.LONG_POLL_LAC):
        if len(frame) != h + _R_LAC.size:
            raise ProtocolError(f"LAC response must be {h + _R_LAC.size} bytes, got {len(frame)}")
        lid, lac, last = _R_LAC.unpack_from(frame, h)
        return Response(Op(op), status, rid, lid, lac=lac, last_entry_id=last)
    if op == Op.ADD_BATCH:
        _check(frame, h + _R_BATCH.size, "add-batch response")
        lid, count = _R_BATCH.unpack_from(frame, h)
        start = h + _R_BATCH.size
        if len(frame) == start and status == Status.OK and count:  # the compact answer: all stored
            return Response(Op.ADD_BATCH, status, rid, lid, count=count, all_ok=True)
        if len(frame) != start + _R_ADD_ITEM.size * count:
            raise ProtocolError(f"add-batch response of {len(frame)} bytes does not hold {count} results")
        flat = struct.unpack_from(f">{'QH' * count}", frame, start)
        return Response(Op.ADD_BATCH, status, rid, lid, items=tuple(zip(flat[::2], flat[1::2], strict=True)), count=count)
    if op == Op.READ_MULTI:
        _check(frame, h + _R_BATCH.size, "read-multi response")
        lid, count = _R_BATCH.unpack_from(frame, h)
        pos = h + _R_BATCH.size
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
        return Response(Op.READ_MULTI, status, rid, lid, items=tuple(items))
    if len(frame) != h + _R_INFO.size:
        raise ProtocolError(f"bookie-info response must be {h + _R_INFO.size} bytes, got {len(frame)}")
    free, total, ledgers, ro = _R_INFO.unpack_from(frame, h)
    return Response(Op.BOOKIE_INFO, status, rid, free_bytes=free, total_bytes=total, ledgers=ledgers, read_only=bool(ro))


# --- LIST_LEDGERS: which ledgers a bookie holds -------------------------------------------------
#
# request body:  u64 first ledger id | u32 most ledgers to return
# response body: u32 count | count x (u64 ledger id, i64 last entry id stored, -1 if none)
# Ledgers come in ascending id order from the first asked for; fewer than asked for means there
# are no more, so a client pages by asking again from the last id returned + 1.

_LIST_LEDGERS = struct.Struct(">QI")
_R_LIST_ITEM = struct.Struct(">Qq")
#: most ledgers one LIST_LEDGERS answer carries (16 bytes each: 1 MiB)
MAX_LIST_LEDGERS = 65536


class ListLedgersRequest(NamedTuple):
    request_id: int
    first_ledger_id: int = 0
    max_ledgers: int = MAX_LIST_LEDGERS


def encode_list_ledgers(request_id: int, first_ledger_id: int = 0, max_ledgers: int = MAX_LIST_LEDGERS) -> bytes:
    return HEADER.pack(PROTOCOL_VERSION, Op.LIST_LEDGERS, 0, request_id) + _LIST_LEDGERS.pack(
        first_ledger_id, max_ledgers)


def encode_list_ledgers_response(request_id: int, status: int, ledgers: Sequence[tuple[int, int]]) -> bytes:
    """``ledgers``: ``(ledger id, last entry id)`` pairs in ascending ledger id order."""
    return b"".join((HEADER.pack(PROTOCOL_VERSION, Op.LIST_LEDGERS, status, request_id),
                     struct.pack(">I", len(ledgers)),
                     b"".join([_R_LIST_ITEM.pack(lid, last) for lid, last in ledgers])))


def decode_list_ledgers(frame: bytes, rid: int, flags: int = 0) -> ListLedgersRequest:
    if len(frame) != HEADER_SIZE + _LIST_LEDGERS.size:
        raise ProtocolError(f"list-ledgers request must be {HEADER_SIZE + _LIST_LEDGERS.size} bytes, got {len(frame)}")
    if flags:
        raise ProtocolError(f"list-ledgers flags {flags} is out of range")
    first, most = _LIST_LEDGERS.unpack_from(frame, HEADER_SIZE)
    if first > 0x7FFF_FFFF_FFFF_FFFF or not 0 < most <= MAX_LIST_LEDGERS:
        raise ProtocolError(f"list-ledgers request from ledger {first} for {most} ledgers is out of range "
                            f"(at most {MAX_LIST_LEDGERS})")
    return ListLedgersRequest(rid, first, most)


def decode_list_ledgers_response(frame: bytes, status: int, rid: int) -> Response:
    """``items`` of the response: ``((ledger id, last entry id), ...)``."""
    h = HEADER_SIZE
    if len(frame) == h and status != Status.OK:
        return Response(Op.LIST_LEDGERS, status, rid)
    _check(frame, h + 4, "list-ledgers response")
    (count,) = struct.unpack_from(">I", frame, h)
    if count > MAX_LIST_LEDGERS or len(frame) != h + 4 + _R_LIST_ITEM.size * count:
        raise ProtocolError(f"list-ledgers response of {len(frame)} bytes does not hold {count} ledgers")
    flat = struct.unpack_from(f">{'Qq' * count}", frame, h + 4)
    return Response(Op.LIST_LEDGERS, status, rid, items=tuple(zip(flat[::2], flat[1::2], strict=True)), count=count)
