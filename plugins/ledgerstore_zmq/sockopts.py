"""libzmq socket options shared by the ROUTER (server) and DEALER (client) sockets."""

from __future__ import annotations

from typing import Any

import zmq

from .framing import max_message_size
from .options import ZmqOptions

__all__ = ["apply_socket_options"]


def apply_socket_options(sock: zmq.Socket[Any], options: ZmqOptions, max_frame_size: int) -> None:
    """Set LINGER, MAXMSGSIZE, the high-water marks and ZMTP heartbeats from transport options."""
    sock.setsockopt(zmq.LINGER, 0)
    # libzmq checks this against the length header, before allocating: an oversized message
    # disconnects its sender and never reaches Python. Frames inside are checked by framing.unpack.
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_size(max_frame_size))
    sock.setsockopt(zmq.SNDHWM, options.sndhwm)
    sock.setsockopt(zmq.RCVHWM, options.rcvhwm)
    heartbeat_ms = int(options.heartbeat_interval * 1000)
    if heartbeat_ms > 0:
        # ZMTP pings find peers that vanished without closing TCP (power loss, a pulled cable).
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms * 3)
        sock.setsockopt(zmq.HEARTBEAT_TTL, heartbeat_ms * 3)
