"""The ``memory`` MetadataStore: a process-local, named, versioned key-value namespace.

``memory://NAME`` names a namespace that lives as long as the process (or until
:func:`drop_namespace`). Every store built with the same NAME in the process sees the same keys,
whichever thread or event loop it runs on, so an application, its client and in-process bookies
can share one namespace in a notebook or a unit test without any server.

Concurrency: one :class:`threading.Lock` per namespace guards every read and write, so a
compare-and-set is a single critical section. Watch callbacks are handed to the watcher's own
event loop with ``loop.call_soon_threadsafe`` while the lock is held, which keeps notifications for
one key in commit order even when writers run on several threads.

Sessions: each started store owns one session; its ephemeral keys vanish when it is closed, when
:meth:`MemoryMetadataStore.expire_session` simulates an expiry, or when the store is garbage
collected without being closed (the analogue of a crashed process whose session times out).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Final

from ledgerstore.api import (
    NOT_EXISTS,
    EventType,
    MetadataStore,
    Notification,
    NotificationCallback,
    SessionEvent,
    Subscription,
    Versioned,
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

__all__ = ["MemoryMetadataStore", "drop_namespace", "namespace_names"]

log = logging.getLogger(__name__)

SCHEME: Final = "memory"
_PREFIX: Final = SCHEME + "://"


def namespace_from_uri(uri: str) -> str:
    """The namespace NAME of a ``memory://NAME`` URI."""
    if not uri.startswith(_PREFIX):
        raise ConfigError(f"memory metadata URI {uri!r} must start with {_PREFIX!r}, e.g. memory://my-test")
    name = uri[len(_PREFIX) :]
    if not name:
        raise ConfigError(
            f"memory metadata URI {uri!r} names no namespace; use memory://NAME "
            "(every store with the same NAME in this process shares its keys)"
        )
    return name


def _norm_key(key: str) -> str:
    if not isinstance(key, str) or not key.startswith("/"):
        raise InvalidArgumentError(f"metadata key {key!r} must be an absolute path starting with '/'")
    if len(key) > 1:
        key = key.rstrip("/") or "/"
    if "//" in key:
        raise InvalidArgumentError(f"metadata key {key!r} has an empty path segment ('//')")
    return key


def _lineage(key: str) -> list[tuple[str, str, str]]:
    """``(path, parent, name)`` for each path from the top-level ancestor of ``key`` down to
    ``key`` itself (``/`` excluded): ``/a/b`` gives ``(/a, /, a)`` and ``(/a/b, /a, b)``."""
    if key == "/":
        return []
    steps = []
    parent = "/"
    path = ""
    for part in key[1:].split("/"):
        path = f"{path}/{part}"
        steps.append((path, parent, part))
        parent = path
    return steps


def _as_bytes(value: object, key: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidArgumentError(f"value for {key} must be bytes, got {type(value).__name__}")


class _Entry:
    __slots__ = ("value", "version", "owner")

    def __init__(self, value: bytes, version: int, owner: int | None) -> None:
        self.value = value
        self.version = version
        #: the session owning this ephemeral key, ``None`` for a persistent key
        self.owner = owner


class _Watch(Subscription):
    """A subscription delivering to the event loop that called :meth:`MemoryMetadataStore.watch`."""

    __slots__ = ("prefix", "callback", "loop", "store_id", "active", "_namespace")

    def __init__(
        self,
        namespace: _Namespace,
        prefix: str,
        callback: NotificationCallback,
        loop: asyncio.AbstractEventLoop,
        store_id: int,
    ) -> None:
        self._namespace = namespace
        self.prefix = prefix
        self.callback = callback
        self.loop = loop
        self.store_id = store_id
        self.active = True

    def matches(self, key: str) -> bool:
        p = self.prefix
        return p == "/" or key == p or key.startswith(p + "/")

    def deliver(self, notification: Notification) -> None:
        # Checked on the loop, so cancel() also stops notifications already queued.
        if not self.active:
            return
        try:
            self.callback(notification)
        except Exception:
            log.exception("memory metadata watch on %s: callback failed on %s", self.prefix, notification)

    def cancel(self) -> None:
        """Stop callbacks, including those already queued on the loop. Idempotent."""
        self.active = False
        self._namespace.remove_watch(self)


class _Namespace:
    """The shared state behind every store of one NAME. Public methods take the lock."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._data: dict[str, _Entry] = {}
        # Number of keys at or below each path, and the names under each path that have any:
        # children() of implied parents without scanning every key.
        self._subtree: dict[str, int] = {}
        self._kids: dict[str, set[str]] = {}
        self._revision = 0
        self._counters: dict[str, int] = {}
        self._sessions: dict[int, set[str]] = {}
        self._session_ids = itertools.count(1)
        self._store_ids = itertools.count(1)
        self._watches: list[_Watch] = []
        # (store id, session id) of stores garbage-collected while open. Appended from a weakref
        # finalizer, which may run on any thread at any allocation, even one made while this
        # thread holds the lock: so it only appends (atomic) and the next locked call reaps.
        self.dead: list[tuple[int, int]] = []

    # --- sessions and stores -------------------------------------------------------------------

    def new_store_id(self) -> int:
        with self._lock:
            return next(self._store_ids)

    def open_session(self) -> int:
        with self._lock:
            self._reap()
            sid = next(self._session_ids)
            self._sessions[sid] = set()
            return sid

    def end_session(self, session: int) -> None:
        """Delete the session's ephemeral keys (watchers see DELETED)."""
        with self._lock:
            self._reap()
            self._end_session_locked(session)

    def close_store(self, store_id: int, session: int | None) -> None:
        with self._lock:
            self._reap()
            if session is not None:
                self._end_session_locked(session)
            self._drop_watches_locked(store_id)

    def _end_session_locked(self, session: int) -> None:
        for key in sorted(self._sessions.pop(session, ())):
            self._remove_locked(key)

    def _drop_watches_locked(self, store_id: int) -> None:
        for w in self._watches:
            if w.store_id == store_id:
                w.active = False
        self._watches = [w for w in self._watches if w.active]

    def _reap(self) -> None:
        while self.dead:
            store_id, session = self.dead.pop()
            log.info("memory metadata %r: a store was garbage-collected without close(); ending its session",
                     self.name)
            self._end_session_locked(session)
            self._drop_watches_locked(store_id)

    # --- the primitives ------------------------------------------------------------------------

    def get(self, key: str) -> Versioned | None:
        with self._lock:
            self._reap()
            e = self._data.get(key)
            return None if e is None else Versioned(e.value, e.version)

    def put(self, key: str, value: bytes, expected: int | None, session: int, ephemeral: bool) -> int:
        with self._lock:
            self._reap()
            if ephemeral and session not in self._sessions:
                raise SessionExpiredError(
                    f"cannot put ephemeral {key}: session {session} of namespace {self.name!r} has expired"
                )
            cur = self._data.get(key)
            if expected == NOT_EXISTS:
                if cur is not None:
                    raise KeyExistsError(f"cannot create {key}: it already exists (version {cur.version})")
            elif expected is not None:
                if cur is None:
                    raise BadVersionError(
                        f"cannot put {key} at version {expected}: the key does not exist; re-read and retry"
                    )
                if cur.version != expected:
                    raise BadVersionError(
                        f"cannot put {key}: expected version {expected}, found {cur.version}; re-read and retry"
                    )
            self._revision += 1
            version = self._revision
            if cur is None:
                owner = session if ephemeral else None
                self._data[key] = _Entry(value, version, owner)
                self._index_add_locked(key)
                if owner is not None:
                    self._sessions[owner].add(key)
                self._notify_locked(EventType.CREATED, key)
                return version
            # A plain put on an ephemeral key keeps it ephemeral (as in ZooKeeper);
            # put_ephemeral takes it over for the caller's session.
            if ephemeral and cur.owner != session:
                if cur.owner is not None:
                    self._sessions.get(cur.owner, set()).discard(key)
                cur.owner = session
                self._sessions[session].add(key)
            cur.value, cur.version = value, version
            self._notify_locked(EventType.MODIFIED, key)
            return version

    def delete(self, key: str, expected: int | None) -> None:
        with self._lock:
            self._reap()
            cur = self._data.get(key)
            if cur is None:
                raise NoSuchKeyError(f"cannot delete {key}: no such key")
            if expected is not None and cur.version != expected:
                raise BadVersionError(
                    f"cannot delete {key}: expected version {expected}, found {cur.version}; re-read and retry"
                )
            self._remove_locked(key)

    def delete_tree(self, key: str) -> None:
        with self._lock:
            self._reap()
            doomed = [key] if key in self._data else []
            doomed.extend(self._keys_below_locked(key))
            # Deepest first, as a recursive delete would emit them.
            for k in sorted(doomed, key=lambda k: (-k.count("/"), k)):
                self._remove_locked(k)

    def children(self, key: str) -> list[str]:
        with self._lock:
            self._reap()
            return sorted(self._kids.get(key, ()))

    def next_id(self, name: str) -> int:
        with self._lock:
            self._reap()
            value = self._counters.get(name, 0) + 1
            self._counters[name] = value
            return value

    def add_watch(self, watch: _Watch) -> None:
        with self._lock:
            self._reap()
            self._watches.append(watch)

    def remove_watch(self, watch: _Watch) -> None:
        with self._lock:
            self._watches = [w for w in self._watches if w is not watch]

    # --- internals (lock held) -----------------------------------------------------------------

    def _keys_below_locked(self, key: str) -> Iterable[str]:
        stack = [key]
        while stack:
            path = stack.pop()
            base = "" if path == "/" else path
            for name in self._kids.get(path, ()):
                child = f"{base}/{name}"
                if child in self._data:
                    yield child
                stack.append(child)

    def _index_add_locked(self, key: str) -> None:
        self._subtree["/"] = self._subtree.get("/", 0) + 1
        for path, parent, name in _lineage(key):
            count = self._subtree.get(path, 0) + 1
            self._subtree[path] = count
            if count == 1:
                self._kids.setdefault(parent, set()).add(name)

    def _index_remove_locked(self, key: str) -> None:
        self._subtree["/"] -= 1
        for path, parent, name in _lineage(key):
            count = self._subtree[path] - 1
            if count:
                self._subtree[path] = count
                continue
            del self._subtree[path]
            kids = self._kids[parent]
            kids.discard(name)
            if not kids:
                del self._kids[parent]

    def _remove_locked(self, key: str) -> None:
        entry = self._data.pop(key, None)
        if entry is None:
            return
        if entry.owner is not None:
            self._sessions.get(entry.owner, set()).discard(key)
        self._revision += 1
        self._index_remove_locked(key)
        self._notify_locked(EventType.DELETED, key)

    def _notify_locked(self, kind: EventType, key: str) -> None:
        if not self._watches:
            return
        notification = Notification(kind, key)
        gone = False
        for w in self._watches:
            if not w.matches(key):
                continue
            try:
                w.loop.call_soon_threadsafe(w.deliver, notification)
            except RuntimeError:  # the watcher's loop is closed: nobody is left to tell
                w.active = False
                gone = True
        if gone:
            self._watches = [w for w in self._watches if w.active]


_registry_lock = threading.Lock()
_registry: dict[str, _Namespace] = {}


def _namespace(name: str) -> _Namespace:
    with _registry_lock:
        ns = _registry.get(name)
        if ns is None:
            ns = _registry[name] = _Namespace(name)
        return ns


def drop_namespace(name: str) -> bool:
    """Forget the namespace ``name``; stores created afterwards with that name start empty.

    Stores still open on it keep working on the detached contents until they are closed.
    Returns whether the namespace existed. Useful in test teardown.
    """
    with _registry_lock:
        return _registry.pop(name, None) is not None


def namespace_names() -> list[str]:
    """Names of the namespaces that exist in this process, sorted."""
    with _registry_lock:
        return sorted(_registry)


class MemoryMetadataStore(MetadataStore):
    """MetadataStore held in this process's memory, shared by every store of the same name.

    ``uri``: ``memory://NAME``. No options. Nothing is persisted: the namespace lives until the
    process exits or :func:`drop_namespace` is called, so ``next_id`` is unique for the life of
    the process only. Versions are values of one revision counter per namespace, so a key
    deleted and created again never repeats a version.

    Each operation yields to the event loop once before it takes effect, as a call to a remote
    store would, so concurrent coroutines interleave the way they do against a real backend.
    """

    schemes = (SCHEME,)
    supports_session_events = True

    @dataclasses.dataclass(frozen=True)
    class Options:
        """The memory store takes no options."""

    def __init__(self, uri: str, options: MemoryMetadataStore.Options | None = None, /, **values: Any) -> None:
        # ledgerstore parses the (empty) option table into Options: an unknown option is refused
        # there, naming the plugin and the option
        super().__init__(uri, options, **values)
        self.name = namespace_from_uri(uri)
        self._ns = _namespace(self.name)
        self._store_id = self._ns.new_store_id()
        self._session: int | None = None
        self._finalizer: weakref.finalize | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"session {self._session}" if self._session else "not started"
        return f"MemoryMetadataStore({self.uri!r}, {state})"

    @property
    def session_id(self) -> int | None:
        """This store's current session (``None`` before ``start()`` and after ``close()``)."""
        return self._session

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open a session in the namespace. Idempotent."""
        if self._closed:
            raise MetadataError(f"memory metadata store {self.uri} is closed; create a new store to reconnect")
        if self._session is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._open_session()

    async def close(self) -> None:
        """End the session (its ephemeral keys vanish, watchers see them deleted) and cancel this
        store's watches. The namespace and its other keys stay. Idempotent."""
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._ns.close_store(self._store_id, session)

    def expire_session(self) -> None:
        """Simulate a session expiry, as a ZooKeeper server or etcd lease timeout would cause.

        This session's ephemeral keys vanish at once; a new session replaces it; session
        listeners are then told ``SessionEvent.LOST`` and ``SessionEvent.RESTORED``, in that order, on the loop the store
        was started on. Callable from any thread. Watches stay in place.
        """
        if self._closed or self._session is None or self._loop is None:
            raise MetadataError(f"memory metadata store {self.uri} has no session to expire (not started or closed)")
        old = self._session
        self._open_session()
        self._ns.end_session(old)
        for event in (SessionEvent.LOST, SessionEvent.RESTORED):
            self._loop.call_soon_threadsafe(self._tell_listeners, event)

    def _open_session(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        self._session = self._ns.open_session()
        # Must not reference self, or the store could never be collected.
        self._finalizer = weakref.finalize(self, self._ns.dead.append, (self._store_id, self._session))

    def _tell_listeners(self, event: SessionEvent) -> None:
        try:
            self._fire_session_event(event)
        except Exception:
            log.exception("memory metadata store %s: a session listener failed on %r", self.uri, event)

    async def _enter(self, what: str) -> int:
        await asyncio.sleep(0)
        session = self._session
        if session is None:
            state = "closed" if self._closed else "not started (await store.start() first)"
            raise MetadataError(f"memory metadata store {self.uri} is {state}; cannot {what}")
        return session

    # --- the primitives ------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned | None:
        """Value and version of ``key``, or ``None``."""
        key = _norm_key(key)
        await self._enter(f"get {key}")
        return self._ns.get(key)

    async def put(self, key: str, value: bytes, expected_version: int | None = None) -> int:
        """Write ``value``; see :meth:`MetadataStore.put` for ``expected_version``."""
        key = _norm_key(key)
        data = _as_bytes(value, key)
        session = await self._enter(f"put {key}")
        return self._ns.put(key, data, expected_version, session, ephemeral=False)

    async def put_ephemeral(self, key: str, value: bytes) -> int:
        """Create or overwrite ``key`` owned by this store's session."""
        key = _norm_key(key)
        data = _as_bytes(value, key)
        session = await self._enter(f"put_ephemeral {key}")
        return self._ns.put(key, data, None, session, ephemeral=True)

    async def delete(self, key: str, expected_version: int | None = None) -> None:
        """Delete ``key``; :class:`NoSuchKeyError` if absent, :class:`BadVersionError` on a
        version mismatch. Keys below ``key`` are separate keys and stay."""
        key = _norm_key(key)
        await self._enter(f"delete {key}")
        self._ns.delete(key, expected_version)

    async def delete_recursive(self, key: str) -> None:
        """Delete ``key`` and every key below it, atomically."""
        key = _norm_key(key)
        await self._enter(f"delete_recursive {key}")
        self._ns.delete_tree(key)

    async def children(self, key: str) -> list[str]:
        """Sorted names of the direct children of ``key`` (valued or implied by deeper keys)."""
        key = _norm_key(key)
        await self._enter(f"children {key}")
        return self._ns.children(key)

    async def next_id(self, name: str) -> int:
        """Next value of counter ``name`` in this namespace, starting at 1."""
        await self._enter(f"next_id {name!r}")
        return self._ns.next_id(name)

    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        """Call ``callback`` on the calling loop for each change at or below ``prefix`` (on path
        boundaries: ``/w`` sees ``/w`` and ``/w/x``, not ``/wx``) made after this call returns,
        by any store of the namespace on any thread."""
        prefix = _norm_key(prefix)
        await self._enter(f"watch {prefix}")
        w = _Watch(self._ns, prefix, callback, asyncio.get_running_loop(), self._store_id)
        self._ns.add_watch(w)
        return w
