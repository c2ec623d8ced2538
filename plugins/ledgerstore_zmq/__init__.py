"""``zmq`` transport: ZeroMQ ROUTER (bookie) / DEALER (client) sockets over pyzmq's asyncio API.

Addresses are ``zmq://host:port`` (port 0 binds a random free port). One ZMQ message part is one
frame, so ZMQ does the framing; libzmq refuses a message larger than ``max_frame_size`` before
allocating it (``ZMQ_MAXMSGSIZE``) and disconnects its sender. The sender's client connection
sees that disconnect (socket monitor) and closes, as a ``tcp`` one does, instead of letting
libzmq reconnect silently; other peers are not affected.

Options (the ``[transport]`` table):

- ``sndhwm`` / ``rcvhwm``: libzmq high-water marks, in messages per peer (default 100,000).
- ``high_water``: bytes a client connection queues locally before ``drain`` waits (default 8 MiB).
- ``connect_timeout``: seconds to wait for the handshake in ``connect`` (default 5).
- ``heartbeat_interval``: seconds between ZMTP pings; a peer silent for 3 intervals is dropped
  (default 2; 0 turns heartbeats off).
- ``peer_check_interval``: seconds between the server's checks for vanished peers (default 2).
- CURVE, server: ``curve_server_secret_key`` (turns CURVE on), ``curve_server_public_key``
  (optional, checked against the secret key), ``curve_allowed_clients`` (a directory of ``*.key``
  files or a list of Z85 public keys; empty allows nobody) or ``curve_allow_any = true``.
- CURVE, client: ``curve_server_public_key`` (turns CURVE on), ``curve_public_key``,
  ``curve_secret_key``.

Key options take a Z85 string or a key file path made by ``zmq.auth.create_certificates``;
see ``docs/transports.md``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import zmq
import zmq.asyncio

from ledgerstore.api import Connection, FrameHandler, Server, ServerLimits, Transport, split_address
from ledgerstore.errors import BookieUnavailableError, ConfigError

from .client import _CLIENT_EVENTS, ZmqConnection
from .curve import CurveClientKeys, CurveServerKeys
from .options import ZmqOptions
from .server import ZmqPeer, ZmqServer
from .sockopts import apply_socket_options

__all__ = ["ZmqTransport", "ZmqConnection", "ZmqServer", "ZmqPeer", "ZmqOptions"]


class ZmqTransport(Transport):
    """ZeroMQ transport with optional CURVE encryption and client authentication.

    Client connections of one transport instance share one ``zmq.asyncio.Context``, created on
    first use and terminated when its last socket closes; each server has its own context (a
    context has at most one ZAP authenticator)."""

    schemes = ("zmq",)
    supports_curve = True

    Options = ZmqOptions
    options: ZmqOptions

    def __init__(self, options: ZmqOptions | None = None, /, *, max_frame_size: int = 5 * 1024 * 1024,
                 **values: Any) -> None:
        super().__init__(options, max_frame_size=max_frame_size, **values)
        # Keys are read now so a bad key fails at start-up, not at the first connection.
        self._curve_server = CurveServerKeys.from_options(self.options)
        self._curve_client = CurveClientKeys.from_options(self.options)
        self._ctx: zmq.asyncio.Context | None = None
        self._ctx_users = 0
        self._ctx_lock = threading.Lock()

    def _acquire_context(self) -> zmq.asyncio.Context:
        with self._ctx_lock:
            if self._ctx is None:
                self._ctx = zmq.asyncio.Context()
            self._ctx_users += 1
            return self._ctx

    def _release_context(self) -> None:
        with self._ctx_lock:
            self._ctx_users -= 1
            if self._ctx_users == 0 and self._ctx is not None:
                ctx, self._ctx = self._ctx, None
                ctx.term()  # every socket is closed with LINGER 0, so this returns at once

    async def connect(
        self,
        address: str,
        on_frames: Callable[[Sequence[bytes]], None],
        on_close: Callable[[BaseException | None], None],
    ) -> Connection:
        _, host, port = split_address(address)
        ctx = self._acquire_context()
        try:
            sock = ctx.socket(zmq.DEALER)
        except BaseException:
            self._release_context()
            raise
        try:
            apply_socket_options(sock, self.options, self.max_frame_size)
            curve = self._curve_client
            if curve is not None:
                sock.curve_serverkey = curve.server_public_key
                sock.curve_publickey = curve.public_key
                sock.curve_secretkey = curve.secret_key
            if ":" in host:
                sock.setsockopt(zmq.IPV6, 1)
                host = f"[{host}]"
            monitor = sock.get_monitor_socket(_CLIENT_EVENTS)
            sock.connect(f"tcp://{host}:{port}")
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self._release_context()
            raise BookieUnavailableError(f"cannot connect to {address}: {exc}") from exc
        except BaseException:
            sock.close(linger=0)
            self._release_context()
            raise
        conn = ZmqConnection(sock, monitor, address, self.max_frame_size, self.options.high_water,
                             on_frames, on_close, self._release_context)
        await conn.wait_ready(self.options.connect_timeout)
        return conn

    async def serve(self, address: str, handler: FrameHandler, limits: ServerLimits = ServerLimits()) -> Server:
        """Bind a ROUTER socket on ``address``. libzmq owns the connections and their framing, so
        none of the bookie's ``limits`` applies: a message over ``max_frame_size`` is refused by
        libzmq before it is read, and the heartbeats drop vanished peers."""
        scheme, host, port = split_address(address)
        if scheme not in self.schemes:
            raise ConfigError(f"zmq transport cannot serve {address!r}: its scheme is not zmq://")
        server = ZmqServer(handler, scheme, self.options, self.max_frame_size, self._curve_server)
        try:
            await server.bind(host, port)
        except zmq.ZMQError as exc:
            raise BookieUnavailableError(f"cannot listen on {address}: {exc}") from exc
        await asyncio.sleep(0)  # let the reader task reach its first poll
        return server
