"""ZooKeeperMetadataStore: the MetadataStore contract on ZooKeeper 3.6+ (tested with 3.8), via kazoo.

Layout: the key ``/a/b`` is the znode ``<root>/a/b``; parents are created as persistent znodes on
demand. Counters of :meth:`next_id` live outside the key space, under the sibling ``<root>.counters``.

Versions are the znode's ``mzxid`` (the zxid of its last modification), not ``stat.version``:
``stat.version`` restarts at 0 when a znode is deleted and re-created, so a compare-and-set holding
a version read before the deletion could succeed against the new znode. A zxid is never reused,
so a version names one write for ever. ZooKeeper can only compare ``stat.version`` on the server,
so a conditional write reads the stat, compares its ``mzxid`` with the expected version, and then
writes with that stat's ``stat.version`` as the server-side condition. Any write in between bumps
``stat.version`` and fails the write (:class:`BadVersionError`); the one sequence the server cannot
see is a delete, re-create and exactly as many writes as the old znode had, all between our read
and our write (one round trip).

Blocking never happens on the event loop: every call uses kazoo's ``*_async`` API, whose results
are handed to the loop with ``call_soon_threadsafe``; only start and close run in an executor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from kazoo import exceptions as kz
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.security import make_digest_acl

from ledgerstore.api import (
    MAX_DURATION_S,
    NOT_EXISTS,
    EventType,
    MetadataStore,
    Notification,
    NotificationCallback,
    SessionEvent,
    Subscription,
    Versioned,
    option,
)
from ledgerstore.errors import (
    BadVersionError,
    ConfigError,
    InvalidArgumentError,
    KeyExistsError,
    LedgerStoreError,
    MetadataError,
    NoSuchKeyError,
    SessionExpiredError,
)
from ledgerstore_zookeeper.persistent_watch import (
    NODE_CREATED,
    NODE_DATA_CHANGED,
    NODE_DELETED,
    PersistentWatchClient,
)

log = logging.getLogger(__name__)

_EVENT_TYPES = {
    NODE_CREATED: EventType.CREATED,
    NODE_DATA_CHANGED: EventType.MODIFIED,
    NODE_DELETED: EventType.DELETED,
}
#: bounded retries for the read-then-write loops that race with other clients (not error retries)
_MAX_RACE_RETRIES = 100


def parse_zk_uri(uri: str) -> tuple[str, str]:
    """``zk://h1:p1[,h2:p2]/root`` -> (``"h1:p1,h2:p2"``, ``"/root"``). An empty root is ``/ledgerstore``."""
    scheme, sep, rest = uri.partition("://")
    if scheme != "zk" or not sep:
        raise ConfigError(f"not a ZooKeeper metadata URI: {uri!r} (expected zk://host:port[,host:port]/root)")
    hosts, _, path = rest.partition("/")
    if not hosts:
        raise ConfigError(f"ZooKeeper URI {uri!r} names no server (expected zk://host:port[,host:port]/root)")
    root = "/" + path.strip("/") if path.strip("/") else "/ledgerstore"
    if "//" in root:
        raise ConfigError(f"ZooKeeper URI {uri!r}: root {root!r} has an empty path segment")
    return hosts, root


class _Subscription(Subscription):
    __slots__ = ("_store", "path", "callback", "cancelled")

    def __init__(self, store: ZooKeeperMetadataStore, path: str, callback: NotificationCallback) -> None:
        self._store = store
        self.path = path
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._store._drop_subscription(self)


class ZooKeeperMetadataStore(MetadataStore):
    """MetadataStore on ZooKeeper. URI ``zk://host:port[,host:port]/root``.

    Options:

    ``session_timeout`` (float, seconds, default 10)
        ZooKeeper session timeout: how long ephemeral keys outlive a dead process. The server
        clamps it to [2, 20] ticks.
    ``auth`` (``"user:password"``)
        Digest authentication. Every znode this store creates gets a digest ACL granting all
        rights to that user only, so clients without these credentials can neither read nor write.
    ``connect_timeout`` (float, seconds, default 15)
        How long :meth:`start` waits for the first session.
    ``operation_timeout`` (float, seconds, default 30)
        Bound on any single request (for example while the servers are unreachable).
    """

    schemes = ("zk",)
    supports_session_events = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The ``metadata_options`` table of a ``zk://`` metadata store."""

        session_timeout: float = option(10.0, "seconds ephemeral keys outlive a dead process "
                                        "(the server clamps it to [2, 20] ticks)", minimum=0.1, maximum=MAX_DURATION_S)
        auth: str | None = option(None, "'user:password' for digest authentication and ACLs")
        connect_timeout: float = option(15.0, "seconds start() waits for the first session", minimum=0.001, maximum=MAX_DURATION_S)
        operation_timeout: float = option(30.0, "seconds any single request may take", minimum=0.001, maximum=MAX_DURATION_S)

        def __post_init__(self) -> None:
            if self.auth is not None and ":" not in self.auth:
                raise ValueError("auth must be 'user:password'")

    def __init__(self, uri: str, options: ZooKeeperMetadataStore.Options | None = None, /, **values: Any) -> None:
        """``options``: the ``metadata_options`` table as the host parsed it; a store built in code
        may pass the table as keyword arguments instead (parsed by the same rules)."""
        super().__init__(uri, options, **values)
        opts: ZooKeeperMetadataStore.Options = self.options
        self.hosts, self.root = parse_zk_uri(uri)
        self.session_timeout = opts.session_timeout
        self.connect_timeout = opts.connect_timeout
        self.operation_timeout = opts.operation_timeout
        auth = opts.auth
        self._auth_user: str | None = None
        self._auth_data: list[tuple[str, str]] = []
        self._acl: list[Any] | None = None
        if auth is not None:
            user, _, password = auth.partition(":")
            self._auth_user = user
            self._auth_data = [("digest", auth)]
            self._acl = [make_digest_acl(user, password, all=True)]
        self._counters = f"{self.root}.counters"
        self._client: PersistentWatchClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._session_lost = False
        # path -> subscriptions; replaced (never mutated) so kazoo's reader thread can iterate it.
        self._subs: dict[str, tuple[_Subscription, ...]] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def client(self) -> PersistentWatchClient:
        """The underlying kazoo client (for diagnostics and fault tests)."""
        if self._client is None:
            raise MetadataError(f"ZooKeeper store {self.uri} is not started: await start() first")
        return self._client

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id, or None while there is no session."""
        cid = self._client.client_id if self._client is not None else None
        return cid[0] if cid else None

    async def start(self) -> None:
        if self._client is not None:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._closing = False
        client = PersistentWatchClient(
            hosts=self.hosts,
            timeout=self.session_timeout,
            auth_data=self._auth_data or None,
            default_acl=self._acl,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
        )
        client.persistent_dispatch = self._dispatch_event
        client.add_listener(self._state_listener)
        try:
            await loop.run_in_executor(None, client.start, self.connect_timeout)
        except (KazooTimeoutError, kz.KazooException, OSError) as e:
            await loop.run_in_executor(None, self._shutdown_client, client)
            raise MetadataError(
                f"could not connect to ZooKeeper at {self.hosts} within {self.connect_timeout:.0f}s "
                f"({e!r}); check that the servers run and the URI {self.uri!r} is right"
            ) from e
        # The root znode is not created here: every write creates its parents (makepath), so
        # opening a URI that holds no cluster leaves nothing behind in ZooKeeper.
        self._client = client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        self._closing = True
        for subs in self._subs.values():
            for sub in subs:
                sub.cancelled = True
        self._subs = {}
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._shutdown_client, client)

    @staticmethod
    def _shutdown_client(client: PersistentWatchClient) -> None:
        client.persistent_dispatch = None
        try:
            client.stop()
        finally:
            client.close()

    def _state_listener(self, state: str) -> None:
        # kazoo calls this on its own thread and asks that it never blocks.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._on_state, state)
            except RuntimeError:  # the loop closed between the check and the call
                pass

    def _on_state(self, state: str) -> None:
        if self._closing or self._client is None:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            self._fire_session_event(SessionEvent.LOST)
        elif state == KazooState.CONNECTED:
            # Persistent watches are per connection on the server; kazoo does not re-send them.
            for path in list(self._subs):
                self._readd_watch(path)
            if self._session_lost:
                self._session_lost = False
                self._fire_session_event(SessionEvent.RESTORED)

    def _readd_watch(self, path: str) -> None:
        async def readd() -> None:
            try:
                await self._call(self.client.add_watch_async(path), "watch", self._key(path))
            except LedgerStoreError as e:
                log.warning("could not re-add the ZooKeeper watch on %s: %s", path, e)

        asyncio.ensure_future(readd())

    # --- plumbing ----------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        if not isinstance(key, str) or not key.startswith("/"):
            raise InvalidArgumentError(f"metadata keys are absolute paths starting with '/', got {key!r}")
        key = key.rstrip("/")
        if not key:
            return self.root
        if "//" in key:
            raise InvalidArgumentError(f"metadata key {key!r} has an empty path segment")
        return self.root + key

    def _key(self, path: str) -> str:
        return path[len(self.root):] or "/"

    def _call(self, async_result: Any, op: str, key: str) -> asyncio.Future[Any]:
        """Bridge a kazoo IAsyncResult to an asyncio future, translating errors, bounded in time."""
        loop = self._loop
        assert loop is not None
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any) -> None:
            timer.cancel()
            if fut.done():
                return
            if result.successful():
                fut.set_result(result.value)
            else:
                fut.set_exception(self._translate(result.exception, op, key))

        def on_timeout() -> None:
            if not fut.done():
                fut.set_exception(
                    MetadataError(
                        f"ZooKeeper {op} of {key} did not complete within {self.operation_timeout:.0f}s "
                        f"(servers {self.hosts} unreachable?); its outcome is unknown"
                    )
                )

        timer = loop.call_later(self.operation_timeout, on_timeout)
        async_result.rawlink(lambda result: loop.call_soon_threadsafe(settle, result))
        return fut

    def _translate(self, exc: BaseException, op: str, key: str) -> BaseException:
        where = f"{op} of {key} on ZooKeeper {self.hosts}"
        if isinstance(exc, kz.NoNodeError):
            return NoSuchKeyError(f"{where}: no such key")
        if isinstance(exc, kz.NodeExistsError):
            return KeyExistsError(f"{where}: key already exists")
        if isinstance(exc, kz.BadVersionError):
            return BadVersionError(f"{where}: the key changed since it was read")
        if isinstance(exc, kz.NotEmptyError):
            return MetadataError(f"{where}: the key has children; delete them first (or use delete_recursive)")
        if isinstance(exc, kz.NoChildrenForEphemeralsError):
            return MetadataError(f"{where}: a parent is an ephemeral key, which cannot have children")
        if isinstance(exc, (kz.NoAuthError, kz.AuthFailedError)):
            hint = (
                f"the credentials of user {self._auth_user!r} do not grant it"
                if self._auth_user
                else "the key has an ACL; set the store option auth='user:password'"
            )
            return MetadataError(f"{where}: not authorized ({type(exc).__name__}): {hint}")
        if isinstance(exc, kz.SessionExpiredError):
            return SessionExpiredError(f"{where}: the ZooKeeper session expired; retry after it is restored")
        if isinstance(exc, (kz.ConnectionLoss, kz.ConnectionClosedError)):
            return MetadataError(f"{where}: connection lost ({exc!r}); the outcome is unknown")
        if isinstance(exc, LedgerStoreError):
            return exc
        return MetadataError(f"{where} failed: {exc!r}")

    def _create(self, path: str, value: bytes, ephemeral: bool = False) -> Any:
        return self.client.create_async(
            path, value, acl=self._acl, ephemeral=ephemeral, makepath=True, include_data=True
        )

    # --- the contract ------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned | None:
        path = self._path(key)
        try:
            data, stat = await self._call(self.client.get_async(path), "get", key)
        except NoSuchKeyError:
            return None
        return Versioned(data or b"", stat.mzxid)

    async def put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        path = self._path(key)
        client = self.client
        if expected_version is None:
            for _ in range(_MAX_RACE_RETRIES):
                try:
                    stat = await self._call(client.set_async(path, value, -1), "put", key)
                    return int(stat.mzxid)
                except NoSuchKeyError:
                    pass
                try:
                    _, stat = await self._call(self._create(path, value), "put", key)
                    return int(stat.mzxid)
                except KeyExistsError:
                    continue  # created by someone else meanwhile: overwrite it
            raise MetadataError(f"put of {key}: the key kept being deleted and re-created; gave up")
        if expected_version == NOT_EXISTS:
            _, stat = await self._call(self._create(path, value), "create-if-absent", key)
            return int(stat.mzxid)
        stat = await self._call(client.exists_async(path), "compare-and-set", key)
        if stat is None:
            raise BadVersionError(f"compare-and-set of {key} at version {expected_version}: the key no longer exists")
        if stat.mzxid != expected_version:
            raise BadVersionError(
                f"compare-and-set of {key}: expected version {expected_version}, found {stat.mzxid}"
            )
        try:
            new = await self._call(client.set_async(path, value, stat.version), "compare-and-set", key)
        except NoSuchKeyError:
            raise BadVersionError(f"compare-and-set of {key}: the key was deleted concurrently") from None
        return int(new.mzxid)

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        path = self._path(key)
        client = self.client
        if expected_version is None:
            await self._call(client.delete_async(path, -1), "delete", key)
            return
        stat = await self._call(client.exists_async(path), "delete", key)
        if stat is None:
            raise NoSuchKeyError(f"delete of {key} on ZooKeeper {self.hosts}: no such key")
        if stat.mzxid != expected_version:
            raise BadVersionError(f"delete of {key}: expected version {expected_version}, found {stat.mzxid}")
        await self._call(client.delete_async(path, stat.version), "delete", key)

    async def children(self, key: str) -> list[str]:
        path = self._path(key)
        try:
            names = await self._call(self.client.get_children_async(path), "children", key)
        except NoSuchKeyError:
            return []
        return sorted(names)

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        path = self._path(key)
        client = self.client
        for _ in range(_MAX_RACE_RETRIES):
            try:
                _, stat = await self._call(self._create(path, value, ephemeral=True), "put_ephemeral", key)
                return int(stat.mzxid)
            except KeyExistsError:
                pass
            stat = await self._call(client.exists_async(path), "put_ephemeral", key)
            if stat is None:
                continue
            try:
                if stat.ephemeralOwner and stat.ephemeralOwner == self.session_id:
                    new = await self._call(client.set_async(path, value, stat.version), "put_ephemeral", key)
                    return int(new.mzxid)
                # A persistent key or another session's: replace it by ours.
                await self._call(client.delete_async(path, stat.version), "put_ephemeral", key)
            except (BadVersionError, NoSuchKeyError):
                continue
        raise MetadataError(f"put_ephemeral of {key}: the key kept changing under us; gave up")

    async def next_id(self, name: str) -> int:
        if not name or "/" in name:
            raise InvalidArgumentError(f"counter names are non-empty and contain no '/', got {name!r}")
        path = f"{self._counters}/{name}"
        client = self.client
        # Every set bumps stat.version by exactly one on the server, so the version a set returns
        # is ours alone: one round trip per id, no CAS retries under contention.
        for _ in range(_MAX_RACE_RETRIES):
            try:
                stat = await self._call(client.set_async(path, b"", -1), "next_id", name)
            except NoSuchKeyError:
                try:
                    await self._call(client.create_async(path, b"", acl=self._acl, makepath=True), "next_id", name)
                except KeyExistsError:
                    pass
                continue
            if stat.version <= 0:
                raise MetadataError(
                    f"counter {name!r} in {self._counters} is exhausted (ZooKeeper versions are 32-bit)"
                )
            return int(stat.version)
        raise MetadataError(f"next_id({name!r}): could not create the counter node {path}")

    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        path = self._path(prefix)
        sub = _Subscription(self, path, callback)
        existing = self._subs.get(path, ())
        self._subs = {**self._subs, path: (*existing, sub)}
        if not existing:
            try:
                await self._call(self.client.add_watch_async(path), "watch", prefix)
            except BaseException:
                sub.cancel()
                raise
        return sub

    def _drop_subscription(self, sub: _Subscription) -> None:
        remaining = tuple(s for s in self._subs.get(sub.path, ()) if s is not sub)
        subs = dict(self._subs)
        if remaining:
            subs[sub.path] = remaining
        else:
            subs.pop(sub.path, None)
        self._subs = subs
        if not remaining and self._client is not None and self._client.connected:
            # Best effort: a stale server-side watch only costs events we then drop.
            self._client.remove_persistent_watch_async(sub.path)

    def _dispatch_event(self, event_type: int, path: str) -> None:
        # On kazoo's reader thread: match and hand over to the loop, nothing else.
        etype = _EVENT_TYPES.get(event_type)
        loop = self._loop
        if etype is None or loop is None:
            return
        matched = [
            sub
            for watched, subs in self._subs.items()
            if path == watched or path.startswith(watched + "/")
            for sub in subs
        ]
        if matched:
            note = Notification(etype, self._key(path))
            try:
                loop.call_soon_threadsafe(self._deliver, matched, note)
            except RuntimeError:  # loop closed: nobody is listening any more
                pass

    @staticmethod
    def _deliver(subs: list[_Subscription], note: Notification) -> None:
        for sub in subs:
            if not sub.cancelled:
                try:
                    sub.callback(note)
                except Exception:
                    log.exception("metadata watch callback %r failed on %s", sub.callback, note)

    def __repr__(self) -> str:
        return f"<ZooKeeperMetadataStore {self.uri}>"

