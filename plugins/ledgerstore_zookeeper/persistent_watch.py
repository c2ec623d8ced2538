"""ZooKeeper 3.6+ persistent recursive watches for kazoo.

kazoo 2.11 (the newest release) has no ``add_watch``. The wire side is small: an ``AddWatch``
request (opcode 106, ``path`` + ``mode``) and a ``RemoveWatches`` request (opcode 18) for removal;
the server then sends ordinary watch events (created / data changed / deleted) for the path and
every node below it, as often as they happen. What kazoo lacks is a place to deliver those events:
its connection hands an event only to one-shot watchers registered for exactly that path, and
drops them afterwards. :class:`PersistentWatchClient` adds that place, by giving its connection
handler a subclass whose ``_read_watch_event`` first offers the event to a dispatch function.

Because watches live on the server per connection, the owner must re-send ``AddWatch`` after
every reconnect (kazoo's own ``SetWatches`` knows nothing of them) - as ZooKeeper's Java client
does, changes made while disconnected are not replayed for recursive watches.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Watch, int_struct, write_string

#: ZooKeeper's AddWatchMode
PERSISTENT = 0
PERSISTENT_RECURSIVE = 1
#: ZooKeeper's WatcherType for RemoveWatches
WATCHER_TYPE_PERSISTENT_RECURSIVE = 5

#: ZooKeeper's watch event types (org.apache.zookeeper.Watcher.Event.EventType)
NODE_CREATED = 1
NODE_DELETED = 2
NODE_DATA_CHANGED = 3

EventDispatcher = Callable[[int, str], None]
"""Called on kazoo's reader thread with (event type, server-side path); must not block."""

if not hasattr(ConnectionHandler, "_read_watch_event"):  # pragma: no cover - guards kazoo upgrades
    raise ImportError(
        "this kazoo release has no ConnectionHandler._read_watch_event; ledgerstore_zookeeper's "
        "persistent watches need kazoo 2.10/2.11 (pip install 'kazoo>=2.10,<2.12')"
    )


class AddWatch(namedtuple("AddWatch", "path mode")):
    """AddWatchRequest (opcode 106); the reply carries no body."""

    type = 106

    def serialize(self) -> bytearray:
        b = bytearray()
        b.extend(write_string(self.path))
        b.extend(int_struct.pack(self.mode))
        return b

    @classmethod
    def deserialize(cls, bytes: bytes, offset: int) -> None:  # noqa: A002 - kazoo's signature
        return None


class RemoveWatches(namedtuple("RemoveWatches", "path watcher_type")):
    """RemoveWatchesRequest (opcode 18); the reply carries no body."""

    type = 18

    def serialize(self) -> bytearray:
        b = bytearray()
        b.extend(write_string(self.path))
        b.extend(int_struct.pack(self.watcher_type))
        return b

    @classmethod
    def deserialize(cls, bytes: bytes, offset: int) -> None:  # noqa: A002 - kazoo's signature
        return None


class _DispatchingConnection(ConnectionHandler):
    def _read_watch_event(self, buffer: bytes, offset: int) -> None:
        dispatch: EventDispatcher | None = getattr(self.client, "persistent_dispatch", None)
        if dispatch is not None and not self.client._stopped.is_set():
            event, _ = Watch.deserialize(buffer, offset)
            dispatch(event.type, event.path)
        super()._read_watch_event(buffer, offset)


class PersistentWatchClient(KazooClient):
    """A KazooClient that can add persistent (recursive) watches.

    Events of every persistent watch go to ``persistent_dispatch`` (set it before adding watches).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.persistent_dispatch: EventDispatcher | None = None
        # Same object, richer class: kazoo builds its handler in __init__ and offers no hook.
        self._connection.__class__ = _DispatchingConnection

    def add_watch_async(self, path: str, mode: int = PERSISTENT_RECURSIVE) -> Any:
        """Send AddWatch for ``path``; returns kazoo's IAsyncResult."""
        result = self.handler.async_result()
        self._call(AddWatch(path, mode), result)
        return result

    def remove_persistent_watch_async(self, path: str) -> Any:
        """Send RemoveWatches for the recursive watch on ``path``; returns kazoo's IAsyncResult."""
        result = self.handler.async_result()
        self._call(RemoveWatches(path, WATCHER_TYPE_PERSISTENT_RECURSIVE), result)
        return result
