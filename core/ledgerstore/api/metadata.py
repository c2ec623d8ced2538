"""The MetadataStore interface: a small versioned key-value primitive.

Modelled on Pulsar's pluggable metadata store (PIP-45). Core builds every BookKeeper manager
(ledgers, bookie registration, cookies, logs, under-replication, auditor election) on top of it,
once for all backends.

Keys are absolute, ``/``-separated paths relative to the store's root (``/ledgers/00/0000/L0001``).
Values are bytes. Every stored value has an integer *version* that changes on every write; the
version's numbering is the backend's own (a ZooKeeper ``stat.version``, an etcd ``mod_revision``, a
sqlite counter) and is only ever compared for equality.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, Final

from ledgerstore.api.options import options_for

#: ``expected_version`` meaning "the key must not exist yet" (create-if-absent).
NOT_EXISTS: Final = -1
#: ``expected_version`` meaning "whatever the current version is" (unconditional write).
ANY_VERSION: Final = None
#: names per answer of :meth:`MetadataStore.iter_children` unless the caller asks otherwise
CHILDREN_PAGE: Final = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Versioned:
    """A value together with the version it was read at."""

    value: bytes
    version: int


class EventType(enum.Enum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclasses.dataclass(frozen=True, slots=True)
class Notification:
    """A change seen by a watch. ``key`` is the full key that changed."""

    type: EventType
    key: str


class SessionEvent(enum.StrEnum):
    """What a store tells its session listeners, in this order for one outage.

    The values equal the strings earlier versions passed, so ``event == "lost"`` keeps working.
    """

    #: the session is gone, and with it every ephemeral key this store created; watches may
    #: have missed changes. Owners of ephemeral keys stop acting on them (a bookie refuses adds).
    LOST = "lost"
    #: a new session is established and watches deliver again; owners re-create their
    #: ephemeral keys (a bookie re-registers) and re-read what they watch.
    RESTORED = "restored"


NotificationCallback = Callable[[Notification], None]
SessionListener = Callable[[SessionEvent], None]
"""Called with :attr:`SessionEvent.LOST` when the session (and so every ephemeral key) is gone,
and :attr:`SessionEvent.RESTORED` when a new session is established."""


class Subscription(abc.ABC):
    """Handle of a watch; ``cancel()`` stops further callbacks."""

    @abc.abstractmethod
    def cancel(self) -> None: ...


class MetadataStore(abc.ABC):
    """Versioned key-value store with compare-and-set, ephemeral keys and change notifications.

    Every backend understands the option ``session_timeout`` (seconds): how long after its
    process dies its ephemeral keys may outlive it.

    Backends are constructed from a URI (``sqlite:///path.db``, ``zk://host:port/root``,
    ``etcd://host:port/prefix``) and keyword options, then ``await start()``-ed. All methods are
    coroutines that are safe to call concurrently from one event loop.

    Errors: every method may raise :class:`~ledgerstore.errors.MetadataError` when the backend is
    unreachable; the conditional operations raise :class:`~ledgerstore.errors.BadVersionError`
    (or its subclass :class:`~ledgerstore.errors.KeyExistsError` for create-if-absent).
    """

    #: the URI schemes this backend serves, e.g. ``("zk",)``
    schemes: tuple[str, ...] = ()

    # --- capabilities: what the backend guarantees beyond the abstract methods. Core and the
    # conformance suite read these flags instead of testing for methods or backend names.

    #: :meth:`watch` delivers changes made by other clients (a backend without it still
    #: implements ``watch`` but callers must poll)
    supports_watches: ClassVar[bool] = True
    #: the backend detects the loss and restoration of its session and tells listeners with
    #: :class:`SessionEvent` (without it, ephemeral keys can vanish unannounced)
    supports_session_events: ClassVar[bool] = False
    #: the backend can reach its server over TLS (options name the certificates)
    supports_tls: ClassVar[bool] = False

    def __init__(self, uri: str, options: Any = None, /, **values: Any) -> None:
        """``options``: the instance of the store's ``Options`` dataclass the host parsed from the
        ``metadata_options`` table (a store built in code may pass the table as keyword arguments
        instead, parsed by the same rules: :func:`~ledgerstore.api.options.options_for`)."""
        self.uri = uri
        #: the store's parsed options (its ``Options`` instance; a dict for a store without one)
        self.options = options_for(type(self), options, values, f"metadata plugin {uri.partition(':')[0]!r}")

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect and establish the session. Idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session (its ephemeral keys vanish) and release resources. Idempotent."""

    @abc.abstractmethod
    async def get(self, key: str) -> Versioned | None:
        """Return the value and version of ``key``, or ``None`` if it does not exist."""

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, expected_version: int | None = ANY_VERSION) -> int:
        """Write ``value`` and return the new version.

        ``expected_version`` is :data:`ANY_VERSION` (unconditional), :data:`NOT_EXISTS`
        (create-if-absent; :class:`KeyExistsError` if present) or a version previously read
        (compare-and-set; :class:`BadVersionError` if the key changed or vanished since).
        Missing parent keys are implied: backends create whatever intermediate structure they need.
        """

    @abc.abstractmethod
    async def delete(self, key: str, expected_version: int | None = ANY_VERSION) -> None:
        """Delete ``key``. :class:`NoSuchKeyError` if absent; :class:`BadVersionError` if the
        version differs from ``expected_version`` (when one is given)."""

    @abc.abstractmethod
    async def children(self, key: str) -> list[str]:
        """Names (not full keys) of the direct children of ``key``, sorted; ``[]`` if none.

        ``/a/b`` is a child of ``/a`` whether or not ``/a`` itself holds a value.
        """

    @abc.abstractmethod
    async def put_ephemeral(self, key: str, value: bytes) -> int:
        """Create or overwrite ``key`` bound to this store's session; it disappears when the
        session ends (close, process death, expiry). Returns the version."""

    @abc.abstractmethod
    async def watch(self, prefix: str, callback: NotificationCallback) -> Subscription:
        """Call ``callback`` (on the event loop) for every change to ``prefix`` or any key below it,
        made by this or any other client, until the subscription is cancelled. Delivery is at least
        once and in order per key; callers re-read the key to learn the new value."""

    @abc.abstractmethod
    async def next_id(self, name: str) -> int:
        """Allocate the next value of the monotonic counter ``name`` (first value 1).
        Never returns the same value twice, across processes and restarts."""

    def add_session_listener(self, listener: SessionListener) -> None:
        """Register a callback for session loss/restoration (see :data:`SessionListener`); only
        backends with :attr:`supports_session_events` ever call it."""
        self._session_listeners().append(listener)

    def _session_listeners(self) -> list[SessionListener]:
        listeners: list[SessionListener] | None = getattr(self, "_ls_listeners", None)
        if listeners is None:
            listeners = []
            self._ls_listeners = listeners
        return listeners

    def _fire_session_event(self, event: SessionEvent | str) -> None:
        """For backends: tell listeners the session was lost or restored (a
        :class:`SessionEvent`; its string value is accepted too)."""
        event = SessionEvent(event)
        for listener in list(self._session_listeners()):
            listener(event)

    # --- conveniences built on the primitives (backends may override for speed) ---------------

    async def children_page(self, key: str, start_after: str | None = None, limit: int = CHILDREN_PAGE) -> list[str]:
        """At most ``limit`` names of the direct children of ``key`` that sort after
        ``start_after`` (all of them when it is None), sorted: one page of :meth:`children`.

        This default reads the whole list and cuts it; a backend that can range over its keys
        (etcd, sqlite) overrides it so a page costs a page. ZooKeeper cannot page a
        ``getChildren``: there the callers' key layouts keep every list small (the ledger
        layout's levels hold at most 10,000 names)."""
        if limit < 1:
            raise ValueError(f"a page holds at least one name, asked for {limit}")
        names = await self.children(key)
        if start_after is not None:
            names = [n for n in names if n > start_after]
        return names[:limit]

    async def iter_children(self, key: str, page_size: int = CHILDREN_PAGE) -> AsyncIterator[str]:
        """The names of the direct children of ``key``, sorted, read ``page_size`` at a time
        (:meth:`children_page`), so no answer holds more than one page. A child created or
        deleted during the walk may or may not be seen; every child present throughout is."""
        after: str | None = None
        while True:
            page = await self.children_page(key, after, page_size)
            for name in page:
                yield name
            if len(page) < page_size:
                return
            after = page[-1]

    async def delete_recursive(self, key: str) -> None:
        """Delete ``key`` and everything below it (no versions checked)."""
        for child in await self.children(key):
            await self.delete_recursive(f"{key.rstrip('/')}/{child}")
        from ledgerstore.errors import NoSuchKeyError

        try:
            await self.delete(key)
        except NoSuchKeyError:
            pass


AsyncCallable = Callable[[], Awaitable[None]]
