"""On-disk formats of the ``entrylog`` engine: pure encoders and decoders, no IO.

``docs/storage-entrylog.md`` is the reference; this module is its implementation. Every structure
carries a magic, a format version and a CRC32C, so damage is detected instead of served.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from crc32c import crc32c

from ledgerstore.errors import BookieIOError, InvalidArgumentError
from ledgerstore.proto import speedups

try:  # compiled by scripts/setup.sh; it runs whenever core's compiled hot path does
    from ledgerstore_entrylog._records import append_run as _compiled_append_run
    from ledgerstore_entrylog._records import cut_records as _compiled_cut_records
    from ledgerstore_entrylog._records import record_heads as _compiled_record_heads
except ImportError:
    _compiled_record_heads = None  # type: ignore[assignment]
    _compiled_append_run = None  # type: ignore[assignment]
    _compiled_cut_records = None  # type: ignore[assignment]

__all__ = [
    "LOG_HEADER_SIZE",
    "RECORD_HEADER_SIZE",
    "INDEX_HEADER_SIZE",
    "MAX_MASTER_KEY",
    "FLAG_FENCED",
    "FLAG_HAS_KEY",
    "IndexHeader",
    "encode_log_header",
    "decode_log_header",
    "encode_index_header",
    "decode_index_header",
    "encode_ledger_map",
    "decode_ledger_map",
    "log_file_name",
    "parse_log_file_name",
    "index_path",
    "page_from_bytes",
    "page_to_disk",
    "record_crc",
    "record_heads",
]

# --- entry log ---------------------------------------------------------------------------------

#: ledger and entry ids are 0..2**63-1 (BookKeeper's signed longs)
MAX_ID = (1 << 63) - 1
#: an index slot holds location + 1, location = log id << 32 | offset in that log
OFFSET_MASK = 0xFFFFFFFF

LOG_MAGIC = b"LSEL"
LOG_VERSION = 1
# magic, version, reserved, log id, crc32c of the 12 bytes before it
_LOG_HEADER = struct.Struct(">4sHHII")
LOG_HEADER_SIZE = _LOG_HEADER.size  # 16

# data length, crc32c(ledger id, entry id, data), ledger id, entry id
RECORD_HEADER = struct.Struct(">IIQQ")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 24
RECORD_IDS = struct.Struct(">QQ")
RECORD_LEN_CRC = struct.Struct(">II")


def record_crc(ids: bytes | memoryview, data: bytes | bytearray | memoryview) -> int:
    """CRC32C over the packed (ledger id, entry id) followed by the entry data."""
    return crc32c(data, crc32c(ids))


def record_heads(ledger_id: int, entries: Iterable[tuple[int, Any]]) -> list[tuple[int, bytes, Any, int]]:
    """``(entry id, record header, data, record size)`` for each ``(entry id, data)`` of a batch:
    the per-entry work of the batch append, done before the engine takes its lock.
    InvalidArgumentError for an entry id outside ``0..2**63-1``. Compiled (``_records.pyx``) when
    built, unless ``ledgerstore.proto.speedups`` runs the pure-Python path."""
    if _compiled_record_heads is not None and speedups.compiled is not None:
        return _compiled_record_heads(ledger_id, entries)
    pack_ids = RECORD_IDS.pack
    pack_head = RECORD_LEN_CRC.pack
    records: list[tuple[int, bytes, Any, int]] = []
    append = records.append
    for entry_id, data in entries:
        if not 0 <= entry_id <= MAX_ID:
            raise InvalidArgumentError(f"entry ({ledger_id}, {entry_id}) is outside 0..2**63-1")
        ids = pack_ids(ledger_id, entry_id)
        n = len(data)
        append((entry_id, pack_head(n, crc32c(data, crc32c(ids))) + ids, data, RECORD_HEADER_SIZE + n))
    return records


#: ``append_run(records, i, buf, size, limit, wbs, base, spp, cur_no, slots, last) -> (i, size, last)``
AppendRun = Callable[[list[tuple[int, bytes, Any, int]], int, bytearray, int, int, int, int, int, int, "array[int]",
                      int], tuple[int, int, int]]


def append_run() -> AppendRun | None:
    """The compiled common case of the engine's batch append loop (``_records.append_run``), or
    None when the pure-Python loop runs (not built, or ``ledgerstore.proto.speedups`` says so)."""
    if _compiled_append_run is not None and speedups.compiled is not None:
        return _compiled_append_run
    return None


#: ``cut_records(raw, start, ledger_id, wanted, results) -> (bytes cut, rest)``
CutRecords = Callable[[bytes, int, int, Sequence[tuple[int, int, int]], list[Any]],
                      tuple[int, list[tuple[int, int, int, str | None]]]]


def cut_records() -> CutRecords | None:
    """The compiled loop of ``EntryLog.read_window`` (``_records.cut_records``), or None when the
    pure-Python loop runs (not built, or ``ledgerstore.proto.speedups`` says so)."""
    if _compiled_cut_records is not None and speedups.compiled is not None:
        return _compiled_cut_records
    return None


def encode_log_header(log_id: int) -> bytes:
    """The 16-byte header every entry log file starts with."""
    head = struct.pack(">4sHHI", LOG_MAGIC, LOG_VERSION, 0, log_id)
    return head + struct.pack(">I", crc32c(head))


def decode_log_header(raw: bytes, path: Path) -> int:
    """Validate an entry log header and return its log id; BookieIOError naming ``path`` if damaged."""
    if len(raw) < LOG_HEADER_SIZE:
        raise BookieIOError(f"entry log {path}: header truncated ({len(raw)} of {LOG_HEADER_SIZE} bytes)")
    magic, version, _reserved, log_id, crc = _LOG_HEADER.unpack_from(raw)
    if magic != LOG_MAGIC or crc != crc32c(raw[:12]):
        raise BookieIOError(f"entry log {path}: damaged header (bad magic or checksum)")
    if version != LOG_VERSION:
        raise BookieIOError(f"entry log {path}: format version {version}, this engine reads {LOG_VERSION}")
    return int(log_id)


def log_file_name(log_id: int) -> str:
    """``entrylog-XXXXXXXX.log`` (log id in 8 lower-case hex digits)."""
    return f"entrylog-{log_id:08x}.log"


def deleting_path(log_path: Path) -> Path:
    """Where GC renames an entry log it is deleting in steps; open deletes what it finds there."""
    return log_path.with_suffix(DELETING_SUFFIX)


#: the suffix of an entry log being deleted (:func:`deleting_path`)
DELETING_SUFFIX = ".deleting"


def parse_log_file_name(name: str) -> int | None:
    """The log id of an entry log file name, or None for any other name."""
    if not (name.startswith("entrylog-") and name.endswith(".log") and len(name) == 21):
        return None
    try:
        return int(name[9:17], 16)
    except ValueError:
        return None


# --- ledger map (written beside a finished entry log) -----------------------------------------

MAP_MAGIC = b"LSLM"
MAP_VERSION = 1
_MAP_HEAD = struct.Struct(">4sHHIQI")  # magic, version, reserved, log id, total bytes, count
_MAP_PAIR = struct.Struct(">QQ")


def encode_ledger_map(log_id: int, total_bytes: int, ledgers: dict[int, int]) -> bytes:
    """Encode the per-log ledger map: which ledgers a log holds and how many record bytes each."""
    parts = [_MAP_HEAD.pack(MAP_MAGIC, MAP_VERSION, 0, log_id, total_bytes, len(ledgers))]
    parts.extend(_MAP_PAIR.pack(lid, n) for lid, n in sorted(ledgers.items()))
    body = b"".join(parts)
    return body + struct.pack(">I", crc32c(body))


def decode_ledger_map(raw: bytes, log_id: int) -> tuple[int, dict[int, int]] | None:
    """Decode a ledger map; None when it is torn, damaged or belongs to another log (then the
    engine rebuilds the map by scanning the log, so a bad map costs time, never data)."""
    if len(raw) < _MAP_HEAD.size + 4 or crc32c(raw[:-4]) != struct.unpack(">I", raw[-4:])[0]:
        return None
    magic, version, _r, lid_of_log, total, count = _MAP_HEAD.unpack_from(raw)
    if magic != MAP_MAGIC or version != MAP_VERSION or lid_of_log != log_id:
        return None
    if len(raw) != _MAP_HEAD.size + count * _MAP_PAIR.size + 4:
        return None
    ledgers = dict(_MAP_PAIR.iter_unpack(raw[_MAP_HEAD.size : -4]))
    return int(total), ledgers


# --- index file ----------------------------------------------------------------------------------

INDEX_MAGIC = b"LSIX"
INDEX_VERSION = 1
# The header fits in one 512-byte sector so that rewriting it in place (fence, master key) is a
# single-sector write on the devices we target.
INDEX_HEADER_SIZE = 512
FLAG_FENCED = 1
FLAG_HAS_KEY = 2
_INDEX_FIXED = struct.Struct(">4sHHIQH")  # magic, version, flags, page size, ledger id, key length
MAX_MASTER_KEY = INDEX_HEADER_SIZE - _INDEX_FIXED.size - 4


class IndexHeader:
    """Decoded index file header."""

    __slots__ = ("ledger_id", "page_size", "fenced", "master_key")

    def __init__(self, ledger_id: int, page_size: int, fenced: bool, master_key: bytes | None) -> None:
        self.ledger_id = ledger_id
        self.page_size = page_size
        self.fenced = fenced
        self.master_key = master_key


def encode_index_header(ledger_id: int, page_size: int, fenced: bool, master_key: bytes | None) -> bytes:
    """The fixed 512-byte index header, zero padded, CRC32C in its last 4 bytes."""
    key = master_key or b""
    flags = (FLAG_FENCED if fenced else 0) | (FLAG_HAS_KEY if master_key is not None else 0)
    body = _INDEX_FIXED.pack(INDEX_MAGIC, INDEX_VERSION, flags, page_size, ledger_id, len(key)) + key
    body = body.ljust(INDEX_HEADER_SIZE - 4, b"\0")
    return body + struct.pack(">I", crc32c(body))


def decode_index_header(raw: bytes, path: Path) -> IndexHeader:
    """Validate and decode an index header; BookieIOError naming ``path`` when it is damaged."""
    if len(raw) < INDEX_HEADER_SIZE:
        raise BookieIOError(
            f"index file {path}: header truncated ({len(raw)} of {INDEX_HEADER_SIZE} bytes); "
            "the ledger's fenced flag and master key cannot be trusted"
        )
    body, (crc,) = raw[: INDEX_HEADER_SIZE - 4], struct.unpack_from(">I", raw, INDEX_HEADER_SIZE - 4)
    magic, version, flags, page_size, ledger_id, key_len = _INDEX_FIXED.unpack_from(body)
    if magic != INDEX_MAGIC or crc != crc32c(body):
        raise BookieIOError(
            f"index file {path}: damaged header (bad magic or checksum); restore the ledger from "
            "its replicas (auto-recovery) after removing this file"
        )
    if version != INDEX_VERSION:
        raise BookieIOError(f"index file {path}: format version {version}, this engine reads {INDEX_VERSION}")
    if key_len > MAX_MASTER_KEY:
        raise BookieIOError(f"index file {path}: master key length {key_len} exceeds {MAX_MASTER_KEY}")
    start = _INDEX_FIXED.size
    key = bytes(body[start : start + key_len]) if flags & FLAG_HAS_KEY else None
    return IndexHeader(int(ledger_id), int(page_size), bool(flags & FLAG_FENCED), key)


def index_path(current: Path, ledger_id: int) -> Path:
    """``<dir>/current/index/<low byte hex>/<ledger id, 16 hex digits>.idx``; the low byte spreads
    sequentially allocated ledger ids evenly over 256 sub-directories."""
    return current / "index" / f"{ledger_id & 0xFF:02x}" / f"{ledger_id:016x}.idx"


_BIG_ENDIAN_HOST = sys.byteorder == "big"


def page_from_bytes(raw: bytes, slots: int) -> array[int]:
    """An index page (array of ``slots`` u64 locations, little-endian on disk) from raw bytes;
    a short read (sparse or not yet written tail) reads as zeros = absent."""
    page = array("Q")
    usable = min(len(raw), slots * 8) & ~7
    page.frombytes(raw[:usable])
    if len(page) < slots:
        page.extend([0] * (slots - len(page)))
    if _BIG_ENDIAN_HOST:
        page.byteswap()
    return page


def page_to_disk(page: array[int]) -> array[int]:
    """The on-disk (little-endian) form of a page, without a copy on little-endian hosts."""
    if _BIG_ENDIAN_HOST:
        swapped = array("Q", page)
        swapped.byteswap()
        return swapped
    return page
