"""The sqlite metadata server: one process owns the database file and serves the MetadataStore
primitives to every other process over a Unix domain socket.

Why: with direct file access every process takes sqlite's write lock itself, so one process
paused inside a write transaction (SIGSTOP, a debugger) blocks every other writer of the machine
until it resumes. Behind the server no client ever holds the lock: a paused client only stops
sending, and its session expires after its TTL like a ZooKeeper session.

Discovery: the server holds an exclusive ``flock`` on ``<db>.lock`` for its whole life and writes
its socket's path into that file. A client that can take a shared lock on it knows no server runs
(a socket file left by a killed server is stale, not live); one that cannot reads the socket path.
See ``docs/metadata-sqlite.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from ledgerstore.api import Notification, Subscription
from ledgerstore.errors import LedgerStoreError, SessionExpiredError
from ledgerstore_sqlite import protocol
from ledgerstore_sqlite.discovery import lock_path, socket_path_for, take_lock
from ledgerstore_sqlite.store import SqliteMetadataStore, engine_store

__all__ = ["MetadataServer", "serve"]

log = logging.getLogger(__name__)

#: a client's write buffer past this many bytes (it stopped reading notifications) ends its
#: connection, so a paused client cannot make the server hold unbounded memory
_MAX_BUFFERED = 32 * 1024 * 1024


class MetadataServer:
    """Serves the sqlite database at ``db_path`` on a Unix socket until :meth:`close`.

    ``reap_interval``: seconds between sweeps that end expired client sessions (and delete
    their ephemeral keys); a session is gone at most this long after its TTL.
    """

    def __init__(
        self,
        db_path: str,
        *,
        reap_interval: float = 0.25,
        synchronous: str = "full",
        busy_timeout: float = 30.0,
    ) -> None:
        self.db_path = os.path.abspath(db_path)
        self.socket_path = socket_path_for(self.db_path)
        self.engine = engine_store(
            self.db_path, reap_interval=reap_interval, synchronous=synchronous, busy_timeout=busy_timeout
        )
        self._lock_fd: int | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()

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
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, self.socket_path.encode() + b"\n", 0)
            os.fsync(self._lock_fd)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop listening, drop every connection (their sessions then expire after their TTL, as
        if the server had died), close the database and release the lock. Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self._conns):
            conn.abort()
        await self.engine.close()
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self.engine, reader, writer)
        self._conns.add(conn)
        try:
            await conn.run()
        finally:
            self._conns.discard(conn)


class _Connection:
    """One client connection: reads frames, answers them in order, pushes notifications."""

    def __init__(self, engine: SqliteMetadataStore, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.engine = engine
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

    async def run(self) -> None:
        try:
            while True:
                header = await self.reader.readexactly(4)
                try:
                    length = protocol.frame_length(header)
                except protocol.FrameError as exc:
                    # The stream cannot be resynchronised past a bad length: answer and hang up.
                    self.send({"id": None, "error": "protocol", "message": str(exc)})
                    break
                payload = await self.reader.readexactly(length)
                try:
                    message = protocol.decode_body(payload)
                except protocol.FrameError as exc:
                    self.send({"id": None, "error": "protocol", "message": str(exc)})
                    continue
                if not await self.handle(message):
                    break
                await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; its session lives on until its TTL
        finally:
            for sub in self.watches.values():
                sub.cancel()
            self.watches.clear()
            self.writer.close()

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
        if wanted is not None and await self.engine.renew_session(int(wanted), self.ttl):
            self.session = int(wanted)
            return {"session": self.session, "resumed": True}
        self.session = await self.engine.open_session(self.ttl)
        return {"session": self.session, "resumed": False}

    async def op_ping(self, m: dict[str, Any]) -> None:
        assert self.session is not None
        if not await self.engine.renew_session(self.session, self.ttl):
            raise SessionExpiredError(f"session {self.session} expired (no ping within its {self.ttl}s TTL)")

    async def op_get(self, m: dict[str, Any]) -> dict[str, Any] | None:
        got = await self.engine.get(m["key"])
        return None if got is None else {"value": protocol.encode_value(got.value), "version": got.version}

    async def op_put(self, m: dict[str, Any]) -> int:
        return await self.engine.put(m["key"], protocol.decode_value(m["value"]), m.get("expected"))

    async def op_put_ephemeral(self, m: dict[str, Any]) -> int:
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
            await self.engine.end_session(session)


_OPS = {
    name.removeprefix("op_"): fn for name, fn in vars(_Connection).items() if name.startswith("op_")
}


async def serve(db_path: str, stop: asyncio.Event, **options: Any) -> None:
    """Run a :class:`MetadataServer` until ``stop`` is set."""
    server = MetadataServer(db_path, **options)
    await server.start()
    log.info("sqlite metadata server for %s listening on %s", server.db_path, server.socket_path)
    try:
        await stop.wait()
    finally:
        await server.close()
