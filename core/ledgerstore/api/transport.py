"""The Transport interface: moves opaque frames between clients and bookies.

A transport never defines messages: frames are bytes made by :mod:`ledgerstore.proto.codec`.
It owns framing on the wire, connection set-up, security (TLS, CURVE), the maximum frame size
(enforced *before* allocating a frame's buffer) and coalescing many frames into few syscalls.
Request ids, pipelining, timeouts and reconnects are done once in core
(:mod:`ledgerstore.client.channel`) on top of any transport.

Addresses are URIs whose scheme names the transport: ``tcp://127.0.0.1:3181``,
``tcp+tls://host:3181``, ``zmq://host:3181``.

Options. A transport declares its option table (TLS files, CURVE keys, buffer sizes) as an
``Options`` dataclass; the host parses the table once (:func:`ledgerstore.plugins.create_transport`)
and hands the instance to the constructor, with ``max_frame_size``, which is the host's setting for
both sides. What a bookie allows its peers (connections open at once, idle time, bytes of frames
not yet finished) is the bookie's setting, not the transport's: it reaches the server as a
:class:`ServerLimits` value given to :meth:`Transport.serve`, and the transport enforces it.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from ledgerstore.api.options import options_for

#: Default largest frame accepted, in bytes (BookKeeper's nettyMaxFrameSizeBytes is 5 MB).
DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class ServerLimits:
    """What a bookie allows the peers of its server transport: the bookie's settings of the same
    names (``[bookie]`` table, checked there), given to :meth:`Transport.serve`. A transport
    enforces those its wire allows and says which in its documentation (``docs/transports.md``):
    ``tcp`` enforces all four; ``zmq``, whose framing and connections libzmq owns, none."""

    #: bytes of unfinished frames buffered across all connections; past it the connection whose
    #: unfinished frame is the oldest is closed
    max_unfinished_frame_bytes: int = 256 * 1024 * 1024
    #: seconds a connection may take to finish a frame it began
    unfinished_frame_timeout_s: float = 30.0
    #: connections open at once; one accepted past it is closed at once
    max_connections: int = 10_000
    #: seconds a connection may send and receive nothing before it is closed
    idle_connection_timeout_s: float = 600.0


class Connection(abc.ABC):
    """One client-side connection to a bookie."""

    @abc.abstractmethod
    def send(self, frame: bytes) -> None:
        """Queue ``frame`` for sending without blocking. Frames queued in the same event-loop
        iteration should go out in as few writes as possible. Raises
        :class:`~ledgerstore.errors.BookieUnavailableError` if the connection is closed."""

    def send_parts(self, parts: Sequence[bytes]) -> None:
        """Queue the frame made of ``parts`` in order, as :meth:`send` does. Transports that can
        write the parts as they are (a vectored write) override this; by default they are joined."""
        self.send(b"".join(parts))

    @abc.abstractmethod
    async def drain(self) -> None:
        """Wait until the send buffer is below the high-water mark (backpressure)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection; the ``on_close`` callback given to ``connect`` is called once."""

    @property
    @abc.abstractmethod
    def is_closed(self) -> bool: ...


class ServerConnection(Protocol):
    """What a bookie sees of one accepted peer."""

    peer: str

    def send(self, frame: bytes) -> None:
        """Queue a response frame (never blocks; may be dropped if the peer is gone)."""

    def close(self) -> None:
        """Close this peer's connection only."""


class FrameHandler(Protocol):
    """Implemented by the bookie; called by server transports on the event loop."""

    def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
        """A batch of complete frames arrived from ``conn``, in order."""

    def connection_lost(self, conn: ServerConnection) -> None:
        """``conn`` is gone; drop any state kept for it."""


class Server(abc.ABC):
    """A listening server returned by :meth:`Transport.serve`."""

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """The bound address as a URI (with the real port when 0 was asked for)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop accepting, close every connection. Idempotent."""

    def abort(self) -> None:
        """Stop accepting and drop every connection at once, as the end of the process would
        (the bookie's :meth:`~ledgerstore.bookie.server.Bookie.abort`). By default :meth:`close`
        runs as a task of the running loop; a server that can drop its connections at once
        says so here."""
        asyncio.get_running_loop().create_task(self.close())

    def stats(self) -> dict[str, int]:
        """Counters such as refused (unauthenticated) peers and bad frames."""
        return {}


class Transport(abc.ABC):
    """A transport plugin. One instance serves both sides for its schemes.

    ``options`` come from the ``[transport]`` table of the config (TLS files, CURVE keys, ...),
    parsed once into the plugin's ``Options`` dataclass.
    """

    schemes: tuple[str, ...] = ()

    # --- capabilities: read by the bookie and the conformance suite.

    #: connections are TLS (server and client certificates as options)
    supports_tls: ClassVar[bool] = False
    #: connections are authenticated and encrypted with ZeroMQ CURVE keys
    supports_curve: ClassVar[bool] = False
    #: a server closes the connection of a peer that sends a frame over ``max_frame_size`` and
    #: that peer's client sees it closed (``on_close``). Without it the transport must still drop
    #: the frame unread and keep serving others, but the sender may not be told (sockets that
    #: reconnect by themselves below the transport).
    closes_oversized_senders: ClassVar[bool] = True

    def __init__(self, options: Any = None, /, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 **values: Any) -> None:
        """``options``: the instance of the transport's ``Options`` dataclass the host parsed from
        the ``[transport]`` table (a transport built in code may pass the table as keyword
        arguments instead, parsed by the same rules: :func:`~ledgerstore.api.options.options_for`).
        ``max_frame_size``: the largest frame either side accepts."""
        self.max_frame_size = max_frame_size
        scheme = self.schemes[0] if self.schemes else type(self).__name__
        #: the transport's parsed options (its ``Options`` instance; a dict for one without)
        self.options = options_for(type(self), options, values, f"transport plugin {scheme!r}")

    @abc.abstractmethod
    async def connect(
        self,
        address: str,
        on_frames: Callable[[Sequence[bytes]], None],
        on_close: Callable[[BaseException | None], None],
    ) -> Connection:
        """Open a connection to ``address``. Incoming frames are handed to ``on_frames`` in order;
        ``on_close`` is called once when the connection ends for any reason.
        Raises :class:`~ledgerstore.errors.BookieUnavailableError` if it cannot connect."""

    @abc.abstractmethod
    async def serve(self, address: str, handler: FrameHandler, limits: ServerLimits = ServerLimits()) -> Server:
        """Listen on ``address`` and hand decoded frames to ``handler``, holding the peers to
        ``limits`` (the bookie's; the defaults when none are given). A peer that sends an
        oversized or malformed frame is disconnected; other peers are unaffected."""


def split_address(address: str) -> tuple[str, str, int]:
    """``"tcp://127.0.0.1:3181"`` → ``("tcp", "127.0.0.1", 3181)``."""
    from ledgerstore.errors import ConfigError

    scheme, sep, rest = address.partition("://")
    if not sep:
        raise ConfigError(f"address {address!r} has no scheme; expected e.g. tcp://127.0.0.1:3181")
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"address {address!r} has no port; expected e.g. {scheme}://127.0.0.1:3181")
    return scheme, host.strip("[]") or "127.0.0.1", int(port)
