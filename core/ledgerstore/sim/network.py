"""The ``sim`` transport: frames between simulated processes, with the network's faults.

Every node (a bookie or a client) gets a :class:`SimTransport` bound to its name; all of them
share one :class:`SimNetwork`, which decides per frame, from the simulation's seeded random
source, when it arrives and whether it is lost, duplicated or overtaken. Links are directed:
``partition(a, b)`` cuts both ways, ``partition(a, b, one_way=True)`` only frames from ``a`` to
``b``. A held node (a paused process) gets and sends nothing until it is released; what was
sent to or by it arrives afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ledgerstore.api.transport import Connection, FrameHandler, Server, ServerLimits, Transport
from ledgerstore.errors import BookieUnavailableError
from ledgerstore.proto import codec
from ledgerstore.sim.trace import Trace

SCHEME = "sim"


@dataclasses.dataclass
class LinkFaults:
    """What the network does to frames on one directed link (defaults: a healthy LAN)."""

    #: one-way latency bounds, in seconds
    min_delay: float = 0.0002
    max_delay: float = 0.002
    #: probability a frame is lost
    drop: float = 0.0
    #: probability a frame is delivered twice
    duplicate: float = 0.0
    #: probability a frame may overtake the frames sent before it on its connection
    reorder: float = 0.0
    #: probability a frame waits for a retransmission (TCP's backoff: 0.2 s doubling up to
    #: 12.8 s); the frames behind it on its connection wait too (head-of-line blocking)
    stall: float = 0.0
    #: probability a frame is late by a heavy-tailed delay (Pareto, shape 1: ``tail_scale`` times
    #: 1/U, so a tenth of them are over ten times the scale) -- a congested or overloaded path;
    #: the frames behind it on its connection wait too, frames on other links pass
    tail: float = 0.0
    tail_scale: float = 1.0
    #: probability a frame makes its connection reset (an overloaded peer or a middlebox drops
    #: it): the frame and everything in flight on the connection are lost, both ends hear of it
    reset: float = 0.0


#: retransmission waits a stalled frame draws from
STALLS = (0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)
#: the longest heavy-tailed delay a frame gets (a connection would be reset past it)
TAIL_CAP = 30.0


def _describe(frame: bytes) -> str:
    if len(frame) < codec.HEADER_SIZE:
        return f"{len(frame)}B"
    _, op, _, rid = codec.HEADER.unpack_from(frame)
    try:
        name = codec.Op(op).name
    except ValueError:
        name = str(op)
    return f"{name}#{rid}"


class SimNetwork:
    """The links between every pair of nodes, the listening servers and the faults."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rng: random.Random, trace: Trace) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.default = LinkFaults()
        self.links: dict[tuple[str, str], LinkFaults] = {}
        self.cut: set[tuple[str, str]] = set()
        self.servers: dict[str, SimServer] = {}
        #: paused nodes → frames waiting for them to wake up
        self.held: dict[str, list[Callable[[], None]]] = {}
        #: held links (one process's sends to one node) → frames waiting to be sent
        self.held_links: dict[tuple[str, str], list[Callable[[], None]]] = {}
        self.sent = 0
        self.lost = 0
        #: a rule for directed tests: called with (source, destination, frame), it returns the
        #: extra delay of that frame in seconds, or ``None`` to lose it
        self.intercept: Callable[[str, str, bytes], float | None] | None = None
        #: one-shot triggers (:meth:`on_send`, :meth:`on_arrive`): (when, source, destination,
        #: opcodes) → action
        self.triggers: dict[tuple[str, str, str, frozenset[int]], Callable[[], None]] = {}
        #: checkers that see every frame as it leaves its process and as it reaches its end
        self.observers: list[FrameObserver] = []
        self._connections = 0

    # --- faults ----------------------------------------------------------------------------------

    def faults(self, src: str, dst: str) -> LinkFaults:
        """The faults of the link ``src`` → ``dst``."""
        return self.links.get((src, dst), self.default)

    def set_faults(self, src: str, dst: str, faults: LinkFaults) -> None:
        self.links[(src, dst)] = faults
        self.trace("net.faults", f"{src}->{dst} {faults}")

    def partition(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Lose every frame from ``a`` to ``b`` (and back, unless ``one_way``)."""
        self.cut.add((a, b))
        if not one_way:
            self.cut.add((b, a))
        self.trace("net.partition", f"{a}{'->' if one_way else '<->'}{b}")

    def reconnect(self, a: str, b: str) -> None:
        """End the partition between ``a`` and ``b`` (both directions)."""
        self.cut.discard((a, b))
        self.cut.discard((b, a))
        self.trace("net.reconnect", f"{a}<->{b}")

    def clear_faults(self, src: str, dst: str) -> None:
        """The link ``src`` → ``dst`` is healthy again."""
        if self.links.pop((src, dst), None) is not None:
            self.trace("net.clear", f"{src}->{dst}")

    def heal(self) -> None:
        """Remove every partition and link fault: a healthy network from now on."""
        self.cut.clear()
        self.links.clear()
        self.default = LinkFaults()
        self.trace("net.heal")
        self.triggers.clear()
        for src, dst in list(self.held_links):
            self.release_link(src, dst)

    def hold(self, node: str) -> None:
        """Pause ``node``: nothing reaches it or leaves it until :meth:`release`."""
        self.held.setdefault(node, [])
        self.trace("net.hold", node)

    def release(self, node: str) -> None:
        """Wake ``node``: what waited for it is delivered now, in order."""
        waiting = self.held.pop(node, [])
        self.trace("net.release", f"{node} {len(waiting)} frames")
        for deliver in waiting:
            deliver()

    def hold_link(self, src: str, dst: str) -> None:
        """Hold what ``src`` sends to ``dst`` (and only that) until :meth:`release_link`: a
        process stopped between two sends, its frames to one bookie not yet written while its
        frames to the others went out; or a connection whose send buffer is full."""
        self.held_links.setdefault((src, dst), [])
        self.trace("net.hold_link", f"{src}->{dst}")

    def release_link(self, src: str, dst: str) -> None:
        """Send, in order, what :meth:`hold_link` held on ``src`` → ``dst``."""
        waiting = self.held_links.pop((src, dst), None)
        if waiting is None:
            return
        self.trace("net.release_link", f"{src}->{dst} {len(waiting)} frames")
        for send in waiting:
            send()

    def on_send(self, src: str, dst: str, ops: frozenset[int], action: Callable[[], None]) -> None:
        """Call ``action`` once, at the moment ``src`` next sends ``dst`` a frame of one of
        ``ops``, before that frame goes out: a fault timed to a protocol step (a process that
        stops just as it sends an add) rather than to a drawn time. The action may hold the
        link or the node; the frame is then held with the rest."""
        self._arm("send", src, dst, ops, action)

    def on_arrive(self, src: str, dst: str, ops: frozenset[int], action: Callable[[], None]) -> None:
        """Call ``action`` once, when the next frame of one of ``ops`` from ``src`` reaches
        ``dst`` (before ``dst`` reads it): a crash timed to the instant a client hears an answer."""
        self._arm("arrive", src, dst, ops, action)

    def disarm(self, src: str, dst: str, ops: frozenset[int]) -> None:
        """Forget the triggers on ``src`` → ``dst`` for ``ops`` (either kind)."""
        for when in ("send", "arrive"):
            self.triggers.pop((when, src, dst, ops), None)

    def _arm(self, when: str, src: str, dst: str, ops: frozenset[int], action: Callable[[], None]) -> None:
        self.triggers[(when, src, dst, ops)] = action
        self.trace(f"net.on_{when}", f"{src}->{dst} {sorted(codec.Op(op).name for op in ops)}")

    def _fire(self, when: str, link: _Link, frame: bytes) -> None:
        if len(frame) < codec.HEADER_SIZE:
            return
        op = codec.HEADER.unpack_from(frame)[1]
        for key in list(self.triggers):
            w, src, dst, ops = key
            if w == when and src == link.src and dst == link.dst and op in ops:
                self.trace("net.triggered", f"{when} {src}->{dst} {_describe(frame)}")
                self.triggers.pop(key)()

    # --- delivery --------------------------------------------------------------------------------

    def transmit(self, link: _Link, frame: bytes) -> None:
        """Send ``frame`` over ``link`` (its far end gets it later, once, twice or never)."""
        self.sent += 1
        if self.triggers:
            self._fire("send", link, frame)
        if link.src in self.held:
            self.held[link.src].append(lambda: self.transmit(link, frame))
            return
        waiting = self.held_links.get((link.src, link.dst))
        if waiting is not None:
            waiting.append(lambda: self.transmit(link, frame))
            return
        for observer in self.observers:
            observer.sent(link.src, link.dst, link.conn, frame)
        # the frame is described only for the trace lines that name it (most frames get none)
        if (link.src, link.dst) in self.cut:
            self.lost += 1
            self.trace("net.cut", f"{link.src}->{link.dst} {_describe(frame)}")
            return
        extra = 0.0
        if self.intercept is not None:
            verdict = self.intercept(link.src, link.dst, frame)
            if verdict is None:
                self.lost += 1
                self.trace("net.intercepted", f"{link.src}->{link.dst} {_describe(frame)}")
                return
            extra = verdict
        f = self.faults(link.src, link.dst)
        rng = self.rng
        if f.drop and rng.random() < f.drop:
            self.lost += 1
            self.trace("net.drop", f"{link.src}->{link.dst} {_describe(frame)}")
            return
        if f.reset and rng.random() < f.reset and link.reset is not None:
            self.lost += 1
            self.trace("net.reset", f"{link.src}->{link.dst} {_describe(frame)}")
            link.reset()
            return
        copies = 2 if f.duplicate and rng.random() < f.duplicate else 1
        for i in range(copies):
            at = self.loop.time() + rng.uniform(f.min_delay, f.max_delay) + extra
            if f.stall and rng.random() < f.stall:
                at += rng.choice(STALLS)
                self.trace("net.stall", f"{link.src}->{link.dst} {_describe(frame)} until {at:.3f}")
            if f.tail and rng.random() < f.tail:
                at += min(TAIL_CAP, f.tail_scale * rng.paretovariate(1.0))
                self.trace("net.late", f"{link.src}->{link.dst} {_describe(frame)} until {at:.3f}")
            if not (f.reorder and rng.random() < f.reorder):
                at = max(at, link.last_arrival)  # a connection keeps order unless told otherwise
            link.last_arrival = at
            if i:
                self.trace("net.dup", f"{link.src}->{link.dst} {_describe(frame)}")
            self.loop.call_at(at, self._arrive, link, frame)

    def _arrive(self, link: _Link, frame: bytes) -> None:
        if link.dst in self.held:
            self.held[link.dst].append(lambda: self._arrive(link, frame))
            return
        if link.closed:
            return
        if self.triggers:
            self._fire("arrive", link, frame)
        for observer in self.observers:
            observer.arrived(link.src, link.dst, link.conn, frame)
        link.receive(frame)

    def connection_number(self) -> int:
        """A number for a new connection (both its links carry it)."""
        self._connections += 1
        return self._connections


class FrameObserver(Protocol):
    """A checker of the frames on the network (:attr:`SimNetwork.observers`)."""

    def sent(self, src: str, dst: str, conn: int, frame: bytes) -> None:
        """``frame`` leaves ``src`` for ``dst`` on connection ``conn`` (it may still be lost)."""

    def arrived(self, src: str, dst: str, conn: int, frame: bytes) -> None:
        """``frame`` from ``src`` reaches ``dst`` on connection ``conn``, which reads it next."""

    def serving(self, node: str) -> None:
        """``node`` listens again (a bookie started or restarted)."""


class _Link:
    """One direction of one connection."""

    def __init__(self, src: str, dst: str, conn: int, receive: Callable[[bytes], None]) -> None:
        self.src = src
        self.dst = dst
        self.conn = conn
        self.receive = receive
        self.last_arrival = 0.0
        self.closed = False
        #: breaks the connection this link belongs to
        self.reset: Callable[[], None] | None = None


class _ServerSide:
    """What a bookie sees of one client connection (a :class:`ServerConnection`)."""

    def __init__(self, conn: _ClientConnection, peer: str) -> None:
        self.peer = peer
        self._conn = conn

    def send(self, frame: bytes) -> None:
        if not self._conn.is_closed:
            self._conn.network.transmit(self._conn.down, frame)

    def close(self) -> None:
        self._conn.break_off(None)


class _ClientConnection(Connection):
    def __init__(self, network: SimNetwork, client: str, server: SimServer,
                 on_frames: Callable[[Sequence[bytes]], None],
                 on_close: Callable[[BaseException | None], None]) -> None:
        self.network = network
        self.server = server
        self._on_close = on_close
        self._closed = False
        self.side = _ServerSide(self, client)
        number = network.connection_number()
        self.up = _Link(client, server.node, number, lambda f: server.handler.frames_received(self.side, [f]))
        self.down = _Link(server.node, client, number, lambda f: on_frames([f]))
        self.up.reset = self.down.reset = self._reset

    def _reset(self) -> None:
        self.break_off(BookieUnavailableError(f"connection to {self.server.address} was reset (simulated)"))

    def send(self, frame: bytes) -> None:
        if self._closed:
            raise BookieUnavailableError(f"connection to {self.server.address} is closed")
        self.network.transmit(self.up, frame)

    async def drain(self) -> None:
        return None

    async def close(self) -> None:
        self.break_off(None)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def break_off(self, error: BaseException | None) -> None:
        """End the connection on both sides (a crash, a close): each side hears of it once."""
        if self._closed:
            return
        self._closed = True
        self.up.closed = self.down.closed = True
        self.server.connections.pop(self, None)
        self.server.handler.connection_lost(self.side)
        self.network.loop.call_soon(self._on_close, error)


class SimServer(Server):
    """A simulated node's listening server; :meth:`crash` is what its process's end does to it."""

    def __init__(self, network: SimNetwork, node: str, address: str, handler: FrameHandler) -> None:
        self.network = network
        self.node = node
        self._address = address
        self.handler = handler
        self.connections: dict[_ClientConnection, None] = {}  # insertion order: deterministic

    @property
    def address(self) -> str:
        return self._address

    async def close(self) -> None:
        self.crash()

    def abort(self) -> None:
        self.crash()

    def crash(self) -> None:
        """Stop listening and break every connection (the process is gone)."""
        if self.network.servers.get(self._address) is self:
            del self.network.servers[self._address]
        for conn in list(self.connections):
            conn.break_off(BookieUnavailableError(f"{self._address} went away"))


class SimTransport(Transport):
    """The transport of one simulated node (``node`` names it on the network)."""

    schemes = (SCHEME,)

    def __init__(self, network: SimNetwork, node: str, **options: Any) -> None:
        super().__init__(**options)
        self.network = network
        self.node = node

    async def connect(self, address: str, on_frames: Callable[[Sequence[bytes]], None],
                      on_close: Callable[[BaseException | None], None]) -> Connection:
        net = self.network
        await asyncio.sleep(net.rng.uniform(net.default.min_delay, net.default.max_delay))
        server = net.servers.get(address)
        if server is None or (self.node, server.node) in net.cut or (server.node, self.node) in net.cut:
            net.trace("net.refused", f"{self.node}->{address}")
            raise BookieUnavailableError(f"cannot connect to {address}: nothing listens there (simulated)")
        conn = _ClientConnection(net, self.node, server, on_frames, on_close)
        server.connections[conn] = None
        net.trace("net.connect", f"{self.node}->{server.node}")
        return conn

    async def serve(self, address: str, handler: FrameHandler, limits: ServerLimits = ServerLimits()) -> Server:
        """Serve ``address`` on the simulated network (which has no connection limits to enforce)."""
        server = SimServer(self.network, self.node, address, handler)
        self.network.servers[address] = server
        for observer in self.network.observers:
            observer.serving(self.node)
        return server
