"""The transport conformance suite over real ZeroMQ sockets: plain, and with CURVE."""

from __future__ import annotations

import pytest
import zmq
import zmq.auth

from ledgerstore.testing import TransportConformance
from ledgerstore_zmq import ZmqTransport


class TestZmqTransport(TransportConformance):
    @pytest.fixture
    def transport_factory(self):
        return lambda: ZmqTransport(max_frame_size=self.max_frame_size)

    @pytest.fixture
    def listen_address(self):
        return "zmq://127.0.0.1:0"


@pytest.fixture
def curve_keys(tmp_path):
    """A server key pair and an allowed client key pair, as files, like an operator makes them."""
    server_dir, clients_dir, client_dir = tmp_path / "server", tmp_path / "allowed", tmp_path / "client"
    for d in (server_dir, clients_dir, client_dir):
        d.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(server_dir, "server")
    client_public, client_secret = zmq.auth.create_certificates(client_dir, "client")
    # the server's allow-list holds only public keys
    (clients_dir / "client.key").write_bytes((client_dir / "client.key").read_bytes())
    return {
        "server_public": server_public, "server_secret": server_secret,
        "client_public": client_public, "client_secret": client_secret,
        "allowed_dir": str(clients_dir),
    }


class TestZmqCurveTransport(TransportConformance):
    """CURVE with key files on the server side and Z85 strings on the client side."""

    @pytest.fixture
    def server_transport_factory(self, curve_keys):
        return lambda: ZmqTransport(
            max_frame_size=self.max_frame_size,
            curve_server_secret_key=curve_keys["server_secret"],
            curve_server_public_key=curve_keys["server_public"],
            curve_allowed_clients=curve_keys["allowed_dir"],
        )

    @pytest.fixture
    def transport_factory(self, curve_keys):
        server_public, _ = zmq.auth.load_certificate(curve_keys["server_public"])
        public, secret = zmq.auth.load_certificate(curve_keys["client_secret"])
        return lambda: ZmqTransport(
            max_frame_size=self.max_frame_size,
            curve_server_public_key=server_public.decode(),
            curve_public_key=public.decode(),
            curve_secret_key=secret.decode(),
        )

    @pytest.fixture
    def listen_address(self):
        return "zmq://127.0.0.1:0"
