"""The sqlite metadata server: one process owns the database file and serves the MetadataStore
primitives to every other process over a Unix domain socket and, when asked, a TCP listener for
processes on other hosts.

Why: with direct file access every process takes sqlite's write lock itself, so one process
paused inside a write transaction (SIGSTOP, a debugger) blocks every other writer of the machine
until it resumes. Behind the server no client ever holds the lock: a paused client only stops
sending, and its session expires after its TTL like a ZooKeeper session.

Discovery: the server holds an exclusive ``flock`` on ``<db>.lock`` for its whole life and writes
its socket's path into that file. A client that can take a shared lock on it knows no server runs
(a socket file left by a killed server is stale, not live); one that cannot reads the socket path.
TCP: every connection proves the shared secret before its first request
(:mod:`ledgerstore_sqlite.auth`). A connection that has not done so within ``auth_timeout`` is
closed, and at most ``max_unauthenticated`` of them are kept at once (more are closed on accept),
so idle or hostile peers cannot make the server hold unbounded memory. A refused peer is logged
by address, never with what it sent. See ``docs/metadata-sqlite.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import ssl
from typing import Any

from ledgerstore.api import Notification, Subscription
from ledgerstore.errors import ConfigError, LedgerStoreError, SessionExpiredError
from ledgerstore_sqlite import auth, protocol
from ledgerstore_sqlite.discovery import format_address, is_wildcard, lock_path, socket_path_for, take_lock
from ledgerstore_sqlite.endpoint import AUTH_FRAME_LIMIT
from ledgerstore_sqlite.leases import SessionLeases
from ledgerstore_sqlite.store import SqliteMetadataStore, engine_store

__all__ = ["MetadataServer", "serve"]

log = logging.getLogger(__name__)

#: a client's write buffer past this many bytes (it stopped reading notifications) ends its
#: connection, so a paused client cannot make the server hold unbounded memory
_MAX_BUFFERED = 32 * 1024 * 1024
#: default seconds a TCP peer has to authenticate: a handshake is two frames, one round trip
AUTH_TIMEOUT_S = 5.0
#: default TCP connections kept while they authenticate; each holds at most a 4 KiB frame
MAX_UNAUTHENTICATED = 64
#: requests of one connection read ahead of the one being answered; past this the server stops
#: reading from it until it catches up (its session lives on: every answer renews it)
_MAX_QUEUED = 4096


class MetadataServer:
    """Serves the sqlite database at ``db_path`` on a Unix socket until :meth:`close`.

    ``reap_interval``: seconds between sweeps that end expired client sessions (and delete
    their ephemeral keys); a session is gone at most this long after its TTL.

    ``listen``: also serve TCP on ``(host, port)`` (port 0: a free one, see :attr:`tcp_address`),
    every connection authenticated with ``secret`` (required with ``listen``). A wildcard host
    (``0.0.0.0``, ``::``) is refused unless ``listen_any``. ``auth_timeout`` and
    ``max_unauthenticated`` bound the connections that have not authenticated yet. ``tls``: serve
    TCP inside TLS with this context (a TLS handshake must also end within ``auth_timeout``).
    """

    def __init__(
        self,
        db_path: str,
        *,
        reap_interval: float = 0.25,
        synchronous: str = "full",
        busy_timeout: float = 30.0,
        listen: tuple[str, int] | None = None,
        secret: bytes | None = None,
        listen_any: bool = False,
        auth_timeout: float = AUTH_TIMEOUT_S,
        max_unauthenticated: int = MAX_UNAUTHENTICATED,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if listen is not None:
            if secret is None:
                raise ConfigError("a TCP listener needs a secret_file: nothing is served over TCP without credentials")
            if is_wildcard(listen[0]) and not listen_any:
                raise ConfigError(
                    f"listen address {format_address(*listen)} binds every interface; name the address "
                    "clients reach, or pass --listen-any to mean it"
                )
        self.db_path = os.path.abspath(db_path)
        self.socket_path = socket_path_for(self.db_path)
        self.engine = engine_store(
            self.db_path, reap_interval=reap_interval, synchronous=synchronous, busy_timeout=busy_timeout
        )
        self.engine.leases = SessionLeases()
        self._lock_fd: int | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()
        self.listen = listen
        self._secret = secret
        self.auth_timeout = auth_timeout
        self.max_unauthenticated = max_unauthenticated
        self._tcp: asyncio.Server | None = None
        self.tls = tls
        #: TCP connections still authenticating
        self._authenticating: set[asyncio.StreamWriter] = set()
        #: ``(host, port)`` the TCP listener is bound to, once started
        self.tcp_address: tuple[str, int] | None = None

    async def start(self) -> None:
        """Take the lock, open the database and listen. :class:`MetadataError` if another
        server already serves this database."""
        os.makedirs(os.path.dirname(self.db_path), exist_ok=True)
        self._lock_fd = take_lock(lock_path(self.db_path))
        try:
            await self.engine.start()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)  # left by a killed server: the lock says it is stale
            self._server = await asyncio.start_unix_server(self._accept, path=self.socket_path)
            os.chmod(self.socket_path, 0o600)
            if self.listen is not None:
                self._tcp = await asyncio.start_server(
                    self._accept_tcp, *self.listen, ssl=self.tls,
                    ssl_handshake_timeout=self.auth_timeout if self.tls is not None else None,
                )
                host, port = self._tcp.sockets[0].getsockname()[:2]
                self.tcp_address = (str(host), int(port))
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, self.socket_path.encode() + b"\n", 0)
            os.fsync(self._lock_fd)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop listening, drop every connection (their sessions then expire after their TTL, as
        if the server had died), close the database and release the lock. Idempotent."""
        for server in (self._server, self._tcp):
            if server is not None:
                server.close()
        self._server = self._tcp = None
        for conn in list(self._conns):
            conn.abort()
        for writer in list(self._authenticating):
            writer.transport.abort()
        await self.engine.close()
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self.engine, self.engine.leases, reader, writer)
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)

    async def _accept_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        if len(self._authenticating) >= self.max_unauthenticated:
            log.warning("closed a connection from %s: %d connections are already authenticating",
                        peer, len(self._authenticating))
            writer.transport.abort()
            return
        self._authenticating.add(writer)
        try:
            ok = await self._authenticate(reader, writer, peer)
        finally:
            self._authenticating.discard(writer)
        if ok:
            await self._accept(reader, writer)

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> bool:
        """Run the handshake of :mod:`ledgerstore_sqlite.auth`; False (connection closed) if it fails."""
        assert self._secret is not None
        nonce = auth.new_nonce()
        try:
            writer.write(protocol.encode(auth.challenge(nonce)))
            async with asyncio.timeout(self.auth_timeout):
                message = await protocol.read_frame(reader, AUTH_FRAME_LIMIT)
            writer.write(protocol.encode(auth.check_auth(self._secret, nonce, message)))
            return True
        except (auth.MetadataAuthError, protocol.FrameError) as exc:
            log.warning("refused a connection from %s: %s", peer, exc)
            code = "unauthorized" if isinstance(exc, auth.MetadataAuthError) else "protocol"
            writer.write(protocol.encode({"id": 0, "error": code, "message": str(exc)}))
            writer.close()
        except TimeoutError:
            log.warning("closed a connection from %s: it did not authenticate within %ss", peer, self.auth_timeout)
            writer.transport.abort()
        except (asyncio.IncompleteReadError, ConnectionError):
            log.info("a connection from %s hung up before authenticating", peer)
            writer.transport.abort()
        return False


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return format_address(str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else str(peer)


class _Connection:
    """One client connection: reads frames as they come, answers them in order, pushes
    notifications.

    Reading runs ahead of answering (up to ``_MAX_QUEUED`` requests), so the server hears a
    client while the writer thread works through its queued writes: every frame it reads and every
    answer it sends renew the client's session lease, and pings are answered at once from the lease,
    never queued behind writes.
    """

    def __init__(self, engine: SqliteMetadataStore, leases: SessionLeases | None,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.engine = engine
        self.leases = leases or SessionLeases()
        self.reader = reader
        self.writer = writer
        self.session: int | None = None
        self.ttl = 10.0
        self.watches: dict[int, Subscription] = {}

    def abort(self) -> None:
        self.writer.transport.abort()

    def send(self, message: dict[str, Any]) -> None:
        if self.writer.is_closing():
            return
        self.writer.write(protocol.encode(message))
        if self.writer.transport.get_write_buffer_size() > _MAX_BUFFERED:
            log.warning("a metadata client stopped reading (over %d bytes queued); closing it", _MAX_BUFFERED)
            self.abort()

    def heard(self) -> None:
        """The client was heard from, or the server answered it: its session lives on."""
        if self.session is not None:
            self.leases.touch(self.session, self.ttl)

    async def run(self) -> None:
        queue: asyncio.Queue[_Queued] = asyncio.Queue(_MAX_QUEUED)
        reading = asyncio.get_running_loop().create_task(self._read(queue))
        try:
            await self._answer(queue)
        except ConnectionError:
            pass  # the client went away; its session lives on until its TTL
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            for sub in self.watches.values():
                sub.cancel()
            self.watches.clear()
            self.writer.close()

    async def _read(self, queue: asyncio.Queue[_Queued]) -> None:
        """Read frames into ``queue`` until the client hangs up (then ``None``) or sends a length
        the stream cannot be resynchronised past (then that error, and the connection ends)."""
        try:
            while True:
                header = await self.reader.readexactly(4)
                try:
                    length = protocol.frame_length(header)
                except protocol.FrameError as exc:
                    await queue.put(_Queued(None, str(exc), fatal=True))
                    return
                payload = await self.reader.readexactly(length)
                self.heard()
                try:
                    message = protocol.decode_body(payload)
                except protocol.FrameError as exc:
                    await queue.put(_Queued(None, str(exc)))
                    continue
                if message.get("op") == "ping" and self.session is not None:
                    self.ping(message.get("id"))
                    continue
                await queue.put(_Queued(message))
        except (asyncio.IncompleteReadError, ConnectionError):
            await queue.put(_Queued(None))

    async def _answer(self, queue: asyncio.Queue[_Queued]) -> None:
        """Answer what :meth:`_read` queued, in order, until the connection ends. Plain puts and
        deletes queued one after another are handled together, so they share the store's group
        commit; a request of any other kind waits for the writes before it, as it always did."""
        ahead: _Queued | None = None
        while True:
            item, ahead = (ahead, None) if ahead is not None else (await queue.get(), None)
            if _groupable(item):
                writes = [item]
                while not queue.empty() and len(writes) < _MAX_QUEUED:
                    nxt = queue.get_nowait()
                    if not _groupable(nxt):
                        ahead = nxt
                        break
                    writes.append(nxt)
                if len(writes) > 1:
                    # each answers when its write is done (the client matches answers by id)
                    await asyncio.gather(*(self.handle(w.message) for w in writes if w.message is not None))
                    self.heard()
                    await self.writer.drain()
                    continue
            if item.error is not None:
                self.send({"id": None, "error": "protocol", "message": item.error})
                if item.fatal:
                    return
                continue
            if item.message is None or not await self.handle(item.message):
                return
            self.heard()
            await self.writer.drain()

    def ping(self, rid: object) -> None:
        """Answer a ping from the session's lease, without the writer thread."""
        try:
            self.renew()
        except SessionExpiredError as exc:
            self.send({"id": rid, "error": protocol.error_code(exc), "message": str(exc)})
            return
        self.send({"id": rid, "result": None})

    def renew(self) -> None:
        """Renew the session's lease; :class:`SessionExpiredError` if it lapsed."""
        assert self.session is not None
        if not self.leases.touch(self.session, self.ttl):
            raise SessionExpiredError(f"session {self.session} expired (no ping within its {self.ttl}s TTL)")

    async def handle(self, message: dict[str, Any]) -> bool:
        """Answer one request; False ends the connection."""
        rid = message.get("id")
        op = message.get("op")
        try:
            if op != "hello" and self.session is None:
                raise protocol.FrameError(f"the first request on a connection must be 'hello', not {op!r}")
            handler = _OPS.get(str(op))
            if handler is None:
                raise protocol.FrameError(f"unknown operation {op!r}; known: {', '.join(sorted(_OPS))}")
            result = await handler(self, message)
        except protocol.FrameError as exc:
            self.send({"id": rid, "error": "protocol", "message": str(exc)})
            return True
        except (LedgerStoreError, KeyError, TypeError, ValueError) as exc:
            if not isinstance(exc, LedgerStoreError):
                exc = protocol.FrameError(f"malformed {op!r} request: {exc!r}")
            self.send({"id": rid, "error": protocol.error_code(exc), "message": str(exc)})
            return True
        self.send({"id": rid, "result": result})
        return op != "close"

    # --- operations -----------------------------------------------------------------------------

    async def op_hello(self, m: dict[str, Any]) -> dict[str, Any]:
        self.ttl = float(m.get("ttl", 10.0))
        if not self.ttl > 0:
            raise protocol.FrameError(f"session ttl must be > 0, not {self.ttl}")
        wanted = m.get("session")
        if wanted is not None and (self.leases.touch(int(wanted), self.ttl)
                                   or await self.engine.renew_session(int(wanted), self.ttl)):
            # resumed from its lease, or from the table after a server restart
            self.session = int(wanted)
            self.leases.start(self.session, self.ttl)
            return {"session": self.session, "resumed": True}
        self.session = await self.engine.open_session(self.ttl)
        self.leases.start(self.session, self.ttl)
        return {"session": self.session, "resumed": False}

    async def op_ping(self, m: dict[str, Any]) -> None:
        """A ping read before the session was open (queued behind its hello)."""
        self.renew()

    async def op_get(self, m: dict[str, Any]) -> dict[str, Any] | None:
        got = await self.engine.get(m["key"])
        return None if got is None else {"value": protocol.encode_value(got.value), "version": got.version}

    async def op_put(self, m: dict[str, Any]) -> int:
        return await self.engine.put(m["key"], protocol.decode_value(m["value"]), m.get("expected"))

    async def op_put_ephemeral(self, m: dict[str, Any]) -> int:
        self.renew()
        assert self.session is not None
        return await self.engine.put_ephemeral_for(
            self.session, self.ttl, m["key"], protocol.decode_value(m["value"])
        )

    async def op_delete(self, m: dict[str, Any]) -> None:
        await self.engine.delete(m["key"], m.get("expected"))

    async def op_delete_recursive(self, m: dict[str, Any]) -> None:
        await self.engine.delete_recursive(m["key"])

    async def op_children(self, m: dict[str, Any]) -> list[str]:
        return await self.engine.children(m["key"])

    async def op_next_id(self, m: dict[str, Any]) -> int:
        return await self.engine.next_id(str(m["name"]))

    async def op_watch(self, m: dict[str, Any]) -> int:
        wid = int(m["watch"])
        after = m.get("after")

        def notify(rev: int, note: Notification) -> None:
            self.send({"watch": wid, "rev": rev, "type": note.type.value, "key": note.key})

        old = self.watches.pop(wid, None)
        if old is not None:
            old.cancel()
        sub, current = await self.engine.watch_revisions(m["prefix"], notify, None if after is None else int(after))
        self.watches[wid] = sub
        return current

    async def op_unwatch(self, m: dict[str, Any]) -> None:
        sub = self.watches.pop(int(m["watch"]), None)
        if sub is not None:
            sub.cancel()

    async def op_close(self, m: dict[str, Any]) -> None:
        session, self.session = self.session, None
        if session is not None:
            self.leases.end(session)
            await self.engine.end_session(session)


def _groupable(item: _Queued) -> bool:
    """A plain put or delete: writes that can share a group commit with the ones next to them."""
    return item.error is None and item.message is not None and item.message.get("op") in ("put", "delete")


@dataclasses.dataclass(frozen=True)
class _Queued:
    """What a connection read: a request, a frame it could not read (``error``; ``fatal``: the
    connection ends after answering it), or neither (the client hung up)."""

    message: dict[str, Any] | None
    error: str | None = None
    fatal: bool = False


_OPS = {
    name.removeprefix("op_"): fn for name, fn in vars(_Connection).items() if name.startswith("op_")
}


async def serve(db_path: str, stop: asyncio.Event, **options: Any) -> None:
    """Run a :class:`MetadataServer` until ``stop`` is set."""
    server = MetadataServer(db_path, **options)
    await server.start()
    log.info("sqlite metadata server for %s listening on %s%s", server.db_path, server.socket_path,
             "" if server.tcp_address is None else f" and tcp {format_address(*server.tcp_address)}")
    try:
        await stop.wait()
    finally:
        await server.close()
