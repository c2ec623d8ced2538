"""Per-bookie request channels: request ids, pipelining, timeouts and reconnects, done once in
core on top of any transport."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ledgerstore.api import Connection, Transport
from ledgerstore.errors import BookieUnavailableError, LedgerStoreError, ProtocolError, TimeoutError_
from ledgerstore.plugins import create_transport
from ledgerstore.proto import codec

log = logging.getLogger(__name__)

ResponseCallback = Callable[[codec.Response | None, BaseException | None], None]
Resolver = Callable[[str], Any]  # async (bookie_id) -> endpoint URI
FramesCallback = Callable[[Sequence[bytes]], None]
CloseCallback = Callable[[BaseException | None], None]
#: told of every failed request: the bookie, and the exception or the non-OK status it answered
ErrorHook = Callable[[str, BaseException | int], None]


class ConnectInterceptor(Protocol):
    """Wraps every connection a :class:`ChannelPool` opens (fault injection in tests and the
    simulation): given the bookie, the real transport and its callbacks, return the connection
    the channel will use."""

    async def connect(self, bookie_id: str, transport: Transport, endpoint: str,
                      on_frames: FramesCallback, on_close: CloseCallback) -> Connection: ...


class BookieChannel:
    """All requests to one bookie go through one connection, many in flight."""

    def __init__(self, pool: ChannelPool, bookie_id: str) -> None:
        self.pool = pool
        self.bookie_id = bookie_id
        self._loop = pool.loop
        self._conn: Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._queued: list[bytes] = []
        self._pending: dict[int, ResponseCallback] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._rids = itertools.count(1)
        self._sweeper: asyncio.TimerHandle | None = None
        self._retry_after = 0.0

    def next_rid(self) -> int:
        return next(self._rids)

    def send(self, rid: int, frame: bytes, callback: ResponseCallback, timeout: float) -> None:
        """Send ``frame`` (encoded with request id ``rid``); ``callback`` gets the response or an
        error exactly once."""
        self._track(rid, callback, timeout)
        conn = self._conn
        if conn is not None and not conn.is_closed:
            try:
                conn.send(frame)
            except LedgerStoreError as exc:
                self._fail(rid, exc)
            return
        if self._loop.time() < self._retry_after and self._connecting is None:
            self._fail(rid, BookieUnavailableError(f"bookie {self.bookie_id} is unreachable (recent connect failed)"))
            return
        self._queued.append(frame)
        if self._connecting is None:
            self._connecting = self._loop.create_task(self._connect())

    def send_parts(self, rid: int, parts: Sequence[bytes], callback: ResponseCallback, timeout: float) -> None:
        """:meth:`send` of the frame made of ``parts``: on a live connection they go to the
        transport as they are (a large ADD_BATCH is not copied once more per bookie)."""
        conn = self._conn
        if conn is None or conn.is_closed:
            self.send(rid, b"".join(parts), callback, timeout)
            return
        self._track(rid, callback, timeout)
        try:
            conn.send_parts(parts)
        except LedgerStoreError as exc:
            self._fail(rid, exc)

    def _track(self, rid: int, callback: ResponseCallback, timeout: float) -> None:
        self._pending[rid] = callback
        heapq.heappush(self._deadlines, (self._loop.time() + timeout, rid))
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(0.05, self._sweep)

    def request(self, build: Callable[[int], bytes], timeout: float) -> asyncio.Future[codec.Response]:
        """Convenience: send ``build(rid)`` and return a future of the response."""
        fut: asyncio.Future[codec.Response] = self._loop.create_future()

        def done(resp: codec.Response | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                assert resp is not None  # a request ends with its response or with an error
                fut.set_result(resp)

        def forget_if_cancelled(f: asyncio.Future[codec.Response]) -> None:
            # the caller gave up (a cancelled long poll): its answer is not awaited any more
            if f.cancelled():
                self._pending.pop(rid, None)

        rid = self.next_rid()
        fut.add_done_callback(forget_if_cancelled)
        self.send(rid, build(rid), done, timeout)
        return fut

    async def _connect(self) -> None:
        try:
            endpoint = await self.pool.resolve(self.bookie_id)
            conn = await self.pool.connect(self.bookie_id, endpoint, self._on_frames, self._on_close)
        except (LedgerStoreError, OSError) as exc:
            self._retry_after = self._loop.time() + self.pool.reconnect_backoff
            queued, self._queued = self._queued, []
            err = exc if isinstance(exc, BookieUnavailableError) else BookieUnavailableError(
                f"cannot reach bookie {self.bookie_id}: {exc}")
            log.debug("connect to %s failed: %s", self.bookie_id, exc)
            for frame in queued:
                _, _, _, rid = codec.HEADER.unpack_from(frame)
                self._fail(rid, err)
            return
        finally:
            self._connecting = None
        self._conn = conn
        queued, self._queued = self._queued, []
        for frame in queued:
            try:
                conn.send(frame)
            except LedgerStoreError as exc:
                _, _, _, rid = codec.HEADER.unpack_from(frame)
                self._fail(rid, exc)

    def _on_frames(self, frames: Sequence[bytes]) -> None:
        pending = self._pending
        for frame in frames:
            try:
                resp = codec.decode_response(frame)
            except ProtocolError as exc:
                log.warning("bookie %s sent a malformed response (%s); dropping the connection", self.bookie_id, exc)
                if self._conn is not None:
                    self._loop.create_task(self._conn.close())
                return
            cb = pending.pop(resp.request_id, None)
            if cb is not None:
                if resp.status and self.pool.on_error is not None:
                    self.pool.on_error(self.bookie_id, resp.status)
                cb(resp, None)

    def _on_close(self, exc: BaseException | None) -> None:
        self._conn = None
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        err = BookieUnavailableError(f"connection to bookie {self.bookie_id} lost" + (f": {exc}" if exc else ""))
        for cb in pending.values():
            self._count_error(err)
            cb(None, err)

    def _fail(self, rid: int, exc: BaseException) -> None:
        cb = self._pending.pop(rid, None)
        if cb is not None:
            self._count_error(exc)
            cb(None, exc)

    def _count_error(self, exc: BaseException) -> None:
        if self.pool.on_error is not None:
            self.pool.on_error(self.bookie_id, exc)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self._loop.time()
        dl = self._deadlines
        while dl and dl[0][0] <= now:
            _, rid = heapq.heappop(dl)
            if rid in self._pending:
                self._fail(rid, TimeoutError_(f"bookie {self.bookie_id} did not answer request {rid} in time"))
        if self._pending or dl:
            if not self._pending:
                dl.clear()
                return
            self._sweeper = self._loop.call_later(0.05, self._sweep)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._conn is not None:
            await self._conn.close()
        self._on_close(None)

    @property
    def in_flight(self) -> int:
        """Requests sent on this channel and not answered yet."""
        return len(self._pending)


class ChannelPool:
    """Channels to every bookie a client talks to, and the transports they use."""

    def __init__(self, resolve: Resolver, transport_options: dict[str, Any], max_frame_size: int,
                 reconnect_backoff: float = 0.5, *, transports: Sequence[Transport] = (),
                 on_error: ErrorHook | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.resolve = resolve
        self.transport_options = transport_options
        self.max_frame_size = max_frame_size
        self.reconnect_backoff = reconnect_backoff
        self._channels: dict[str, BookieChannel] = {}
        self._transports: dict[str, Transport] = {}
        for t in transports:  # plugin instances given by the caller serve the schemes they declare
            self.use_transport(t)
        #: the bookie health check's error counter (see :mod:`ledgerstore.client.health`)
        self.on_error = on_error
        #: when set, every new connection goes through it (see :class:`ConnectInterceptor`)
        self.interceptor: ConnectInterceptor | None = None

    async def connect(self, bookie_id: str, endpoint: str, on_frames: FramesCallback,
                      on_close: CloseCallback) -> Connection:
        """Open a connection to ``bookie_id`` at ``endpoint`` through its scheme's transport."""
        transport = self.transport_for(endpoint)
        if self.interceptor is not None:
            return await self.interceptor.connect(bookie_id, transport, endpoint, on_frames, on_close)
        return await transport.connect(endpoint, on_frames, on_close)

    def get(self, bookie_id: str) -> BookieChannel:
        ch = self._channels.get(bookie_id)
        if ch is None:
            ch = self._channels[bookie_id] = BookieChannel(self, bookie_id)
        return ch

    @property
    def in_flight(self) -> int:
        """Requests sent on every channel of the pool and not answered yet."""
        return sum(ch.in_flight for ch in self._channels.values())

    def use_transport(self, transport: Transport) -> None:
        """Serve the schemes ``transport`` declares with this instance instead of one built from
        the options."""
        self._transports.update(dict.fromkeys(transport.schemes, transport))

    def transport_for(self, endpoint: str) -> Transport:
        scheme = endpoint.partition("://")[0]
        t = self._transports.get(scheme)
        if t is None:
            opts = dict(self.transport_options.get(scheme, self.transport_options) if isinstance(
                self.transport_options.get(scheme), dict) else self.transport_options)
            opts = {k: v for k, v in opts.items() if not isinstance(v, dict)}
            t = self._transports[scheme] = create_transport(scheme, max_frame_size=self.max_frame_size, options=opts)
        return t

    async def close(self) -> None:
        for ch in list(self._channels.values()):
            await ch.close()
        self._channels.clear()
