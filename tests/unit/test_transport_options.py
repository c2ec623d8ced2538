"""Transport plugins take their option table parsed once into their ``Options``, and the bookie's
connection limits reach the server as a ServerLimits value given to serve()."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ledgerstore.api import ServerConnection, ServerLimits
from ledgerstore.errors import ConfigError
from ledgerstore.plugins import create_transport
from ledgerstore_tcp import TcpServer, TcpTransport
from ledgerstore_tcp.tls import TlsTcpTransport
from ledgerstore_zmq import ZmqOptions, ZmqTransport


class _Handler:
    def frames_received(self, conn: ServerConnection, frames: Sequence[bytes]) -> None:
        pass

    def connection_lost(self, conn: ServerConnection) -> None:
        pass


def test_the_host_parses_a_transport_table_once_into_its_options() -> None:
    transport = create_transport("tcp", max_frame_size=1 << 20, options={"high_water": "4096", "connect_timeout": 2})
    assert isinstance(transport, TcpTransport)
    assert transport.options == TcpTransport.Options(high_water=4096, connect_timeout=2.0)
    assert transport.max_frame_size == 1 << 20
    zmq = create_transport("zmq", options={"sndhwm": 10})
    assert isinstance(zmq, ZmqTransport) and zmq.options == ZmqOptions(sndhwm=10)


def test_a_transport_built_in_code_parses_its_keywords_by_the_same_rules() -> None:
    assert TcpTransport(high_water=4096).options == TcpTransport.Options(high_water=4096)
    with pytest.raises(ConfigError, match="transport plugin 'tcp'.*high_water"):
        TcpTransport(high_water=0)
    with pytest.raises(TypeError, match="not both"):
        TcpTransport(TcpTransport.Options(), high_water=1)


@pytest.mark.parametrize(("scheme", "table", "message"), [
    ("tcp", {"max_connections": 5}, "unknown option 'max_connections'"),
    ("tcp+tls", {"cert_file": "/x.pem"}, "options 'cert_file' and 'key_file' go together"),
    ("tcp+tls", {"require_client_cert": True}, "option 'require_client_cert' needs 'ca_file'"),
    ("tcp+tls", {"client_key_file": "/k.pem"}, "options 'client_cert_file' and 'client_key_file' go together"),
    ("zmq", {"curve_server_secret_key": "x" * 40}, "option 'curve_allowed_clients' is required with CURVE"),
    ("zmq", {"curve_server_public_key": "x" * 40, "curve_public_key": "y" * 40},
     "option 'curve_public_key' is set without 'curve_secret_key'"),
])
def test_bad_transport_options_are_one_line_naming_the_plugin(scheme: str, table: dict[str, object],
                                                              message: str) -> None:
    with pytest.raises(ConfigError) as info:
        create_transport(scheme, options=table)
    text = str(info.value)
    assert f"transport plugin {scheme!r}" in text and message in text and "\n" not in text


def test_the_bookie_limits_reach_the_tcp_server_through_serve() -> None:
    limits = ServerLimits(max_unfinished_frame_bytes=1 << 20, unfinished_frame_timeout_s=3.0,
                          max_connections=7, idle_connection_timeout_s=9.0)

    async def main() -> tuple[int, float, int, float]:
        server = await TcpTransport().serve("tcp://127.0.0.1:0", _Handler(), limits)
        try:
            assert isinstance(server, TcpServer)
            return (server.max_unfinished_frame_bytes, server.unfinished_frame_timeout_s, server.max_connections,
                    server.idle_connection_timeout_s)
        finally:
            await server.close()

    assert asyncio.run(main()) == (1 << 20, 3.0, 7, 9.0)


def test_a_tls_transport_keeps_its_parsed_options() -> None:
    transport = TlsTcpTransport(server_hostname="bookie.example")
    assert transport.options.server_hostname == "bookie.example"
    assert not transport.options.require_client_cert
