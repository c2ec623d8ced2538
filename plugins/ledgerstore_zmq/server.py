"""Server side of the ``zmq`` transport: one ROUTER socket; each peer identity is one connection.

Reading: every wake-up drains what libzmq has (non-blocking, up to ``RECV_BATCH`` messages) and
hands one batch of frames per peer to the handler, in arrival order.

Writing: replies are queued and flushed once per loop iteration with non-blocking sends. The
socket has ``ROUTER_MANDATORY`` set, so a reply to a peer that is gone (``EHOSTUNREACH``) or whose
pipe is at SNDHWM (``EAGAIN``) raises instead of vanishing: the reply is dropped and counted, and a
vanished peer is forgotten (``connection_lost``).

ROUTER sockets do not report which identity disconnected, so peers are forgotten when they say
goodbye (our client sends a ``bye`` control message on close), when a reply to them fails, and
by a probe: after every disconnect event of the socket monitor, and every ``peer_check_interval``
seconds, each known peer is sent a ``ping`` control message; ``EHOSTUNREACH`` means it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from ledgerstore.api import FrameHandler, Server
from ledgerstore.errors import FrameTooLargeError, ProtocolError

from .client import CONTROL_BYE, CONTROL_CLOSE, CONTROL_PING, RECV_BATCH, parse_event
from .curve import CurveServerKeys
from .framing import pack, unpack
from .options import ZmqOptions
from .pump import EventPump
from .sockopts import apply_socket_options

__all__ = ["ZmqServer", "ZmqPeer"]

log = logging.getLogger(__name__)

_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_SERVER_EVENTS = zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILED
#: Delays (s) of the peer probes after a disconnect: libzmq removes the peer's pipe asynchronously.
_PROBE_DELAYS = (0.01, 0.1, 0.5)
#: Identities of peers closed by the bookie are remembered (bounded) so their late frames are dropped.
_FORGOTTEN_LIMIT = 10_000
ZAP_DOMAIN = b"ledgerstore"


class ZmqPeer:
    """One peer identity of the ROUTER socket: the ``ServerConnection`` handed to the bookie."""

    __slots__ = ("server", "identity", "peer", "gone")

    def __init__(self, server: ZmqServer, identity: bytes) -> None:
        self.server = server
        self.identity = identity
        self.peer = f"zmq:{identity.hex()}"
        self.gone = False

    def send(self, frame: bytes) -> None:
        """Queue a reply; dropped (and counted) if the peer is gone."""
        if self.gone:
            self.server.counters["dropped_replies"] += 1
            return
        self.server.queue_reply(self, frame)

    def close(self) -> None:
        """Tell the peer to go away and forget it; later frames with its identity are dropped."""
        if self.gone:
            return
        with contextlib.suppress(zmq.ZMQError):
            self.server.sync.send_multipart([self.identity, b"", CONTROL_CLOSE], zmq.NOBLOCK)
        self.server.pump.schedule()
        self.server.forget(self, remember=True)

    def __repr__(self) -> str:
        return f"<ZmqPeer {self.peer}>"


class ZmqServer(Server):
    """A bound ROUTER socket, its monitor and (with CURVE) its ZAP authenticator."""

    def __init__(self, handler: FrameHandler, scheme: str, options: ZmqOptions,
                 max_frame_size: int, curve: CurveServerKeys | None) -> None:
        self.handler = handler
        self.max_frame_size = max_frame_size
        self.scheme = scheme
        self.loop = asyncio.get_running_loop()
        self.ctx = zmq.asyncio.Context()
        self.peers: dict[bytes, ZmqPeer] = {}
        self._forgotten: OrderedDict[bytes, None] = OrderedDict()
        self.counters = {
            "refused_peers": 0,
            "auth_denied": 0,
            "disconnects": 0,
            "dropped_replies": 0,
            "malformed_messages": 0,
            "oversized_frames": 0,
            "handler_errors": 0,
        }
        self._out: deque[tuple[ZmqPeer, bytes]] = deque()
        self._flush_scheduled = False
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.TimerHandle] = set()
        self.pump: EventPump  # set by bind()
        self._closed = False
        self._address = ""
        self._peer_check_interval = options.peer_check_interval
        self.auth: AsyncioAuthenticator | None = None
        try:
            self.sock = self.ctx.socket(zmq.ROUTER)
            self.sync: zmq.Socket[bytes] = zmq.Socket.shadow(self.sock.underlying)
            apply_socket_options(self.sock, options, max_frame_size)
            self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            if curve is not None:
                self.auth = AsyncioAuthenticator(self.ctx)
                self.auth.start()
                self.auth.configure_curve_callback(ZAP_DOMAIN.decode(), _KeySet(curve.allowed))
                self.sock.curve_server = True
                self.sock.curve_secretkey = curve.secret_key
                self.sock.zap_domain = ZAP_DOMAIN
            self.monitor = self.sock.get_monitor_socket(_SERVER_EVENTS)
        except BaseException:
            self._release()
            raise

    async def bind(self, host: str, port: int) -> None:
        """Bind (a random free port for 0) and start the reader, monitor and peer-check tasks."""
        if ":" in host:
            self.sock.setsockopt(zmq.IPV6, 1)
        bracketed = f"[{host}]" if ":" in host else host
        try:
            self.sock.bind(f"tcp://{bracketed}:{port or '*'}")
        except zmq.ZMQError:
            self._release()
            raise
        endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        real_port = int(endpoint.rsplit(":", 1)[1])
        self._address = f"{self.scheme}://{bracketed}:{real_port}"
        self.pump = EventPump(self.sync, self._read)
        self._tasks = [
            asyncio.ensure_future(self._watch()),
            asyncio.ensure_future(self._check_peers_periodically()),
        ]

    @property
    def address(self) -> str:
        return self._address

    def stats(self) -> dict[str, int]:
        return dict(self.counters, connections=len(self.peers))

    # --- receiving -----------------------------------------------------------------------------

    def _read(self) -> None:
        recv, peers, limit = self.sync.recv_multipart, self.peers, self.max_frame_size
        batches: dict[bytes, list[bytes]] = {}
        try:
            for _ in range(RECV_BATCH):
                parts = recv(zmq.NOBLOCK)
                if len(parts) == 2:
                    batch = batches.get(parts[0])
                    if batch is None:
                        batch = batches[parts[0]] = []
                    try:
                        unpack(parts[1], limit, batch)
                    except ProtocolError as exc:
                        self._reject(parts[0], batches, exc)
                elif len(parts) == 3 and parts[1] == b"":
                    if parts[2] == CONTROL_BYE:
                        self._deliver(batches.pop(parts[0], None), parts[0])
                        peer = peers.get(parts[0])
                        if peer is not None:
                            self.forget(peer, remember=True)
                else:
                    self.counters["malformed_messages"] += 1
        except zmq.Again:
            pass
        for identity, frames in batches.items():
            self._deliver(frames, identity)

    def _reject(self, identity: bytes, batches: dict[bytes, list[bytes]], exc: ProtocolError) -> None:
        """A peer sent a bad message: drop what it sent in this batch and close it."""
        key = "oversized_frames" if isinstance(exc, FrameTooLargeError) else "malformed_messages"
        self.counters[key] += 1
        log.warning("peer zmq:%s: %s; closing it", identity.hex(), exc)
        batches.pop(identity, None)
        peer = self.peers.get(identity)
        if peer is not None:
            peer.close()
        else:  # the bookie never saw it: just send it away and ignore it from now on
            with contextlib.suppress(zmq.ZMQError):
                self.sync.send_multipart([identity, b"", CONTROL_CLOSE], zmq.NOBLOCK)
            self._forgotten[identity] = None

    def _deliver(self, frames: list[bytes] | None, identity: bytes) -> None:
        if not frames or identity in self._forgotten:
            return
        peer = self.peers.get(identity)
        if peer is None:
            peer = self.peers[identity] = ZmqPeer(self, identity)
        try:
            self.handler.frames_received(peer, frames)
        except Exception:  # a handler bug must not take the server down
            self.counters["handler_errors"] += 1
            log.exception("request handler failed for peer %s; closing it", peer.peer)
            peer.close()

    # --- sending -------------------------------------------------------------------------------

    def queue_reply(self, peer: ZmqPeer, frame: bytes) -> None:
        """Queue ``frame`` for ``peer``; sent with the other replies of this loop iteration."""
        self._out.append((peer, frame))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed:
            self._out.clear()
            return
        by_peer: dict[ZmqPeer, list[bytes]] = {}
        for peer, frame in self._out:
            frames = by_peer.get(peer)
            if frames is None:
                by_peer[peer] = [frame]
            else:
                frames.append(frame)
        self._out.clear()
        send = self.sync.send
        more = zmq.SNDMORE | zmq.NOBLOCK
        counters = self.counters
        for peer, frames in by_peer.items():
            if peer.gone:
                counters["dropped_replies"] += len(frames)
                continue
            unsent = len(frames)
            for message, count in pack(frames):
                try:
                    send(peer.identity, more)
                    send(message, zmq.NOBLOCK)
                    unsent -= count
                except zmq.Again:
                    # The peer's pipe is at SNDHWM: it reads slower than it asks. Its requests time out.
                    counters["dropped_replies"] += unsent
                    break
                except zmq.ZMQError as exc:
                    counters["dropped_replies"] += unsent
                    if exc.errno == zmq.EHOSTUNREACH:
                        self.forget(peer, remember=False)
                    else:
                        log.warning("reply to %s failed: %s", peer.peer, exc)
                    break
        self.pump.schedule()  # sending may have consumed the socket's wake-up edge

    # --- peers ---------------------------------------------------------------------------------

    def forget(self, peer: ZmqPeer, *, remember: bool) -> None:
        """Drop ``peer`` and tell the handler; with ``remember``, ignore its identity from now on."""
        if peer.gone:
            return
        peer.gone = True
        self.peers.pop(peer.identity, None)
        if remember:
            self._forgotten[peer.identity] = None
            if len(self._forgotten) > _FORGOTTEN_LIMIT:
                self._forgotten.popitem(last=False)
        try:
            self.handler.connection_lost(peer)
        except Exception:
            log.exception("connection_lost handler failed for %s", peer.peer)

    def probe_peers(self) -> None:
        """Send every known peer a ping; libzmq refuses it for peers that are gone."""
        if self._closed:
            return
        send = self.sync.send_multipart
        for peer in list(self.peers.values()):
            try:
                send([peer.identity, b"", CONTROL_PING], zmq.NOBLOCK)
            except zmq.Again:
                pass  # alive, but its pipe is full
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    self.forget(peer, remember=False)
        self.pump.schedule()

    def _schedule_probes(self) -> None:
        for delay in _PROBE_DELAYS:
            handle = self.loop.call_later(delay, self._timed_probe)
            self._timers.add(handle)

    def _timed_probe(self) -> None:
        self._timers = {t for t in self._timers if not t.cancelled() and t.when() > self.loop.time()}
        self.probe_peers()

    async def _check_peers_periodically(self) -> None:
        if self._peer_check_interval <= 0:
            return
        while not self._closed:
            await asyncio.sleep(self._peer_check_interval)
            self.probe_peers()

    async def _watch(self) -> None:
        recv = zmq.Socket.shadow(self.monitor.underlying).recv_multipart
        counters = self.counters
        while not self._closed:
            await self.monitor.poll(None, zmq.POLLIN)  # type: ignore[call-arg]
            try:
                while True:
                    event, _ = parse_event(recv(zmq.NOBLOCK))
                    if event == zmq.EVENT_DISCONNECTED:
                        counters["disconnects"] += 1
                        self._schedule_probes()
                    elif event & _HANDSHAKE_FAILED:
                        # The peer never got to send a request. Which event a mismatch gives
                        # depends on which side notices first: a plain client facing CURVE
                        # often hangs up before the server reports a protocol error.
                        counters["refused_peers"] += 1
                        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                            counters["auth_denied"] += 1
            except zmq.Again:
                pass

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._release()
        for peer in list(self.peers.values()):
            self.forget(peer, remember=False)

    def _release(self) -> None:
        self._closed = True
        pump = getattr(self, "pump", None)
        if pump is not None:
            pump.close()
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        mon = getattr(self, "monitor", None)
        if mon is not None:
            mon.close(linger=0)
        sock = getattr(self, "sock", None)
        if sock is not None:
            sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        self.ctx.term()


class _KeySet:
    """ZAP credentials provider: allows the client public keys of ``curve_allowed_clients``."""

    def __init__(self, allowed: set[bytes] | None) -> None:
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return self.allowed is None or key in self.allowed
