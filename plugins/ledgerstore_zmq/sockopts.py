"""libzmq socket options shared by the ROUTER (server) and DEALER (client) sockets."""

from __future__ import annotations

from typing import Any

import zmq

from .framing import max_message_size

__all__ = ["DEFAULT_HWM", "apply_socket_options"]

#: Messages per peer pipe, each way; large because a pipelining client keeps thousands in flight
#: and a ROUTER drops (and counts) replies to a peer whose pipe is full.
DEFAULT_HWM = 100_000


def apply_socket_options(sock: zmq.Socket[Any], options: dict[str, Any], max_frame_size: int) -> None:
    """Set LINGER, MAXMSGSIZE, the high-water marks and ZMTP heartbeats from transport options."""
    sock.setsockopt(zmq.LINGER, 0)
    # libzmq checks this against the length header, before allocating: an oversized message
    # disconnects its sender and never reaches Python. Frames inside are checked by framing.unpack.
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_size(max_frame_size))
    sock.setsockopt(zmq.SNDHWM, int(options.get("sndhwm", DEFAULT_HWM)))
    sock.setsockopt(zmq.RCVHWM, int(options.get("rcvhwm", DEFAULT_HWM)))
    heartbeat_ms = int(float(options.get("heartbeat_interval", 2.0)) * 1000)
    if heartbeat_ms > 0:
        # ZMTP pings find peers that vanished without closing TCP (power loss, a pulled cable).
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms * 3)
        sock.setsockopt(zmq.HEARTBEAT_TTL, heartbeat_ms * 3)
