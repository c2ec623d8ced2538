"""The options of the ``zmq`` transport (its ``[transport]`` table), declared once: defaults,
bounds and how they combine. The key options are read (files, Z85 text) by
:mod:`~ledgerstore_zmq.curve`; the others set socket options (:mod:`~ledgerstore_zmq.sockopts`)."""

from __future__ import annotations

import dataclasses

from ledgerstore.api import MAX_DURATION_S, option

__all__ = ["DEFAULT_HIGH_WATER", "DEFAULT_HWM", "ZmqOptions"]

#: Messages per peer pipe, each way; large because a pipelining client keeps thousands in flight
#: and a ROUTER drops (and counts) replies to a peer whose pipe is full.
DEFAULT_HWM = 100_000
#: bytes a client connection queues locally before ``drain`` waits
DEFAULT_HIGH_WATER = 8 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ZmqOptions:
    """The ``[transport]`` table of a ``zmq://`` bookie, or a client's ``[transport.zmq]``."""

    sndhwm: int = option(DEFAULT_HWM, "libzmq send high-water mark, in messages per peer", minimum=0)
    rcvhwm: int = option(DEFAULT_HWM, "libzmq receive high-water mark, in messages per peer", minimum=0)
    high_water: int = option(DEFAULT_HIGH_WATER, "bytes a client connection queues before drain waits",
                             minimum=1)
    connect_timeout: float = option(5.0, "seconds connect waits for the handshake", minimum=0.001, maximum=MAX_DURATION_S)
    heartbeat_interval: float = option(2.0, "seconds between ZMTP pings (0 turns them off)", minimum=0, maximum=MAX_DURATION_S)
    peer_check_interval: float = option(2.0, "seconds between the server's checks for vanished peers",
                                        minimum=0.001, maximum=MAX_DURATION_S)
    curve_server_secret_key: str | None = option(None, "server: Z85 secret key or key file; turns CURVE on")
    curve_server_public_key: str | None = option(None, "the server's Z85 public key or key file")
    curve_allowed_clients: str | list[str] | None = option(
        None, "server: a directory of *.key files or a list of Z85 client public keys")
    curve_allow_any: bool = option(False, "server: accept any client key (encryption without authentication)")
    curve_public_key: str | None = option(None, "client: its Z85 public key or key file")
    curve_secret_key: str | None = option(None, "client: its Z85 secret key or key file")

    def __post_init__(self) -> None:
        if self.curve_server_secret_key and not self.curve_allow_any and self.curve_allowed_clients is None:
            raise ValueError(
                "option 'curve_allowed_clients' is required with CURVE: a directory of client public keys or a "
                "list of Z85 keys (or set curve_allow_any = true to encrypt without authenticating clients)")
        if self.curve_server_public_key and self.curve_public_key and not self.curve_secret_key:
            raise ValueError("option 'curve_public_key' is set without 'curve_secret_key'")
