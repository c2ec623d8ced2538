"""The wire protocol: pure functions from messages to bytes and back, no IO.

Format version 1 (documented in ``docs/protocol.md``). Every frame starts with a 12-byte header::

    u8 version | u8 opcode | u16 flags (requests) or status (responses) | u64 request id

followed by an opcode-specific body; integers are big-endian. Transports carry frames; they never
look inside them. Decoding never trusts a length field: a truncated or inconsistent frame raises
:class:`~ledgerstore.errors.ProtocolError` (status ``BAD_REQUEST`` on the bookie).
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from ledgerstore.errors import FrameTooLargeError, ProtocolError

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">BBHQ")
HEADER_SIZE = HEADER.size


class Op(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    LONG_POLL_LAC = 4
    BOOKIE_INFO = 5


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


Request = AddRequest | ReadRequest | ReadLacRequest | LongPollLacRequest | BookieInfoRequest


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


def decode_request(frame: bytes, max_frame_size: int | None = None) -> Request:
    """Decode a request frame. Raises ProtocolError (or FrameTooLargeError) on anything malformed."""
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
        if eid > 0x7FFF_FFFF_FFFF_FFFF:
            raise ProtocolError(f"entry id {eid} out of range")
        return AddRequest(rid, lid, eid, frame[start : start + klen], frame[start + klen :], flags)
    if op == Op.READ:
        _check(frame, h + _READ.size, "read request")
        lid, eid, klen = _READ.unpack_from(frame, h)
        start = h + _READ.size
        if len(frame) != start + klen:
            raise ProtocolError(f"read request of {len(frame)} bytes does not match its key length {klen}")
        return ReadRequest(rid, lid, eid, frame[start:], flags)
    if op == Op.READ_LAC:
        _check(frame, h + _READ_LAC.size, "read-LAC request")
        lid, klen = _READ_LAC.unpack_from(frame, h)
        start = h + _READ_LAC.size
        if len(frame) != start + klen:
            raise ProtocolError(f"read-LAC request of {len(frame)} bytes does not match its key length {klen}")
        return ReadLacRequest(rid, lid, frame[start:], flags)
    if op == Op.LONG_POLL_LAC:
        if len(frame) != h + _LONG_POLL.size:
            raise ProtocolError(f"long-poll request must be {h + _LONG_POLL.size} bytes, got {len(frame)}")
        lid, known, timeout = _LONG_POLL.unpack_from(frame, h)
        return LongPollLacRequest(rid, lid, known, timeout)
    if op == Op.BOOKIE_INFO:
        if len(frame) != h:
            raise ProtocolError(f"bookie-info request must be {h} bytes, got {len(frame)}")
        return BookieInfoRequest(rid)
    raise ProtocolError(f"unknown opcode {op}")


def decode_response(frame: bytes) -> Response:
    """Decode a response frame. Raises ProtocolError on anything malformed."""
    version, op, status, rid = peek_header(frame)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version} in response")
    if status not in _STATUS_VALUES:
        raise ProtocolError(f"unknown status {status} in response to request {rid}")
    h = HEADER_SIZE
    if op not in (1, 2, 3, 4, 5):
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
    if len(frame) != h + _R_INFO.size:
        raise ProtocolError(f"bookie-info response must be {h + _R_INFO.size} bytes, got {len(frame)}")
    free, total, ledgers, ro = _R_INFO.unpack_from(frame, h)
    return Response(Op.BOOKIE_INFO, status, rid, free_bytes=free, total_bytes=total, ledgers=ledgers, read_only=bool(ro))
