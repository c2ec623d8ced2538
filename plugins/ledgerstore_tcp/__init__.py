"""``tcp`` transport: asyncio sockets with length-prefixed frames.

Wire framing: every frame is a 4-byte big-endian length followed by that many bytes. The length is
checked against ``max_frame_size`` before any buffer is allocated for the frame; a peer that
announces a larger frame is disconnected (and counted), other peers are unaffected.

Frames queued in one event-loop iteration leave in one ``write`` call: a few large frames (a
writer's ADD_BATCH, sent as its header and the body shared by every bookie) as one vectored write
of the parts as they are, many small ones (answers) joined first. Incoming bytes are read by the
kernel straight into the connection's :class:`FrameDecoder` (a buffered protocol), so each frame
is copied once in user space. A peer that reads slower than the bookie answers makes the bookie
stop reading that peer's requests (the socket's write buffer above ``high_water``) rather than
buffer without bound.

The bounds below are the bookie's settings, given to :meth:`TcpTransport.serve` as one
:class:`~ledgerstore.api.ServerLimits` value (they are not transport options).

Unfinished frames are bounded too. A connection buffers at most one unfinished frame, and only the
bytes that arrived (never the announced length), so at most ``max_frame_size`` + 4 bytes. Across
all connections the server keeps at most ``max_unfinished_frame_bytes``: past it, the connection
whose unfinished frame is the oldest is closed (``shed_unfinished_frames``), so peers that stall
on half a frame are shed before a writer whose frames are merely arriving. A connection whose
unfinished frame is older than ``unfinished_frame_timeout_s`` is closed
(``unfinished_frame_timeouts``). Both are counted in ``Server.stats()`` and logged.

Connections themselves are bounded. An accepted connection costs no read buffer until it sends
(see :class:`FrameDecoder`); past ``max_connections`` open at once a new one is closed as soon as
it is accepted (``refused_connections``), and a connection that neither sent nor received a byte
for ``idle_connection_timeout_s`` is closed (``idle_connections_closed``). Every log line about a
shed or refused peer is rate-limited (the first, then one per thousand, with the count so far), so
a flood of bad peers cannot flood the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, cast

from ledgerstore.api import (
    MAX_DURATION_S,
    Connection,
    FrameHandler,
    Server,
    ServerLimits,
    Transport,
    option,
    split_address,
)
from ledgerstore.errors import BookieUnavailableError, FrameTooLargeError

__all__ = ["TcpTransport", "TcpServer", "FrameDecoder"]

log = logging.getLogger(__name__)
_LEN = struct.Struct(">I")
DEFAULT_HIGH_WATER = 8 * 1024 * 1024
#: log the first occurrence of a peer-caused event, then one in this many (with the count)
_LOG_EVERY = 1000
#: a flush of at most this many pieces (length prefixes and frames) is one vectored write of them
#: as they are; more, and they are joined first (small answers, where a copy is cheaper)
_WRITEV_PARTS = 32


class FrameDecoder:
    """Incremental length-prefixed frame parser (pure, no IO).

    Bytes arrive one of two ways. A buffered protocol has the kernel read straight into this
    decoder's buffer: :meth:`get_buffer`, then :meth:`buffer_updated` with the count read, which
    returns the frames completed. :meth:`feed` takes bytes that were read elsewhere. Either way each
    frame is copied once, out of the buffer into its own ``bytes``.

    The buffer costs nothing until the first bytes arrive; it then starts at ``initial`` bytes
    and grows with what arrives: doubling, up to ``chunk``, after each read that filled it (a
    peer streaming small frames), and past ``chunk`` only for a frame larger than that, doubling
    as the frame's bytes arrive (never past the frame, so never past ``max_frame_size`` + 4). It
    shrinks back to ``initial`` once a read finds it mostly empty and ends with a small frame, or
    the connection closes: a quiet connection holds ``initial`` bytes at most, whatever it once
    received; one whose last frame was large keeps room for the next (at most twice that frame).
    Completed frames free their room at once; an unfinished frame that cannot end where it begins
    is moved to the front as soon as its length prefix is read, while little of it has arrived."""

    __slots__ = ("_buf", "_view", "_start", "_end", "_initial", "_chunk", "_filled", "max_frame_size")

    def __init__(self, max_frame_size: int, chunk: int = 256 * 1024, initial: int = 512) -> None:
        self.max_frame_size = max_frame_size
        self._chunk = chunk
        self._initial = min(initial, chunk)
        self._buf = bytearray()  # allocated by the first get_buffer: a silent peer costs nothing
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        #: the last read filled the buffer: the peer sends more than it holds
        self._filled = False

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes go (``asyncio.BufferedProtocol.get_buffer``)."""
        size = len(self._buf)
        if not size:
            self._replace(self._initial)
            size = self._initial
        elif self._filled and size < self._chunk:
            self._replace(min(2 * size, self._chunk))
            size = len(self._buf)
        self._filled = False
        start, end = self._start, self._end
        held = end - start
        if held >= 4:
            total = _LEN.unpack_from(self._buf, start)[0] + 4
            if start and start + total > size:
                # the unfinished frame cannot end where it begins: to the front now, while little
                # of it has arrived (a copy: the slices of one bytearray may overlap)
                self._buf[:held] = bytes(self._view[start:end])
                self._start, self._end = 0, held
            elif total > size and end == size:
                # a frame larger than the buffer: room doubles as its bytes arrive, up to its size
                self._replace(min(total, 2 * size))
        elif size - end < min(4096, size // 2):
            self._buf[:held] = bytes(self._view[start:end])
            self._start, self._end = 0, held
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> list[bytes]:
        """``nbytes`` were written into the last :meth:`get_buffer`; return every complete frame.
        Raises FrameTooLargeError on an oversized length prefix (the stream cannot be
        resynchronised after that)."""
        self._end += nbytes
        self._filled = self._end == len(self._buf)
        return self._frames(nbytes)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes read elsewhere; return every complete frame (see :meth:`buffer_updated`)."""
        frames: list[bytes] = []
        view = memoryview(data)
        pos, n = 0, len(data)
        while pos < n:
            room = self.get_buffer()
            take = min(len(room), n - pos)
            room[:take] = view[pos:pos + take]
            pos += take
            frames += self.buffer_updated(take)
        return frames

    def _frames(self, nbytes: int) -> list[bytes]:
        buf, view = self._buf, self._view
        pos, n = self._start, self._end
        limit = self.max_frame_size
        unpack = _LEN.unpack_from
        frames: list[bytes] = []
        size = 0
        while n - pos >= 4:
            (size,) = unpack(buf, pos)
            if size > limit:
                raise FrameTooLargeError(f"peer announced a frame of {size} bytes; the limit is {limit}")
            end = pos + 4 + size
            if end > n:
                break
            frames.append(bytes(view[pos + 4:end]))
            pos = end
        if pos == n:  # nothing unfinished: the whole buffer is free again
            self._start = self._end = 0
            capacity = len(buf)
            if capacity > self._initial and 4 * nbytes < capacity and 4 * (size + 4) < capacity:
                # the peer is quiet again (this read used little of the room, and its last frame
                # was small): give it back. The tail of a large frame is a small read too, but
                # the next frame of a writer's pipeline is as large: the room stays for it rather
                # than grow again from the initial size, a dozen small reads and copies later
                self._replace(self._initial)
            elif capacity > self._chunk and size + 4 <= self._chunk:
                # the peer is back to small frames: give the large ones' room back
                self._replace(self._chunk)
        else:
            self._start = pos
        return frames

    def _replace(self, size: int) -> None:
        held = self._end - self._start
        buf = bytearray(size)
        buf[:held] = self._view[self._start:self._end]
        self._buf, self._view = buf, memoryview(buf)
        self._start, self._end = 0, held

    @property
    def buffered(self) -> int:
        """Bytes of the unfinished frame held."""
        return self._end - self._start

    def clear(self) -> None:
        """Forget the unfinished frame and give the buffer back (the connection is being closed)."""
        self._start = self._end = 0
        self._filled = False
        self._buf = bytearray()
        self._view = memoryview(self._buf)

    @property
    def capacity(self) -> int:
        """Bytes of buffer held now (tests and statistics)."""
        return len(self._buf)


class _Writer:
    """Coalesces frames queued in one loop iteration into a single socket write."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_frame_size: int) -> None:
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False
        self.transport: asyncio.Transport | None = None
        self.max_frame_size = max_frame_size

    def queue(self, frame: bytes) -> None:
        self._pending.append(_LEN.pack(len(frame)))
        self._pending.append(frame)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def queue_parts(self, parts: Sequence[bytes], size: int) -> None:
        """Queue one frame of ``size`` bytes made of ``parts``, without joining them."""
        self._pending.append(_LEN.pack(size))
        self._pending.extend(parts)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if pending and self.transport is not None and not self.transport.is_closing():
            self._pending = []
            if len(pending) <= _WRITEV_PARTS:
                self.transport.writelines(pending)  # one vectored write, no copy of the parts
            else:  # many small frames (answers): one copy is cheaper than as many iovecs
                self.transport.write(b"".join(pending))
        else:
            pending.clear()


class _ClientProtocol(asyncio.BufferedProtocol):
    def __init__(
        self,
        max_frame_size: int,
        on_frames: Callable[[Sequence[bytes]], None],
        on_close: Callable[[BaseException | None], None],
    ) -> None:
        self.decoder = FrameDecoder(max_frame_size)
        self.on_frames = on_frames
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._closed = False
        self.closed_event = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.decoder.buffer_updated(nbytes)
        except FrameTooLargeError as exc:
            log.warning("closing connection: %s", exc)
            assert self.transport is not None
            self.transport.abort()
            self._finish(exc)
            return
        if frames:
            self.on_frames(frames)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if not self._closed:
            self._closed = True
            self.closed_event.set()
            self.on_close(exc)


class TcpConnection(Connection):
    def __init__(self, protocol: _ClientProtocol, writer: _Writer, address: str) -> None:
        self._protocol = protocol
        self._writer = writer
        self.address = address

    def send(self, frame: bytes) -> None:
        self._check(len(frame))
        self._writer.queue(frame)

    def send_parts(self, parts: Sequence[bytes]) -> None:
        size = sum(map(len, parts))
        self._check(size)
        self._writer.queue_parts(parts, size)

    def _check(self, size: int) -> None:
        if self._protocol._closed:
            raise BookieUnavailableError(f"connection to {self.address} is closed")
        if size > self._writer.max_frame_size:
            raise FrameTooLargeError(f"frame of {size} bytes exceeds the limit of {self._writer.max_frame_size}")

    async def drain(self) -> None:
        await self._protocol._can_write.wait()

    async def close(self) -> None:
        if self._protocol.transport is not None and not self._protocol._closed:
            self._writer.flush()
            self._protocol.transport.close()
            await self._protocol.closed_event.wait()

    @property
    def is_closed(self) -> bool:
        return self._protocol._closed


class _ServerConn(asyncio.BufferedProtocol):
    """One accepted peer; is also the ``ServerConnection`` handed to the bookie."""

    def __init__(self, server: TcpServer) -> None:
        self.server = server
        self.decoder = FrameDecoder(server.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.writer = _Writer(server.loop, server.max_frame_size)
        self.peer = "?"
        self._lost = False
        #: closed on accept (over max_connections): the handler never hears of it
        self._refused = False
        #: a byte was received or sent since the last idle sweep
        self.active = True
        #: loop time of the idle sweep that first found it inactive
        self.quiet_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport, though uvloop's are not asyncio.Transport subclasses: typed as one
        stream = cast(asyncio.Transport, transport)
        self.transport = stream
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if len(self.server.conns) >= self.server.max_connections:
            self._refused = True
            self.server.refuse(self)
            stream.abort()
            return
        self.writer.transport = stream
        stream.set_write_buffer_limits(high=self.server.high_water)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server.conns.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.active = True
        decoder = self.decoder
        before = decoder.buffered
        try:
            frames = decoder.buffer_updated(nbytes)
        except FrameTooLargeError as exc:
            n = self.server.counters["oversized_frames"] = self.server.counters["oversized_frames"] + 1
            if n % _LOG_EVERY == 1:
                log.warning("peer %s: %s; disconnecting it (%d oversized frames so far)", self.peer, exc, n)
            self.close()
            return
        after = decoder.buffered
        if before or after:  # frames that arrive whole (the usual case) cost nothing here
            self.server.unfinished_changed(self, after - before, after == 0, before == 0 or bool(frames))
        if frames:
            try:
                self.server.handler.frames_received(self, frames)
            except Exception:  # a handler bug must not take the server down
                self.server.counters["handler_errors"] += 1
                log.exception("request handler failed for peer %s; disconnecting it", self.peer)
                self.close()

    def send(self, frame: bytes) -> None:
        if self._lost:
            return
        self.active = True
        try:
            self.writer.queue(frame)
        except FrameTooLargeError:
            log.error("response of %d bytes exceeds the frame limit; closing %s", len(frame), self.peer)
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # A slow reader: stop reading its requests until it has taken our answers.
    def pause_writing(self) -> None:
        if self.transport is not None:
            self.server.counters["paused_slow_readers"] += 1
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def drop_unfinished(self) -> int:
        """Forget this connection's unfinished frame; returns its size."""
        n = self.decoder.buffered
        self.decoder.clear()
        return n

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self.server.conns.discard(self)
        self.server.forget_unfinished(self)
        self.decoder.clear()
        if self._refused:
            return
        try:
            self.server.handler.connection_lost(self)
        except Exception:
            log.exception("connection_lost handler failed")


class TcpServer(Server):
    def __init__(self, loop: asyncio.AbstractEventLoop, handler: FrameHandler, max_frame_size: int,
                 high_water: int, scheme: str, limits: ServerLimits) -> None:
        self.loop = loop
        self.handler = handler
        self.max_frame_size = max_frame_size
        self.high_water = high_water
        self.scheme = scheme
        self.conns: set[_ServerConn] = set()
        self.counters = {"oversized_frames": 0, "handler_errors": 0, "paused_slow_readers": 0,
                         "shed_unfinished_frames": 0, "unfinished_frame_timeouts": 0,
                         "refused_connections": 0, "idle_connections_closed": 0}
        self._server: asyncio.AbstractServer | None = None
        self._address = ""
        #: the bookie's limits on its peers (see the module docstring)
        self.max_unfinished_frame_bytes = limits.max_unfinished_frame_bytes
        self.unfinished_frame_timeout_s = limits.unfinished_frame_timeout_s
        #: bytes of unfinished frames buffered across all connections
        self.unfinished_bytes = 0
        #: connections holding an unfinished frame → when that frame began, oldest first
        self._unfinished: OrderedDict[_ServerConn, float] = OrderedDict()
        self._sweep: asyncio.TimerHandle | None = None
        self.max_connections = limits.max_connections
        self.idle_connection_timeout_s = limits.idle_connection_timeout_s
        self._idle_sweep: asyncio.TimerHandle | None = None

    # --- connection bounds ------------------------------------------------------------------------

    def refuse(self, conn: _ServerConn) -> None:
        """``conn`` was accepted past ``max_connections``: count and (rate-limited) log it."""
        n = self.counters["refused_connections"] = self.counters["refused_connections"] + 1
        if n % _LOG_EVERY == 1:
            log.warning("refused connection from %s: %d connections are open, max_connections is %d "
                        "(%d refused so far)", conn.peer, len(self.conns), self.max_connections, n)

    def start_idle_sweeps(self) -> None:
        """Close idle connections from now on (called once listening)."""
        self._idle_sweep = self.loop.call_later(self.idle_connection_timeout_s / 2, self._close_idle)

    def _close_idle(self) -> None:
        """Close connections that neither sent nor received a byte for the idle timeout: each
        sweep (every half timeout) marks the connections that were quiet since the last one and
        closes those a whole timeout after they were marked, so one goes between 1 and 1.5
        timeouts after its last byte."""
        now = self.loop.time()
        limit = self.idle_connection_timeout_s
        for conn in list(self.conns):
            if conn.active:
                conn.active = False
                conn.quiet_since = now
            elif now - conn.quiet_since >= limit - 1e-6:
                n = self.counters["idle_connections_closed"] = self.counters["idle_connections_closed"] + 1
                if n % _LOG_EVERY == 1:
                    log.warning("closed connection from %s: nothing sent or received for %.0fs "
                                "(idle_connection_timeout_s); %d idle connections closed so far", conn.peer, limit, n)
                conn.close()
        if self._server is not None:
            self.start_idle_sweeps()

    # --- unfinished frames ------------------------------------------------------------------------

    def unfinished_changed(self, conn: _ServerConn, delta: int, done: bool, new_frame: bool) -> None:
        """``conn``'s unfinished frame grew by ``delta`` bytes (negative: frames completed); ``done``
        when it holds none now, ``new_frame`` when what it holds is a frame begun in this read."""
        self.unfinished_bytes += delta
        pending = self._unfinished
        if done:
            pending.pop(conn, None)
            return
        if new_frame or conn not in pending:
            pending[conn] = self.loop.time()
            pending.move_to_end(conn)
            if self._sweep is None:
                self._schedule_sweep()
        if self.unfinished_bytes > self.max_unfinished_frame_bytes:
            self._shed()

    def forget_unfinished(self, conn: _ServerConn) -> None:
        if self._unfinished.pop(conn, None) is not None:
            self.unfinished_bytes -= conn.drop_unfinished()

    def _close_unfinished(self, conn: _ServerConn) -> int:
        del self._unfinished[conn]
        n = conn.drop_unfinished()
        self.unfinished_bytes -= n
        conn.close()
        return n

    def _shed(self) -> None:
        """Close the connections stalled longest on an unfinished frame until the bound holds."""
        now = self.loop.time()
        while self.unfinished_bytes > self.max_unfinished_frame_bytes and self._unfinished:
            conn, since = next(iter(self._unfinished.items()))
            n = self._close_unfinished(conn)
            shed = self.counters["shed_unfinished_frames"] = self.counters["shed_unfinished_frames"] + 1
            if shed % _LOG_EVERY == 1:
                log.warning("closed peer %s holding %d bytes of a frame begun %.1fs ago: unfinished frames across "
                            "connections passed max_unfinished_frame_bytes (%d); %d connections shed so far",
                            conn.peer, n, now - since, self.max_unfinished_frame_bytes, shed)

    def _schedule_sweep(self) -> None:
        self._sweep = self.loop.call_later(min(1.0, self.unfinished_frame_timeout_s / 4), self._expire_unfinished)

    def _expire_unfinished(self) -> None:
        """Close connections whose unfinished frame is older than the timeout (the oldest first)."""
        self._sweep = None
        deadline = self.loop.time() - self.unfinished_frame_timeout_s
        pending = self._unfinished
        while pending:
            conn, since = next(iter(pending.items()))
            if since > deadline:
                break
            n = self._close_unfinished(conn)
            expired = self.counters["unfinished_frame_timeouts"] = self.counters["unfinished_frame_timeouts"] + 1
            if expired % _LOG_EVERY == 1:
                log.warning("closed peer %s: it held %d bytes of an unfinished frame for more than %.1fs "
                            "(unfinished_frame_timeout_s); %d such connections so far",
                            conn.peer, n, self.unfinished_frame_timeout_s, expired)
        if pending and self._server is not None:
            self._schedule_sweep()

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        if self._server is None:
            return
        srv, self._server = self._server, None
        for handle in (self._sweep, self._idle_sweep):
            if handle is not None:
                handle.cancel()
        self._sweep = self._idle_sweep = None
        srv.close()
        for c in list(self.conns):
            c.close()
        await srv.wait_closed()

    def stats(self) -> dict[str, int]:
        return dict(self.counters, connections=len(self.conns), unfinished_frame_bytes=self.unfinished_bytes,
                    unfinished_frames=len(self._unfinished))


class TcpTransport(Transport):
    """Plain TCP. Options (:class:`Options`): ``high_water`` (bytes of unsent answers per peer
    before the bookie stops reading that peer) and ``connect_timeout`` (seconds). A server
    enforces the bookie's :class:`~ledgerstore.api.ServerLimits` given to :meth:`serve`: all four
    (see the module docstring)."""

    schemes = ("tcp",)

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``[transport]`` table of a ``tcp://`` bookie, or a client's ``[transport.tcp]``."""

        high_water: int = option(DEFAULT_HIGH_WATER, "bytes of unsent frames per connection before "
                                 "the sender waits (the bookie stops reading that peer)", minimum=1)
        connect_timeout: float = option(5.0, "seconds a client waits to connect", minimum=0.001, maximum=MAX_DURATION_S)

    options: TcpTransport.Options

    def _ssl_server(self) -> Any:
        return None

    def _ssl_client(self) -> Any:
        return None

    def _server_hostname(self, host: str) -> str | None:
        """The name a TLS client checks in the bookie's certificate (None: no TLS)."""
        return None

    async def connect(
        self,
        address: str,
        on_frames: Callable[[Sequence[bytes]], None],
        on_close: Callable[[BaseException | None], None],
    ) -> Connection:
        _, host, port = split_address(address)
        loop = asyncio.get_running_loop()
        proto = _ClientProtocol(self.max_frame_size, on_frames, on_close)
        ssl_ctx = self._ssl_client()
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(
                    lambda: proto, host, port, ssl=ssl_ctx,
                    server_hostname=self._server_hostname(host) if ssl_ctx else None,
                ),
                self.options.connect_timeout,
            )
        except (TimeoutError, OSError) as exc:
            raise BookieUnavailableError(f"cannot connect to {address}: {exc or 'timed out'}") from exc
        writer = _Writer(loop, self.max_frame_size)
        writer.transport = transport
        return TcpConnection(proto, writer, address)

    async def serve(self, address: str, handler: FrameHandler, limits: ServerLimits = ServerLimits()) -> Server:
        scheme, host, port = split_address(address)
        loop = asyncio.get_running_loop()
        server = TcpServer(loop, handler, self.max_frame_size, self.options.high_water, scheme, limits)
        server._server = await loop.create_server(
            lambda: _ServerConn(server), host, port, reuse_address=True, ssl=self._ssl_server(), backlog=1024
        )
        server.start_idle_sweeps()
        sock_port = server._server.sockets[0].getsockname()[1]
        server._address = f"{scheme}://{host}:{sock_port}"
        return server
