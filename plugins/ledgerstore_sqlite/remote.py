"""The client side of the sqlite metadata server: one connection, one session, many watches.

A :class:`~ledgerstore_sqlite.store.SqliteMetadataStore` that finds a live server at start
delegates every primitive here. Sessions behave like ZooKeeper's: the client pings every third
of its TTL; when the connection breaks it reconnects and asks for its session back, which it gets
if the TTL has not passed (its ephemeral keys are then untouched); otherwise it gets a new
session and tells its listeners LOST then RESTORED. Requests made while disconnected fail at once
with :class:`MetadataError` instead of waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import Callable
from typing import Any

from ledgerstore.api import EventType, Notification, NotificationCallback, SessionEvent, Subscription
from ledgerstore.errors import MetadataError, SessionExpiredError
from ledgerstore_sqlite import protocol
from ledgerstore_sqlite.endpoint import Endpoint

__all__ = ["RemoteSession"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _RemoteSubscription(Subscription):
    session: RemoteSession
    wid: int
    prefix: str
    callback: NotificationCallback
    active: bool = True
    #: the revision this watch is current at: after a reconnect the server replays what
    #: changed since, so no notification is lost while the connection was down
    last_rev: int | None = None

    def cancel(self) -> None:
        """Stop callbacks at once; the server is told to drop the watch."""
        if self.active:
            self.active = False
            self.session._unwatch(self)


class RemoteSession:
    """A session with the metadata server at ``endpoint`` (its Unix socket or its TCP listener).

    ``fire`` is called with :class:`SessionEvent` values; ``request_timeout`` bounds the wait
    for one answer (a server that stopped answering is reported, not waited for forever). A ping
    unanswered while the server says nothing at all for two thirds of the TTL drops the connection
    and reconnects, as a ZooKeeper client does: a server host that went silent (no reset) is
    noticed before the session expires, while a busy one that answers other requests is not.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        ttl: float,
        fire: Callable[[SessionEvent], None],
        request_timeout: float = 30.0,
    ) -> None:
        self.endpoint = endpoint
        self.address = str(endpoint)
        self.ttl = ttl
        self.request_timeout = request_timeout
        self.session: int | None = None
        self._fire = fire
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._watches: dict[int, _RemoteSubscription] = {}
        self._writer: asyncio.StreamWriter | None = None
        #: the connection said hello and re-created the watches: requests may go out
        self._ready = False
        #: set while ``_ready``: a request made while a connection is saying hello waits for it
        self._ready_event = asyncio.Event()
        self._reader_task: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._reconnector: asyncio.Task[None] | None = None
        self._renew_lock = asyncio.Lock()
        self._lost_announced = False
        self._closed = False
        #: loop time of the last frame from the server (an answer or a notification)
        self._last_heard = 0.0

    def __repr__(self) -> str:
        return f"RemoteSession({self.address!r}, session={self.session})"

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and open a session; :class:`MetadataError` if the server cannot be reached."""
        await self._connect()
        self._pinger = asyncio.get_running_loop().create_task(self._ping_loop(), name=f"sqlite-ping {self}")

    async def close(self) -> None:
        """End the session (its ephemeral keys vanish at once) and disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in (self._pinger, self._reconnector):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._ready:
            try:
                await asyncio.wait_for(self._request("close", {}), timeout=min(5.0, self.request_timeout))
            except (TimeoutError, MetadataError) as exc:
                log.warning("sqlite metadata server %s: could not end the session cleanly (%s); "
                            "its ephemeral keys vanish after its TTL", self.address, exc)
        self._disconnect()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task

    # --- requests -------------------------------------------------------------------------------

    async def call(self, op: str, **args: Any) -> Any:
        """Send one request and return its ``result``; errors come back as the store's errors."""
        if self._closed:
            raise MetadataError(f"sqlite metadata store (server {self.address}) is closed; cannot {op}")
        if self._writer is not None and not self._ready:
            # connected, still saying hello and re-creating the watches (whose catch-up
            # notifications may already have been delivered): the request waits for it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.request_timeout):
                    await self._ready_event.wait()
        if self._writer is None or not self._ready:
            raise MetadataError(
                f"the sqlite metadata server at {self.address} is unreachable (reconnecting); "
                f"{op} was not sent - retry, or check that the metadata server runs"
            )
        return await self._request(op, args)

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        """Create ``key`` on this session; a session that expired meanwhile is replaced first
        (listeners hear LOST then RESTORED), as the direct store does."""
        sid = self.session
        try:
            return int(await self.call("put_ephemeral", key=key, value=protocol.encode_value(value)))
        except SessionExpiredError:
            await self._replace_session(sid)
            return int(await self.call("put_ephemeral", key=key, value=protocol.encode_value(value)))

    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        sub = _RemoteSubscription(self, next(self._ids), prefix, callback)
        self._watches[sub.wid] = sub
        try:
            current = int(await self.call("watch", watch=sub.wid, prefix=prefix))
            sub.last_rev = max(sub.last_rev or 0, current)
        except BaseException:
            self._watches.pop(sub.wid, None)
            raise
        return sub

    def _unwatch(self, sub: _RemoteSubscription) -> None:
        self._watches.pop(sub.wid, None)
        if self._writer is not None and not self._writer.is_closing():
            # fire and forget: the answer matches no pending request and is dropped
            self._writer.write(protocol.encode({"id": 0, "op": "unwatch", "watch": sub.wid}))

    async def _request(self, op: str, args: dict[str, Any]) -> Any:
        writer = self._writer
        if writer is None:
            raise MetadataError(f"the sqlite metadata server at {self.address} is not connected; {op} was not sent")
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            writer.write(protocol.encode({"id": rid, "op": op, **args}))
            # not asyncio.wait_for: on Python 3.11 it drops a cancellation that arrives together
            # with the answer, and a task cancelled that way runs on (a replication worker that
            # was told to stop went on forever); asyncio.timeout keeps the cancellation
            async with asyncio.timeout(self.request_timeout):
                return await fut
        except TimeoutError:
            raise MetadataError(
                f"the sqlite metadata server at {self.address} did not answer {op} within "
                f"{self.request_timeout}s; the request may or may not have been applied"
            ) from None
        finally:
            self._pending.pop(rid, None)

    # --- connection -----------------------------------------------------------------------------

    async def _connect(self) -> bool:
        """Connect and say hello, asking for the current session back; re-create the watches.
        Returns whether the session was resumed."""
        reader, writer = await self.endpoint.open()
        self._writer = writer
        self._ready = False
        self._ready_event.clear()
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop(reader, writer))
        try:
            hello = await self._request("hello", {"session": self.session, "ttl": self.ttl})
            for sub in list(self._watches.values()):
                current = await self._request("watch", {"watch": sub.wid, "prefix": sub.prefix, "after": sub.last_rev})
                sub.last_rev = max(sub.last_rev or 0, int(current))
        except BaseException:
            self._disconnect()
            raise
        self.session = int(hello["session"])
        self._ready = True
        self._ready_event.set()
        return bool(hello["resumed"])

    def _disconnect(self) -> None:
        self._ready = False
        self._ready_event.clear()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    async def _read_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = "the server closed the connection"
        loop = asyncio.get_running_loop()
        try:
            while True:
                length = protocol.frame_length(await reader.readexactly(4))
                body = await reader.readexactly(length)
                self._last_heard = loop.time()
                self._dispatch(protocol.decode_body(body))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            why = why if isinstance(exc, asyncio.IncompleteReadError) else str(exc)
        except protocol.FrameError as exc:
            why = f"bad frame from the server: {exc}"
        if self._writer is writer:
            self._disconnect()
        error = MetadataError(
            f"lost the connection to the sqlite metadata server at {self.address} ({why}); "
            "a request in flight may or may not have been applied"
        )
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(error)
        if not self._closed and (self._reconnector is None or self._reconnector.done()):
            log.warning("%s; reconnecting", error)
            self._reconnector = asyncio.get_running_loop().create_task(self._reconnect_loop())

    def _dispatch(self, message: dict[str, Any]) -> None:
        wid = message.get("watch")
        if wid is not None:
            sub = self._watches.get(wid)
            if sub is not None and sub.active:
                sub.last_rev = max(sub.last_rev or 0, int(message.get("rev", 0)))
                try:
                    sub.callback(Notification(EventType(message["type"]), message["key"]))
                except Exception:
                    log.exception("sqlite metadata store: watch callback for %s failed", sub.prefix)
            return
        fut = self._pending.get(message.get("id"))  # type: ignore[arg-type]
        if fut is None or fut.done():
            if message.get("error") == "protocol":
                log.warning("sqlite metadata server %s refused a frame: %s", self.address, message.get("message"))
            return
        if "error" in message:
            fut.set_exception(protocol.error_from(message["error"], str(message.get("message", ""))))
        else:
            fut.set_result(message.get("result"))

    async def _reconnect_loop(self) -> None:
        loop = asyncio.get_running_loop()
        lost_at = loop.time()
        delay = 0.05
        while not self._closed:
            try:
                resumed = await self._connect()
            except MetadataError:
                if not self._lost_announced and loop.time() - lost_at > self.ttl:
                    # as a ZooKeeper client does once its session timeout passes disconnected
                    self._announce(SessionEvent.LOST)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            if resumed:
                log.warning("reconnected to the sqlite metadata server at %s; session %s resumed",
                            self.address, self.session)
            else:
                log.warning("reconnected to the sqlite metadata server at %s with a new session %s: the old "
                            "one expired and its ephemeral keys were removed", self.address, self.session)
                if not self._lost_announced:
                    self._announce(SessionEvent.LOST)
                self._announce(SessionEvent.RESTORED)
            return

    async def _replace_session(self, expired: int | None) -> None:
        async with self._renew_lock:
            if self.session != expired or not self._ready:
                return  # another caller replaced it already, or the reconnect loop will
            hello = await self._request("hello", {"session": None, "ttl": self.ttl})
            self.session = int(hello["session"])
            log.warning("sqlite metadata server %s: session %s expired (this process stalled for longer than its "
                        "TTL of %ss); its ephemeral keys were removed; new session %s",
                        self.address, expired, self.ttl, self.session)
            self._announce(SessionEvent.LOST)
            self._announce(SessionEvent.RESTORED)

    async def _ping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            if not self._ready:
                continue
            sid = self.session
            writer = self._writer
            try:
                await self._ping()
            except TimeoutError:
                if writer is not None and writer is self._writer:
                    log.warning("the sqlite metadata server at %s did not answer a ping and said nothing for "
                                "%.1fs; dropping the connection to reconnect", self.address, self.ttl * 2 / 3)
                    writer.transport.abort()  # the read loop fails what is pending and reconnects
            except SessionExpiredError:
                try:
                    await self._replace_session(sid)
                except MetadataError as exc:
                    log.debug("replacing the expired session failed: %s", exc)  # the next ping retries
            except MetadataError as exc:
                log.debug("ping failed: %s", exc)  # the read loop reconnects

    async def _ping(self) -> None:
        """Ping the server; :class:`TimeoutError` once it has sent nothing at all (no answer to
        any request, no notification) for two thirds of the TTL since the ping went out."""
        loop = asyncio.get_running_loop()
        limit = self.ttl * 2 / 3
        sent = loop.time()
        ping = loop.create_task(self._request("ping", {}))
        try:
            while True:
                left = max(sent, self._last_heard) + limit - loop.time()
                if left <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait({ping}, timeout=left)
                if done:
                    ping.result()
                    return
        finally:
            ping.cancel()

    def _announce(self, event: SessionEvent) -> None:
        self._lost_announced = event is SessionEvent.LOST
        try:
            self._fire(event)
        except Exception:
            log.exception("sqlite metadata server %s: a session listener failed on %r", self.address, event)
