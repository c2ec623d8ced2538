"""Wire format between the sqlite metadata server and its clients: pure functions over bytes
(and :func:`read_frame`, the one coroutine that takes a frame off a stream).

A frame is ``length`` (4 bytes, big-endian, counting what follows), ``version`` (1 byte,
:data:`VERSION`), then a UTF-8 JSON object. Binary values travel base64-encoded in the field
``value``. Requests carry ``id`` (a client-chosen integer) and ``op``; the answer to a request
carries the same ``id`` and either ``result`` or ``error`` (a code of :data:`ERRORS`) with
``message``. Notifications carry ``watch`` (the id the client gave the watch), ``rev``, ``type``
and ``key`` instead of ``id``. The format is documented in ``docs/metadata-sqlite.md``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from typing import Any, Final

from ledgerstore.errors import (
    BadVersionError,
    InvalidArgumentError,
    KeyExistsError,
    MetadataError,
    NoSuchKeyError,
    SessionExpiredError,
)
from ledgerstore_sqlite.auth import MetadataAuthError

__all__ = [
    "ERRORS",
    "HEADER",
    "MAX_FRAME",
    "VERSION",
    "FrameError",
    "decode_body",
    "decode_value",
    "encode",
    "encode_value",
    "error_code",
    "error_from",
    "frame_length",
    "read_frame",
]

#: the one frame version this code speaks
VERSION: Final = 1
#: ``length`` then ``version``
HEADER: Final = struct.Struct(">IB")
#: largest ``length`` accepted; a longer frame is refused and its connection closed (the stream
#: cannot be resynchronised past it)
MAX_FRAME: Final = 64 * 1024 * 1024

#: error codes on the wire, most specific first (a subclass before its base)
ERRORS: Final[dict[str, type[MetadataError]]] = {
    "key_exists": KeyExistsError,
    "bad_version": BadVersionError,
    "no_such_key": NoSuchKeyError,
    "session_expired": SessionExpiredError,
    "unauthorized": MetadataAuthError,
    "metadata": MetadataError,
}


class FrameError(MetadataError):
    """A frame that is not valid under this format (bad version, not JSON, not an object)."""


def encode(message: dict[str, Any]) -> bytes:
    """One frame holding ``message``."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) + 1 > MAX_FRAME:
        raise InvalidArgumentError(
            f"metadata request of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit; store smaller values"
        )
    return HEADER.pack(len(body) + 1, VERSION) + body


def frame_length(header: bytes) -> int:
    """Bytes that follow the 4-byte length field of ``header`` (version byte included).
    Raises :class:`FrameError` if it is 0 or above :data:`MAX_FRAME`."""
    length: int = struct.unpack(">I", header[:4])[0]
    if not 1 <= length <= MAX_FRAME:
        raise FrameError(f"frame length {length} is outside 1..{MAX_FRAME}")
    return length


def decode_body(payload: bytes) -> dict[str, Any]:
    """The message in ``payload`` (the ``length`` bytes after the length field)."""
    version = payload[0]
    if version != VERSION:
        raise FrameError(f"frame version {version} is not supported; this side speaks version {VERSION}")
    try:
        message = json.loads(payload[1:])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"frame body is not UTF-8 JSON: {exc}") from None
    if not isinstance(message, dict):
        raise FrameError(f"frame body is a JSON {type(message).__name__}, not an object")
    return message


def encode_value(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def decode_value(text: object) -> bytes:
    if not isinstance(text, str):
        raise FrameError(f"value must be a base64 string, not {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise FrameError(f"value is not valid base64: {exc}") from None


def error_code(exc: BaseException) -> str:
    """The wire code of ``exc`` (``metadata`` for anything without its own)."""
    if isinstance(exc, FrameError):
        return "protocol"
    for code, cls in ERRORS.items():
        if isinstance(exc, cls):
            return code
    if isinstance(exc, InvalidArgumentError):
        return "invalid_argument"
    return "metadata"


def error_from(code: object, message: str) -> Exception:
    """The exception a client raises for an error answer."""
    if code == "invalid_argument":
        return InvalidArgumentError(message)
    return ERRORS.get(str(code), MetadataError)(message)


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> dict[str, Any]:
    """The next message on ``reader`` (the one place the framing meets a stream).
    :class:`FrameError` for a length outside ``1..limit`` or a bad body;
    :class:`asyncio.IncompleteReadError` when the peer hangs up."""
    length = frame_length(await reader.readexactly(4))
    if length > limit:
        raise FrameError(f"frame length {length} exceeds the {limit} bytes allowed here")
    return decode_body(await reader.readexactly(length))
