"""How frames travel inside ZeroMQ messages (pure functions, no IO).

A data message is one ZMQ message part holding one or more frames, each a 4-byte big-endian
length followed by that many bytes. Packing the frames of one loop iteration into few messages
matters: every ZMQ message costs a pyzmq call on each side, which dominates the cost of small
frames. A message holds at most :data:`BATCH_BYTES` unless it carries a single larger frame, so a
receiver needs ``ZMQ_MAXMSGSIZE`` of ``max(max_frame_size, BATCH_BYTES) + 4`` (see
:func:`max_message_size`) and checks each frame's length against its own limit.

Control messages have two parts, ``[b"", kind]``, and carry no frames.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from ledgerstore.errors import FrameTooLargeError, ProtocolError

__all__ = ["BATCH_BYTES", "HEADER", "max_message_size", "pack", "unpack"]

#: Frames are packed into one message until it would exceed this many bytes.
BATCH_BYTES = 64 * 1024
HEADER = struct.Struct(">I")


def max_message_size(max_frame_size: int) -> int:
    """The ``ZMQ_MAXMSGSIZE`` that admits every legitimate message and nothing much larger."""
    return max(max_frame_size, BATCH_BYTES) + HEADER.size


def pack(frames: Iterable[bytes]) -> list[tuple[bytes, int]]:
    """Messages carrying ``frames`` in order, each with the number of frames it holds."""
    messages: list[tuple[bytes, int]] = []
    parts: list[bytes] = []
    size = 0
    header = HEADER.pack
    for frame in frames:
        n = len(frame) + 4
        if parts and size + n > BATCH_BYTES:
            messages.append((b"".join(parts), len(parts) // 2))
            parts.clear()
            size = 0
        parts.append(header(len(frame)))
        parts.append(frame)
        size += n
    if parts:
        messages.append((b"".join(parts), len(parts) // 2))
    return messages


def unpack(message: bytes, max_frame_size: int, out: list[bytes]) -> None:
    """Append the frames of ``message`` to ``out``. Raises FrameTooLargeError for a frame above
    ``max_frame_size`` and ProtocolError for a truncated message (``out`` may then hold the
    frames before the bad one)."""
    end = len(message)
    pos = 0
    unpack_from = HEADER.unpack_from
    while pos < end:
        if end - pos < 4:
            raise ProtocolError(f"message ends inside a frame header ({end - pos} of 4 bytes)")
        (size,) = unpack_from(message, pos)
        if size > max_frame_size:
            raise FrameTooLargeError(f"peer sent a frame of {size} bytes; the limit is {max_frame_size}")
        pos += 4
        if pos + size > end:
            raise ProtocolError(f"message ends inside a frame ({end - pos} of {size} bytes)")
        out.append(message[pos : pos + size])
        pos += size
