"""Client side of the ``zmq`` transport: one DEALER socket per connection.

``send`` only queues; once per loop iteration the queue is packed into few messages
(:mod:`.framing`) and flushed with non-blocking sends; whatever libzmq refuses (its pipe is at
SNDHWM) stays queued until the socket is writable again.
``drain`` waits while the local queue holds more than ``high_water`` bytes.

A socket monitor turns libzmq's connection events into the :class:`Connection` contract:
``connect`` returns once the ZMTP (and CURVE) handshake succeeded and raises
:class:`~ledgerstore.errors.BookieUnavailableError` if it fails; a later disconnect closes the
connection (libzmq would reconnect silently, but requests in flight would be lost without notice,
so core's reconnect logic must see it).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from ledgerstore.api import Connection
from ledgerstore.errors import BookieUnavailableError, FrameTooLargeError, ProtocolError

from .framing import BATCH_BYTES, pack, unpack
from .pump import EventPump

__all__ = ["ZmqConnection", "CONTROL_CLOSE", "CONTROL_BYE", "CONTROL_PING", "RECV_BATCH"]

#: Control messages are two-part ``[b"", kind]``; data messages are always a single part.
CONTROL_BYE = b"bye"
CONTROL_CLOSE = b"close"
CONTROL_PING = b"ping"
#: Most messages read per wake-up before handing a batch on (bounds the latency of one batch).
RECV_BATCH = 4096

_EVENT = struct.Struct("=Hi")
_CLIENT_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_CONNECT_RETRIED
)


def parse_event(parts: list[bytes]) -> tuple[int, int]:
    """``(event, value)`` of one monitor message."""
    event, value = _EVENT.unpack(parts[0])
    return event, value


def describe_failure(event: int, value: int) -> str:
    """Human words for a monitor event that ends a connection."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the server refused our credentials (CURVE authentication failed, status {value})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return "the ZMTP handshake failed (security settings differ: CURVE on one side only, or a wrong server key?)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return f"the handshake failed ({zmq.strerror(value) if value else 'no detail'})"
    if event in (zmq.EVENT_CLOSED, zmq.EVENT_CONNECT_RETRIED):
        return "nothing accepted the connection"
    return "the server closed the connection"


class ZmqConnection(Connection):
    """One DEALER socket connected to one bookie."""

    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        monitor: zmq.asyncio.Socket,
        address: str,
        max_frame_size: int,
        high_water: int,
        on_frames: Callable[[Sequence[bytes]], None],
        on_close: Callable[[BaseException | None], None],
        release: Callable[[], None],
    ) -> None:
        self.address = address
        self._sock = sock
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        self._monitor = monitor
        self._max_frame_size = max_frame_size
        self._high_water = high_water
        self._on_frames = on_frames
        self._on_close = on_close
        self._release = release
        self._loop = asyncio.get_running_loop()
        self._queue: deque[bytes] = deque()
        self._unsent: bytes | None = None  # a packed message libzmq refused (pipe at SNDHWM)
        self._queued_bytes = 0  # encoded bytes in _queue and _unsent
        self._flush_scheduled = False
        self._pump: EventPump | None = None
        self._below_high_water = asyncio.Event()
        self._below_high_water.set()
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._closed = False
        self._announce_close = False  # on_close is owed only once connect() has returned
        self._done: asyncio.Future[None] | None = None
        self._monitor_task = asyncio.ensure_future(self._watch())

    async def wait_ready(self, timeout: float) -> None:
        """Wait for the handshake; on failure release everything and raise BookieUnavailableError."""
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except (TimeoutError, BookieUnavailableError) as exc:
            await self._shutdown(None)
            if isinstance(exc, BookieUnavailableError):
                raise
            raise BookieUnavailableError(
                f"cannot connect to {self.address}: no ZMTP handshake within {timeout}s"
            ) from None
        except BaseException:
            await self._shutdown(None)
            raise
        self._announce_close = True
        self._pump = EventPump(self._sync, self._read, self._flush)

    # --- sending -------------------------------------------------------------------------------

    def send(self, frame: bytes) -> None:
        if self._closed:
            raise BookieUnavailableError(f"connection to {self.address} is closed")
        if len(frame) > self._max_frame_size:
            raise FrameTooLargeError(
                f"frame of {len(frame)} bytes exceeds the limit of {self._max_frame_size}"
            )
        self._queue.append(frame)
        self._queued_bytes += len(frame) + 4
        if self._queued_bytes > self._high_water:
            self._below_high_water.clear()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pump = self._pump
        if self._closed or pump is None:
            return
        queue, send = self._queue, self._sync.send
        pump.want_write = False
        message = self._unsent
        self._unsent = None
        try:
            while message is not None or queue:
                if message is None:
                    frames = [queue.popleft()]
                    size = len(frames[0]) + 4
                    while queue and size + len(queue[0]) + 4 <= BATCH_BYTES:
                        size += len(queue[0]) + 4
                        frames.append(queue.popleft())
                    message = pack(frames)[0][0]
                send(message, zmq.NOBLOCK)
                self._queued_bytes -= len(message)
                message = None
        except zmq.Again:
            self._unsent = message
            pump.want_write = True  # the rest goes when libzmq's pipe has room again
        except zmq.ZMQError as exc:
            self._loop.create_task(self._shutdown(BookieUnavailableError(f"send to {self.address} failed: {exc}")))
            return
        pump.schedule()  # sending may have consumed the socket's wake-up edge
        if self._queued_bytes <= self._high_water // 2:
            self._below_high_water.set()

    async def drain(self) -> None:
        if self._queued_bytes > self._high_water and not self._closed:
            await self._below_high_water.wait()

    # --- receiving -----------------------------------------------------------------------------

    def _read(self) -> None:
        recv = self._sync.recv_multipart
        frames: list[bytes] = []
        failure: BookieUnavailableError | None = None
        try:
            for _ in range(RECV_BATCH):
                parts = recv(zmq.NOBLOCK)
                if len(parts) == 1:
                    unpack(parts[0], self._max_frame_size, frames)
                elif parts[-1] == CONTROL_CLOSE:
                    failure = BookieUnavailableError(f"{self.address} closed this connection")
                    break
        except zmq.Again:
            pass
        except ProtocolError as exc:
            failure = BookieUnavailableError(f"bad message from {self.address}: {exc}")
        if frames:
            self._on_frames(frames)
        if failure is not None:
            self._loop.create_task(self._shutdown(failure))

    async def _watch(self) -> None:
        recv = zmq.Socket.shadow(self._monitor.underlying).recv_multipart
        while not self._closed:
            await self._monitor.poll(None, zmq.POLLIN)  # type: ignore[call-arg]
            try:
                while True:
                    event, value = parse_event(recv(zmq.NOBLOCK))
                    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        if not self._ready.done():
                            self._ready.set_result(None)
                        continue
                    failure = BookieUnavailableError(
                        f"connection to {self.address} failed: {describe_failure(event, value)}"
                    )
                    if not self._ready.done():
                        self._ready.set_exception(failure)
                        return
                    if event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                                 zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                        await self._shutdown(failure)
                        return
            except zmq.Again:
                pass

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        if not self._closed:
            with contextlib.suppress(zmq.ZMQError):
                self._flush()
                # Best effort: lets the server forget us at once instead of at its next peer check.
                self._sync.send_multipart([b"", CONTROL_BYE], zmq.NOBLOCK)
        await self._shutdown(None)

    async def _shutdown(self, exc: BaseException | None) -> None:
        if self._done is not None:
            await asyncio.shield(self._done)
            return
        self._done = self._loop.create_future()
        self._closed = True
        self._below_high_water.set()
        if not self._ready.done():
            self._ready.set_exception(exc or BookieUnavailableError(f"connection to {self.address} closed"))
            self._ready.exception()  # mark retrieved: nobody else may wait for it
        if self._pump is not None:
            self._pump.close()
        monitor_task = self._monitor_task
        if monitor_task is not asyncio.current_task() and not monitor_task.done():
            monitor_task.cancel()
            await asyncio.gather(monitor_task, return_exceptions=True)
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)
        self._queue.clear()
        self._unsent = None
        self._release()
        self._done.set_result(None)
        if self._announce_close:
            self._on_close(exc)

    @property
    def is_closed(self) -> bool:
        return self._closed
