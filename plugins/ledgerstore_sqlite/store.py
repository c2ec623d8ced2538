"""The ``sqlite`` MetadataStore: one database file shared by every process of a machine.

Threading: each store owns one sqlite connection, used only from one dedicated worker thread
(a single-thread executor). Every coroutine ships its SQL there with ``run_in_executor``, so the
event loop never blocks on the disk or on another process's write lock, and the connection is
never touched by two threads.

Multi-process safety comes from sqlite itself: WAL journal mode (readers never block the writer),
a busy timeout (a writer waits for another process's write lock instead of failing), and
``BEGIN IMMEDIATE`` around every read-modify-write, so a compare-and-set reads and writes under
the one write lock. See ``docs/metadata-sqlite.md`` and :mod:`ledgerstore_sqlite.schema`.

When a metadata server (:mod:`ledgerstore_sqlite.server`) serves the file, the store does none of
this: it finds the server at start (option ``server``) and sends every primitive to it through
:class:`~ledgerstore_sqlite.remote.RemoteSession`, so this process never holds the file's lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ledgerstore.api import (
    MAX_DURATION_S,
    NOT_EXISTS,
    EventType,
    MetadataStore,
    Notification,
    NotificationCallback,
    Subscription,
    Versioned,
    option,
)
from ledgerstore.errors import (
    BadVersionError,
    ConfigError,
    InvalidArgumentError,
    KeyExistsError,
    MetadataError,
    NoSuchKeyError,
    SessionExpiredError,
)
from ledgerstore_sqlite import protocol, schema
from ledgerstore_sqlite.auth import read_secret
from ledgerstore_sqlite.discovery import live_socket, parse_address
from ledgerstore_sqlite.endpoint import Endpoint, TcpEndpoint, UnixEndpoint
from ledgerstore_sqlite.leases import SessionLeases
from ledgerstore_sqlite.remote import RemoteSession
from ledgerstore_sqlite.schema import immediate
from ledgerstore_sqlite.tls import client_context

__all__ = ["SERVER_MODES", "SqliteMetadataStore", "engine_store", "path_from_uri"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_SCHEME = "sqlite://"
#: a metadata server on another host: ``sqlite+tcp://HOST:PORT``
_TCP_SCHEME = "sqlite+tcp://"
#: change rows fetched per poll; a full batch is followed by another fetch without sleeping
_POLL_BATCH = 5000
#: keys fetched per step of the children() scan
_CHILDREN_BATCH = 256

#: values of the ``server`` option: use a live metadata server if there is one, else the file
#: ("auto"); refuse to start without one ("require"); always open the file ("never")
SERVER_MODES = ("auto", "require", "never")


def path_from_uri(uri: str) -> str:
    """The absolute database path of a ``sqlite://PATH`` URI.

    ``PATH`` is everything after ``sqlite://``: ``sqlite:///var/lib/ls/meta.db`` is
    ``/var/lib/ls/meta.db``; ``sqlite://data/meta.db`` is ``data/meta.db`` under the current
    directory (resolved when the store is constructed).
    """
    if not uri.startswith(_SCHEME):
        raise ConfigError(
            f"sqlite metadata URI {uri!r} must start with {_SCHEME!r}, e.g. sqlite:///path/meta.db"
        )
    path = uri[len(_SCHEME) :]
    if not path:
        raise ConfigError(f"sqlite metadata URI {uri!r} names no file; use sqlite:///absolute/path/meta.db")
    return os.path.abspath(path)


def _tcp_endpoint(uri: str, opts: SqliteMetadataStore.Options) -> TcpEndpoint:
    """The TCP listener a ``sqlite+tcp://HOST:PORT`` URI names, with the secret of ``secret_file``."""
    rest = uri[len(_TCP_SCHEME) :]
    if "@" in rest or "?" in rest:
        raise ConfigError(
            f"metadata URI {uri!r}: a sqlite+tcp URI holds HOST:PORT only; the secret goes in the file "
            "named by metadata option 'secret_file'"
        )
    host, port = parse_address(rest.rstrip("/"), f"metadata URI {uri!r}:")
    if port == 0:
        raise ConfigError(f"metadata URI {uri!r} names port 0; use the port the metadata server printed when ready")
    if opts.server == "never":
        raise ConfigError(f"metadata URI {uri!r} is a metadata server's address; metadata option server='never' "
                          "cannot open a file there")
    if opts.secret_file is None:
        raise ConfigError(f"metadata URI {uri!r} needs metadata option 'secret_file': the metadata server "
                          "serves TCP only to clients that prove its secret")
    return TcpEndpoint(host, port, read_secret(opts.secret_file, "metadata option 'secret_file'"),
                       opts.connect_timeout, None if opts.ca_file is None else client_context(opts.ca_file),
                       opts.server_hostname)


def _norm_key(key: str) -> str:
    if not key.startswith("/"):
        raise InvalidArgumentError(f"metadata key {key!r} must be an absolute path starting with '/'")
    if len(key) > 1:
        key = key.rstrip("/") or "/"
    return key


def _subtree_bounds(key: str) -> tuple[str, str]:
    """``(lo, hi)`` such that the keys strictly below ``key`` are exactly ``lo < k < hi``.

    ``'0'`` is the character after ``'/'``, so every ``key/...`` sorts between ``key/`` and
    ``key0`` under sqlite's binary collation, and ``keyx`` (a sibling) does not.
    """
    base = "" if key == "/" else key
    return base + "/", base + "0"


#: a watch callback that is also told the revision of each change (the metadata server's)
RevisionCallback = Callable[[int, Notification], None]


class _Subscription(Subscription):
    __slots__ = ("_store", "prefix", "callback", "from_revision", "active", "backlog")

    def __init__(self, store: SqliteMetadataStore, prefix: str, callback: RevisionCallback, rev: int) -> None:
        self._store = store
        self.prefix = prefix
        self.callback = callback
        self.from_revision = rev
        self.active = True
        #: changes the poller found while older ones are still being replayed (delivered after them)
        self.backlog: list[tuple[int, Notification]] | None = None

    def matches(self, key: str) -> bool:
        p = self.prefix
        return p == "/" or key == p or key.startswith(p + "/")

    def cancel(self) -> None:
        """Stop callbacks; takes effect at once, even in the middle of a delivered batch."""
        self.active = False
        with contextlib.suppress(ValueError):
            self._store._subs.remove(self)


class SqliteMetadataStore(MetadataStore):
    """MetadataStore on a local sqlite file, shareable by several processes on one machine.

    ``uri``: ``sqlite:///absolute/path/meta.db`` or ``sqlite://relative/path/meta.db``.
    Options: ``session_ttl`` (seconds, default 10: ephemeral keys of a process killed with
    SIGKILL vanish within about this), ``poll_interval`` (seconds between polls of the change
    table while watches exist, default 0.05), ``busy_timeout`` (seconds to wait for another
    process's write lock, default 30), ``synchronous`` (``"full"``, the default, or ``"normal"``).

    ``sqlite+tcp://HOST:PORT`` reaches a metadata server's TCP listener on another host; the
    option ``secret_file`` names the file holding the secret shared with it (never the URI), and
    ``ca_file`` switches that connection to TLS.

    Versions are values of one global revision counter. A plain ``put`` on an ephemeral key keeps
    it ephemeral and owned by its session (as in ZooKeeper); ``put_ephemeral`` takes it over.
    """

    schemes = ("sqlite", "sqlite+tcp")
    supports_session_events = True
    supports_tls = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``metadata_options`` table of a ``sqlite://`` metadata store."""

        session_timeout: float | None = option(None, "the name every metadata backend understands for "
                                               "session_ttl", minimum=0.001, maximum=MAX_DURATION_S)
        session_ttl: float | None = option(None, "seconds ephemeral keys of a killed process outlive it "
                                           "(default session_timeout, else 10)", minimum=0.001, maximum=MAX_DURATION_S)
        poll_interval: float = option(0.05, "seconds between polls of the change table while watches exist",
                                      minimum=0.001, maximum=MAX_DURATION_S)
        busy_timeout: float = option(30.0, "seconds to wait for another process's write lock", minimum=0.001, maximum=MAX_DURATION_S)
        synchronous: str = option("full", "sqlite's synchronous mode", choices=("full", "normal"))
        server: str = option("auto", "reach the database through its metadata server: 'auto' when one runs, "
                             "'require' (fail without one) or 'never' (open the file)", choices=SERVER_MODES)
        secret_file: str | None = option(None, "sqlite+tcp:// only: the file (mode 0600) holding the secret "
                                         "shared with the metadata server")
        operation_timeout: float | None = option(None, "seconds to wait for one answer from the metadata server "
                                                 "(default busy_timeout)", minimum=0.001, maximum=MAX_DURATION_S)
        connect_timeout: float = option(5.0, "sqlite+tcp:// only: seconds to connect to the metadata server and "
                                        "authenticate", minimum=0.001, maximum=MAX_DURATION_S)
        ca_file: str | None = option(None, "sqlite+tcp:// only: CAs that sign the metadata server's certificate; "
                                     "switches the connection to TLS")
        server_hostname: str | None = option(None, "sqlite+tcp:// with ca_file: the name the server's certificate "
                                             "must hold (default: the URI's host)")

        def __post_init__(self) -> None:
            if self.server_hostname is not None and self.ca_file is None:
                raise ValueError("server_hostname needs ca_file (TLS is switched on by ca_file)")

    def __init__(self, uri: str, options: SqliteMetadataStore.Options | None = None, /, **values: Any) -> None:
        """``options``: the ``metadata_options`` table as the host parsed it; a store built in code
        may pass the table as keyword arguments instead (parsed by the same rules)."""
        super().__init__(uri, options, **values)
        opts: SqliteMetadataStore.Options = self.options
        #: the metadata server's TCP listener, for a ``sqlite+tcp://`` URI
        self.tcp: TcpEndpoint | None = None
        if uri.startswith(_TCP_SCHEME):
            self.tcp = _tcp_endpoint(uri, opts)
            self.path = uri
        else:
            for name in ("secret_file", "ca_file"):
                if getattr(opts, name) is not None:
                    raise ConfigError(
                        f"metadata option {name!r} is for sqlite+tcp://HOST:PORT; {uri!r} is reached "
                        "through the local file system"
                    )
            self.path = path_from_uri(uri)
        # session_timeout is the name every metadata backend understands; session_ttl is sqlite's own
        self.session_ttl: float = (opts.session_ttl if opts.session_ttl is not None
                                   else 10.0 if opts.session_timeout is None else opts.session_timeout)
        self.poll_interval = opts.poll_interval
        self.busy_timeout = opts.busy_timeout
        self.operation_timeout = opts.busy_timeout if opts.operation_timeout is None else opts.operation_timeout
        self.synchronous = opts.synchronous.upper()
        self.server_mode = opts.server
        #: set when a metadata server serves the file: every primitive goes through it
        self._remote: RemoteSession | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        # Read and written only on the worker thread.
        self._session_id: int | None = None
        self._start_lock: asyncio.Lock | None = None
        self._started = False
        self._closed = False
        self._subs: list[_Subscription] = []
        self._last_seen = 0
        self._poller: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        #: writes waiting for the running group commit to end (read and written on the loop)
        self._queued: list[tuple[str, Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = []
        self._group_running = False
        #: a metadata server's engine: its clients' sessions, alive in memory (the heartbeat
        #: copies them into the sessions table before it reaps)
        self.leases: SessionLeases | None = None

    def __repr__(self) -> str:
        return f"SqliteMetadataStore({self.uri!r})"

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open (or create) the database and its schema, and open a session. Idempotent."""
        if self._closed:
            raise MetadataError(
                f"sqlite metadata store {self.path} is closed; create a new store to reconnect"
            )
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            if await self._start_remote():
                self._started = True
                return
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ledgerstore-sqlite")
            try:
                await self._call("opening the database", self._sync_open)
            except BaseException:
                self._executor.shutdown(wait=False)
                self._executor = None
                raise
            self._started = True
            self._heartbeat = asyncio.get_running_loop().create_task(
                self._heartbeat_loop(), name=f"sqlite-heartbeat {self.path}"
            )

    async def _start_remote(self) -> bool:
        """Connect to the file's metadata server if one runs (and ``server`` allows it)."""
        endpoint: Endpoint
        if self.tcp is not None:
            endpoint = self.tcp
        else:
            if self.server_mode == "never":
                return False
            socket_path = await asyncio.get_running_loop().run_in_executor(None, live_socket, self.path)
            if socket_path is None:
                if self.server_mode == "require":
                    raise MetadataError(
                        f"no sqlite metadata server serves {self.path} (option server='require'); start one with "
                        f"'ledgerstore metadata-server --db {self.path}', or set metadata_options server = 'never' "
                        "to open the file directly"
                    )
                return False
            endpoint = UnixEndpoint(socket_path)
        remote = RemoteSession(endpoint, self.session_ttl, self._fire_session_event, self.operation_timeout)
        await remote.start()
        self._remote = remote
        self._session_id = remote.session
        return True

    async def close(self) -> None:
        """Delete this session's ephemeral keys and its session row, stop background tasks and
        close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._remote is not None:
            await self._remote.close()
            return
        for sub in self._subs:
            sub.active = False
        self._subs.clear()
        for task in (self._heartbeat, self._poller):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._heartbeat = self._poller = None
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._sync_close)
        except sqlite3.Error as exc:
            # The session row will expire and be reaped by another store; nothing is lost.
            log.warning("sqlite metadata store %s: could not end the session cleanly: %s", self.path, exc)
        finally:
            executor.shutdown(wait=False)

    # --- the primitives ------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned | None:
        """Value and version of ``key``, or ``None``."""
        key = _norm_key(key)
        if self._remote is not None:
            got = await self._remote.call("get", key=key)
            return None if got is None else Versioned(protocol.decode_value(got["value"]), int(got["version"]))
        return await self._call(f"get {key}", self._sync_get, key)

    async def put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        """Write ``value``; see :meth:`MetadataStore.put` for ``expected_version``."""
        key = _norm_key(key)
        if self._remote is not None:
            return int(await self._remote.call(
                "put", key=key, value=protocol.encode_value(bytes(value)), expected=expected_version
            ))
        rev, _ = await self._write(f"put {key}", self._sync_put, key, bytes(value), expected_version, False)
        return rev

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        """Create or overwrite ``key`` owned by this store's session."""
        key = _norm_key(key)
        if self._remote is not None:
            rev = await self._remote.put_ephemeral(key, bytes(value))
            self._session_id = self._remote.session
            return rev
        rev, replaced = await self._call(
            f"put_ephemeral {key}", self._sync_put, key, bytes(value), None, True
        )
        if replaced:
            self._announce_new_session()
        return rev

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        """Delete ``key``; :class:`NoSuchKeyError` if absent, :class:`BadVersionError` on a
        version mismatch. Keys below ``key`` are separate keys and are left alone."""
        key = _norm_key(key)
        if self._remote is not None:
            await self._remote.call("delete", key=key, expected=expected_version)
            return
        await self._write(f"delete {key}", self._sync_delete, key, expected_version)

    async def delete_recursive(self, key: str) -> None:
        """Delete ``key`` and every key below it in one transaction."""
        key = _norm_key(key)
        if self._remote is not None:
            await self._remote.call("delete_recursive", key=key)
            return
        await self._call(f"delete_recursive {key}", self._sync_delete_tree, key)

    async def children(self, key: str) -> list[str]:
        """Sorted names of the direct children of ``key`` (valued or implied by deeper keys)."""
        key = _norm_key(key)
        if self._remote is not None:
            return [str(name) for name in await self._remote.call("children", key=key)]
        return await self._call(f"children {key}", self._sync_children, key)

    async def next_id(self, name: str) -> int:
        """Next value of counter ``name``, starting at 1; unique across processes and restarts."""
        if self._remote is not None:
            return int(await self._remote.call("next_id", name=name))
        return await self._call(f"next_id {name!r}", self._sync_next_id, name)

    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        """Call ``callback`` on this loop for each change at or below ``prefix`` (on path
        boundaries: ``/w`` sees ``/w`` and ``/w/x``, not ``/wx``) committed after this call."""
        prefix = _norm_key(prefix)
        if self._remote is not None:
            return await self._remote.watch(prefix, callback)
        sub, _ = await self.watch_revisions(prefix, lambda rev, note: callback(note))
        return sub

    async def watch_revisions(
        self, prefix: str, callback: RevisionCallback, after: int | None = None
    ) -> tuple[Subscription, int]:
        """:meth:`watch` for the metadata server: ``callback`` also gets each change's revision,
        and with ``after`` (a revision a client last saw) the changes committed since then are
        delivered first, in order, as far as the change table still holds them. Returns the
        subscription and the revision it is current at."""
        prefix = _norm_key(prefix)
        rev = await self._call(f"watch {prefix}", self._sync_revision)
        if self._poller is None or self._poller.done():
            self._last_seen = max(self._last_seen, rev)
            self._poller = asyncio.get_running_loop().create_task(
                self._poll_loop(), name=f"sqlite-watch {self.path}"
            )
        # The poller delivers what comes after _last_seen; the replay covers (after, _last_seen].
        current = self._last_seen
        start = rev if after is None else after
        sub = _Subscription(self, prefix, callback, start)
        self._subs.append(sub)
        if start < current:  # also when the poller moved past ``rev`` while it was being read
            sub.backlog = []
            try:
                rows = await self._call(f"watch {prefix}", self._sync_changes_between, start, current)
            except BaseException:
                sub.cancel()
                raise
            if rows and rows[0][0] > start + 1:
                log.warning("sqlite metadata store %s: changes %d..%d were pruned before a watcher of %s "
                            "came back for them; some notifications are lost", self.path, start + 1,
                            rows[0][0] - 1, prefix)
            backlog, sub.backlog = sub.backlog, None
            replay = [(r, Notification(EventType(kind), key)) for r, key, kind in rows if sub.matches(key)]
            for r, note in replay + backlog:
                if sub.active:
                    self._call_back(sub, r, note)
        return sub, max(current, start)

    # --- sessions of the metadata server's clients (called by the server on its engine store) ---

    async def open_session(self, ttl: float) -> int:
        """Open a session whose ephemeral keys vanish ``ttl`` seconds after its last renewal."""
        return await self._call("opening a client session", self._sync_open_session, ttl)

    async def renew_session(self, session: int, ttl: float) -> bool:
        """Extend ``session`` by ``ttl`` from now; False if it expired (reaped or past its time)."""
        return await self._call(f"renewing session {session}", self._sync_renew_session, session, ttl)

    async def end_session(self, session: int) -> None:
        """End ``session`` now: its ephemeral keys are deleted."""
        await self._call(f"ending session {session}", self._sync_end_session, session)

    async def put_ephemeral_for(self, session: int, ttl: float, key: str, value: bytes) -> int:
        """:meth:`put_ephemeral` on behalf of ``session`` (renewed by ``ttl``);
        :class:`SessionExpiredError` if that session is gone."""
        key = _norm_key(key)
        rev, _ = await self._call(
            f"put_ephemeral {key}", self._sync_put, key, bytes(value), None, True, (session, ttl)
        )
        return rev

    def _sync_open_session(self, ttl: float) -> int:
        now = time.time()
        with immediate(self._db()) as conn:
            return self._new_session_locked(conn, now, ttl)

    def _sync_renew_session(self, session: int, ttl: float) -> bool:
        now = time.time()
        with immediate(self._db()) as conn:
            return self._extend_locked(conn, session, ttl, now)

    def _sync_end_session(self, session: int) -> None:
        with immediate(self._db()) as conn:
            self._drop_session_keys_locked(conn, session, time.time())
            conn.execute("DELETE FROM sessions WHERE id = ?", (session,))

    @staticmethod
    def _extend_locked(conn: sqlite3.Connection, session: int, ttl: float, now: float, vouched: bool = False) -> bool:
        # A row past its expiry counts as gone even before a reaper removed it: its keys are due
        # to vanish, and resuming it would race the reaper. ``vouched``: the server's lease says
        # the session lives (the row's expiry lags it until the next heartbeat copies it).
        cur = conn.execute(
            "UPDATE sessions SET expires_at = max(expires_at, ?) WHERE id = ? AND (? OR expires_at >= ?)",
            (now + ttl, session, vouched, now),
        )
        return cur.rowcount == 1

    # --- running SQL on the worker thread ------------------------------------------------------

    async def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise MetadataError(f"sqlite metadata store {self.path} is closed; cannot {what}")
        executor = self._executor
        if executor is None:
            raise MetadataError(
                f"sqlite metadata store {self.path} is not started; await start() before {what}"
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except sqlite3.Error as exc:
            raise MetadataError(f"sqlite metadata store {self.path}: {what} failed: {exc}") from exc

    async def _write(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """Run the write ``fn(*args)`` (one :func:`immediate` transaction) on the worker thread,
        in one transaction with the writes queued while the previous group ran: concurrent
        writers share a commit and its fsync (a group commit), each keeping its own outcome.
        Writes that touch the session (ephemeral keys) go through :meth:`_call` alone."""
        if self._closed or self._executor is None:
            return await self._call(what, fn, *args)
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queued.append((what, fn, args, fut))
        if not self._group_running:
            self._run_group()
        return await fut

    def _run_group(self) -> None:
        group, self._queued = self._queued, []
        executor = self._executor
        if executor is None:
            for what, _, _, fut in group:
                if not fut.done():
                    fut.set_exception(MetadataError(f"sqlite metadata store {self.path} is closed; cannot {what}"))
            return
        self._group_running = True
        done = asyncio.get_running_loop().run_in_executor(
            executor, self._sync_group, [(fn, args) for _, fn, args, _ in group])
        done.add_done_callback(lambda f: self._group_done(group, f))

    def _sync_group(self, writes: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[schema.Outcome]:
        return schema.run_group(self._db(), writes)

    def _group_done(self, group: list[tuple[str, Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]],
                    done: asyncio.Future[list[schema.Outcome]]) -> None:
        self._group_running = False
        if done.cancelled():
            outcomes: list[schema.Outcome] = [(False, MetadataError(f"sqlite metadata store {self.path} closed"))]
            outcomes *= len(group)
        elif (exc := done.exception()) is not None:
            outcomes = [(False, exc)] * len(group)
        else:
            outcomes = done.result()
        for (what, _, _, fut), (ok, value) in zip(group, outcomes, strict=True):
            if fut.done():
                continue
            if ok:
                fut.set_result(value)
            elif isinstance(value, sqlite3.Error):
                err = MetadataError(f"sqlite metadata store {self.path}: {what} failed: {value}")
                err.__cause__ = value
                fut.set_exception(err)
            else:
                fut.set_exception(value)
        if self._queued:
            self._run_group()

    def _db(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            raise MetadataError(f"sqlite metadata store {self.path} has no open connection")
        return conn

    def _sync_open(self) -> None:
        parent = os.path.dirname(self.path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise MetadataError(
                f"sqlite metadata store {self.path}: cannot create directory {parent}: {exc}"
            ) from exc
        self._conn = schema.connect(self.path, self.busy_timeout, self.synchronous)
        try:
            now = time.time()
            with immediate(self._conn) as conn:
                self._reap_locked(conn, now)
                self._session_id = self._new_session_locked(conn, now)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _sync_close(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            if self._session_id is not None:
                with immediate(conn):
                    self._drop_session_keys_locked(conn, self._session_id, time.time())
                    conn.execute("DELETE FROM sessions WHERE id = ?", (self._session_id,))
        finally:
            self._session_id = None
            self._conn = None
            conn.close()

    def _sync_get(self, key: str) -> Versioned | None:
        row = self._db().execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else Versioned(bytes(row[0]), row[1])

    def _sync_revision(self) -> int:
        row = self._db().execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
        return int(row[0])

    @staticmethod
    def _bump_locked(conn: sqlite3.Connection, n: int = 1) -> int:
        """Reserve ``n`` revisions; returns the last one."""
        rows = conn.execute(
            "UPDATE meta SET value = value + ? WHERE name = 'revision' RETURNING value", (n,)
        ).fetchall()
        return int(rows[0][0])

    def _sync_put(
        self, key: str, value: bytes, expected: int | None, ephemeral: bool, owner: tuple[int, float] | None = None
    ) -> tuple[int, bool]:
        now = time.time()
        replaced = False
        with immediate(self._db()) as conn:
            row = conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
            if expected == NOT_EXISTS:
                if row is not None:
                    raise KeyExistsError(
                        f"cannot create {key}: it already exists (version {row[0]}); read it and use its version to update"
                    )
            elif expected is not None:
                if row is None:
                    raise BadVersionError(
                        f"cannot update {key} at version {expected}: the key does not exist"
                    )
                if row[0] != expected:
                    raise BadVersionError(
                        f"cannot update {key}: expected version {expected}, found {row[0]}; re-read and retry"
                    )
            session = self._session_id
            if ephemeral and owner is not None:
                session = owner[0]
                vouched = self.leases is not None and self.leases.alive(session)
                if not self._extend_locked(conn, session, owner[1], now, vouched):
                    raise SessionExpiredError(f"cannot create ephemeral {key}: session {session} expired")
            elif ephemeral:
                replaced = self._renew_locked(conn, now)
                session = self._session_id
            rev = self._bump_locked(conn)
            if ephemeral:
                conn.execute(
                    "INSERT INTO kv(key, value, version, session) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version, "
                    "session = excluded.session",
                    (key, value, rev, session),
                )
            else:
                conn.execute(
                    "INSERT INTO kv(key, value, version, session) VALUES (?, ?, ?, NULL) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version",
                    (key, value, rev),
                )
            kind = EventType.CREATED if row is None else EventType.MODIFIED
            conn.execute(
                "INSERT INTO changes(revision, key, type, ts) VALUES (?, ?, ?, ?)",
                (rev, key, kind.value, now),
            )
        return rev, replaced

    def _sync_delete(self, key: str, expected: int | None) -> None:
        with immediate(self._db()) as conn:
            row = conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise NoSuchKeyError(f"cannot delete {key}: no such key")
            if expected is not None and row[0] != expected:
                raise BadVersionError(
                    f"cannot delete {key}: expected version {expected}, found {row[0]}; re-read and retry"
                )
            rev = self._bump_locked(conn)
            conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            conn.execute(
                "INSERT INTO changes(revision, key, type, ts) VALUES (?, ?, ?, ?)",
                (rev, key, EventType.DELETED.value, time.time()),
            )

    def _sync_delete_tree(self, key: str) -> None:
        lo, hi = _subtree_bounds(key)
        where = "key = ? OR (key > ? AND key < ?)"
        with immediate(self._db()) as conn:
            keys = [
                r[0] for r in conn.execute(f"SELECT key FROM kv WHERE {where} ORDER BY key", (key, lo, hi))
            ]
            if keys:
                self._delete_keys_locked(conn, keys, time.time())
                conn.execute(f"DELETE FROM kv WHERE {where}", (key, lo, hi))

    def _delete_keys_locked(self, conn: sqlite3.Connection, keys: list[str], now: float) -> None:
        """Record DELETED change rows for ``keys`` (the caller deletes the kv rows)."""
        last = self._bump_locked(conn, len(keys))
        first = last - len(keys) + 1
        deleted = EventType.DELETED.value
        conn.executemany(
            "INSERT INTO changes(revision, key, type, ts) VALUES (?, ?, ?, ?)",
            [(first + i, k, deleted, now) for i, k in enumerate(keys)],
        )

    def _sync_children(self, key: str) -> list[str]:
        # Skip-scan: read keys of the subtree in batches, and when a key lies deeper than one
        # level, jump past that child's whole subtree; so a child with a million descendants
        # costs one probe, while a flat directory is read in batches.
        conn = self._db()
        lo, hi = _subtree_bounds(key)
        names: set[str] = set()
        cursor, op = lo, ">"
        while True:
            rows = conn.execute(
                f"SELECT key FROM kv WHERE key {op} ? AND key < ? ORDER BY key LIMIT {_CHILDREN_BATCH}",
                (cursor, hi),
            ).fetchall()
            jumped = False
            for (k,) in rows:
                name, sep, _ = k[len(lo) :].partition("/")
                if name:
                    names.add(name)
                if sep:
                    cursor, op, jumped = lo + name + "0", ">=", True
                    break
                cursor, op = k, ">"
            if not jumped and len(rows) < _CHILDREN_BATCH:
                return sorted(names)

    def _sync_next_id(self, name: str) -> int:
        with immediate(self._db()) as conn:
            rows = conn.execute(
                "INSERT INTO counters(name, value) VALUES (?, 1) "
                "ON CONFLICT(name) DO UPDATE SET value = value + 1 RETURNING value",
                (name,),
            ).fetchall()
        return int(rows[0][0])

    def _sync_changes_between(self, after: int, upto: int) -> list[tuple[int, str, str]]:
        return (
            self._db()
            .execute(
                "SELECT revision, key, type FROM changes WHERE revision > ? AND revision <= ? ORDER BY revision",
                (after, upto),
            )
            .fetchall()
        )

    def _sync_changes(self, after: int) -> list[tuple[int, str, str]]:
        return (
            self._db()
            .execute(
                f"SELECT revision, key, type FROM changes WHERE revision > ? ORDER BY revision LIMIT {_POLL_BATCH}",
                (after,),
            )
            .fetchall()
        )

    # --- sessions --------------------------------------------------------------------------------

    def _new_session_locked(self, conn: sqlite3.Connection, now: float, ttl: float | None = None) -> int:
        ttl = self.session_ttl if ttl is None else ttl
        cur = conn.execute(
            "INSERT INTO sessions(expires_at, ttl, pid, created_at) VALUES (?, ?, ?, ?)",
            (now + ttl, ttl, os.getpid(), now),
        )
        return int(cur.lastrowid or 0)

    def _renew_locked(self, conn: sqlite3.Connection, now: float) -> bool:
        """Extend this store's session; if it was reaped meanwhile, open a new one and return True."""
        cur = conn.execute(
            "UPDATE sessions SET expires_at = ? WHERE id = ?", (now + self.session_ttl, self._session_id)
        )
        if cur.rowcount == 1:
            return False
        self._session_id = self._new_session_locked(conn, now)
        return True

    def _drop_session_keys_locked(self, conn: sqlite3.Connection, session: int, now: float) -> None:
        keys = [r[0] for r in conn.execute("SELECT key FROM kv WHERE session = ? ORDER BY key", (session,))]
        if keys:
            self._delete_keys_locked(conn, keys, now)
            conn.execute("DELETE FROM kv WHERE session = ?", (session,))

    def _reap_locked(self, conn: sqlite3.Connection, now: float) -> None:
        """Remove expired sessions of other (dead or stalled) processes and their ephemeral keys,
        and ephemeral keys whose session row is gone."""
        dead = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE expires_at < ?", (now,))]
        orphaned = [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT session FROM kv WHERE session IS NOT NULL "
                "AND session NOT IN (SELECT id FROM sessions)"
            )
        ]
        for session in dict.fromkeys(dead + orphaned):
            self._drop_session_keys_locked(conn, session, now)
        if dead:
            conn.execute("DELETE FROM sessions WHERE expires_at < ?", (now,))

    def _prune_changes_locked(self, conn: sqlite3.Connection, now: float) -> None:
        newest = conn.execute("SELECT max(revision) FROM changes").fetchone()[0]
        if newest is None:
            return
        by_count = newest - schema.CHANGE_RETENTION_ROWS
        # Timestamps grow with revisions, so the first young row bounds the old ones; this walks
        # only the rows being removed instead of scanning the table.
        first_young = conn.execute(
            "SELECT revision FROM changes WHERE ts >= ? ORDER BY revision LIMIT 1",
            (now - schema.CHANGE_RETENTION_SECONDS,),
        ).fetchone()
        by_age = (first_young[0] if first_young else newest + 1) - 1
        conn.execute("DELETE FROM changes WHERE revision <= ?", (max(by_count, by_age),))

    @staticmethod
    def _copy_leases_locked(conn: sqlite3.Connection, leases: SessionLeases, now: float) -> None:
        """Copy the metadata server's live leases into their session rows, so the reap after this
        spares them (a lapsed lease is never renewed again); a lease whose row is gone (the session
        was ended in the table) ends too, so its client hears that its session expired."""
        live = leases.live(now)
        conn.executemany(
            "UPDATE sessions SET expires_at = ? WHERE id = ? AND expires_at < ?",
            [(deadline, session, deadline) for session, deadline in live.items()],
        )
        rows = {r[0] for r in conn.execute("SELECT id FROM sessions")}
        for session in live.keys() - rows:
            leases.end(session)

    def _sync_heartbeat(self) -> bool:
        now = time.time()
        with immediate(self._db()) as conn:
            replaced = self._renew_locked(conn, now)
            if self.leases is not None:
                self._copy_leases_locked(conn, self.leases, now)
            self._reap_locked(conn, now)
            self._prune_changes_locked(conn, now)
        return replaced

    def _announce_new_session(self) -> None:
        for event in ("lost", "restored"):
            try:
                self._fire_session_event(event)
            except Exception:
                log.exception("sqlite metadata store %s: a session listener failed on %r", self.path, event)

    async def _heartbeat_loop(self) -> None:
        interval = self.session_ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                replaced = await self._call("session heartbeat", self._sync_heartbeat)
            except MetadataError as exc:
                # Keep beating: the session survives as long as one beat lands within the TTL,
                # and a later beat reports the loss if it did not.
                log.warning("%s", exc)
                continue
            if replaced:
                log.warning(
                    "sqlite metadata store %s: the session expired (this process stalled for longer than "
                    "session_ttl=%ss) and its ephemeral keys were removed; a new session is open",
                    self.path,
                    self.session_ttl,
                )
                self._announce_new_session()

    # --- notifications ---------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while self._subs:
            try:
                rows = await self._call("reading the change table", self._sync_changes, self._last_seen)
            except MetadataError as exc:
                log.warning("%s", exc)
                await asyncio.sleep(self.poll_interval)
                continue
            if rows:
                if rows[0][0] > self._last_seen + 1:
                    log.warning(
                        "sqlite metadata store %s: change rows %d..%d were pruned before this watcher read "
                        "them (it stalled for longer than the retention window); some notifications are lost",
                        self.path,
                        self._last_seen + 1,
                        rows[0][0] - 1,
                    )
                self._deliver(rows)
                self._last_seen = rows[-1][0]
                if len(rows) == _POLL_BATCH:
                    continue
            await asyncio.sleep(self.poll_interval)

    def _deliver(self, rows: list[tuple[int, str, str]]) -> None:
        subs = self._subs
        for rev, key, kind in rows:
            note: Notification | None = None
            for sub in list(subs):
                if not sub.active or rev <= sub.from_revision or not sub.matches(key):
                    continue
                if note is None:
                    note = Notification(EventType(kind), key)
                if sub.backlog is not None:
                    sub.backlog.append((rev, note))
                else:
                    self._call_back(sub, rev, note)

    def _call_back(self, sub: _Subscription, rev: int, note: Notification) -> None:
        try:
            sub.callback(rev, note)
        except Exception:
            log.exception("sqlite metadata store %s: watch callback for %s failed", self.path, sub.prefix)


def engine_store(db_path: str, *, reap_interval: float, synchronous: str, busy_timeout: float) -> SqliteMetadataStore:
    """The store a metadata server runs on: it opens the file itself, and its heartbeat (every
    ``reap_interval`` seconds) reaps expired client sessions and prunes the change table."""
    return SqliteMetadataStore(
        f"{_SCHEME}{db_path}",
        server="never",
        session_ttl=reap_interval * 3,
        synchronous=synchronous,
        busy_timeout=busy_timeout,
    )
