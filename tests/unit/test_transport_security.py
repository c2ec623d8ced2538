"""Security and abuse handling of the transports, over real sockets on 127.0.0.1:
CURVE refusals (zmq), TLS refusals (tcp+tls), oversized messages (zmq and tcp), bad key/cert options."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
import zmq.auth
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerstore.errors import BookieUnavailableError, ConfigError, FrameTooLargeError, ProtocolError
from ledgerstore.testing.metadata import run, wait_until
from ledgerstore.testing.transport import Client, EchoHandler
from ledgerstore_tcp import TcpTransport
from ledgerstore_tcp.tls import TlsTcpTransport
from ledgerstore_zmq import ZmqTransport
from ledgerstore_zmq.framing import BATCH_BYTES, pack, unpack

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def curve(tmp_path):
    """Server keys, one allowed client key pair and one stranger key pair, as zmq.auth key files."""
    dirs = {name: tmp_path / name for name in ("server", "allowed", "client", "stranger")}
    for d in dirs.values():
        d.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(dirs["server"], "server")
    _, client_secret = zmq.auth.create_certificates(dirs["client"], "client")
    _, stranger_secret = zmq.auth.create_certificates(dirs["stranger"], "stranger")
    (dirs["allowed"] / "client.key").write_bytes((dirs["client"] / "client.key").read_bytes())
    return {"server_public": server_public, "server_secret": server_secret, "client_secret": client_secret,
            "stranger_secret": stranger_secret, "allowed_dir": str(dirs["allowed"])}


def _curve_server(curve, **extra) -> ZmqTransport:
    options = {"curve_server_secret_key": curve["server_secret"], "curve_allowed_clients": curve["allowed_dir"]}
    options.update(extra)
    return ZmqTransport(**options)


def _curve_client(curve, secret_file) -> ZmqTransport:
    return ZmqTransport(curve_server_public_key=curve["server_public"], curve_secret_key=secret_file)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA with a server certificate (127.0.0.1) and a client certificate."""
    assert shutil.which("openssl"), "the TLS tests need the openssl command: run scripts/setup.sh"
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return {name: str(d / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


async def _assert_echoes(transport, address: str, payload: bytes = b"hello") -> None:
    c = await Client().connect(transport, address)
    c.conn.send(payload)
    await wait_until(lambda: c.received == [payload], timeout=10)
    await c.conn.close()


# --- zmq CURVE --------------------------------------------------------------------------------


def test_zmq_client_without_an_allowed_curve_key_is_refused_and_counted(curve) -> None:
    async def main() -> None:
        handler = EchoHandler()
        server = await _curve_server(curve).serve("zmq://127.0.0.1:0", handler)
        try:
            with pytest.raises(BookieUnavailableError, match="refused our credentials"):
                await Client().connect(_curve_client(curve, curve["stranger_secret"]), server.address)
            await wait_until(lambda: server.stats()["auth_denied"] >= 1, timeout=10)
            await _assert_echoes(_curve_client(curve, curve["client_secret"]), server.address)
            assert handler.frames == 1  # only the allowed client's frame reached the bookie
        finally:
            await server.close()

    run(main())


def test_zmq_raw_socket_with_a_stranger_key_gets_no_answer(curve) -> None:
    """Below our client: a bare DEALER with an unknown key sends a frame; nothing comes back."""

    async def main() -> None:
        handler = EchoHandler()
        server = await _curve_server(curve).serve("zmq://127.0.0.1:0", handler)
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        try:
            sock.linger = 0
            sock.curve_serverkey = zmq.auth.load_certificate(curve["server_public"])[0]
            sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(curve["stranger_secret"])
            sock.connect(server.address.replace("zmq://", "tcp://"))
            await sock.send(b"let me in")
            assert await sock.poll(500, zmq.POLLIN) == 0
            assert handler.frames == 0
            await wait_until(lambda: server.stats()["auth_denied"] >= 1, timeout=10)
        finally:
            sock.close(0)
            ctx.term()
            await server.close()

    run(main())


def test_zmq_plain_client_cannot_talk_to_a_curve_server(curve) -> None:
    async def main() -> None:
        server = await _curve_server(curve).serve("zmq://127.0.0.1:0", EchoHandler())
        try:
            with pytest.raises(BookieUnavailableError):
                await Client().connect(ZmqTransport(connect_timeout=3), server.address)
            await wait_until(lambda: server.stats()["refused_peers"] >= 1, timeout=10)
        finally:
            await server.close()

    run(main())


def test_zmq_empty_allow_list_refuses_everyone(curve) -> None:
    async def main() -> None:
        server = await _curve_server(curve, curve_allowed_clients=[]).serve("zmq://127.0.0.1:0", EchoHandler())
        try:
            with pytest.raises(BookieUnavailableError):
                await Client().connect(_curve_client(curve, curve["client_secret"]), server.address)
            await wait_until(lambda: server.stats()["auth_denied"] >= 1, timeout=10)
        finally:
            await server.close()

    run(main())


def test_zmq_allow_list_of_z85_keys(curve) -> None:
    async def main() -> None:
        public, _ = zmq.auth.load_certificate(curve["client_secret"])
        server = await _curve_server(curve, curve_allowed_clients=[public.decode()]).serve(
            "zmq://127.0.0.1:0", EchoHandler())
        try:
            await _assert_echoes(_curve_client(curve, curve["client_secret"]), server.address)
        finally:
            await server.close()

    run(main())


def test_zmq_bad_curve_options_are_config_errors(curve, tmp_path) -> None:
    missing = str(tmp_path / "nope.key_secret")
    with pytest.raises(ConfigError, match=r"curve_server_secret_key.*nope\.key_secret"):
        ZmqTransport(curve_server_secret_key=missing, curve_allowed_clients=[])
    with pytest.raises(ConfigError, match="curve_allowed_clients"):
        ZmqTransport(curve_server_secret_key=curve["server_secret"])
    with pytest.raises(ConfigError, match="curve_secret_key.*only a public key"):
        ZmqTransport(curve_server_public_key=curve["server_public"], curve_secret_key=curve["server_public"])
    with pytest.raises(ConfigError, match="curve_allowed_clients.*not a directory"):
        ZmqTransport(curve_server_secret_key=curve["server_secret"], curve_allowed_clients=missing)


# --- zmq peers --------------------------------------------------------------------------------


def test_zmq_reply_to_a_departed_peer_is_dropped_and_counted() -> None:
    async def main() -> None:
        handler = EchoHandler()
        server = await ZmqTransport().serve("zmq://127.0.0.1:0", handler)
        try:
            c = await Client().connect(ZmqTransport(), server.address)
            c.conn.send(b"hi")
            await wait_until(lambda: c.received == [b"hi"])
            await c.conn.close()
            await wait_until(lambda: handler.lost == 1)
            handler.conns[0].send(b"too late")
            await asyncio.sleep(0.05)
            assert server.stats()["dropped_replies"] >= 1
            assert server.stats()["connections"] == 0
        finally:
            await server.close()

    run(main())


def test_zmq_server_closing_a_peer_closes_the_client() -> None:
    async def main() -> None:
        handler = EchoHandler()
        server = await ZmqTransport().serve("zmq://127.0.0.1:0", handler)
        try:
            c = await Client().connect(ZmqTransport(), server.address)
            c.conn.send(b"hi")
            await wait_until(lambda: c.received == [b"hi"])
            handler.conns[0].close()
            await wait_until(lambda: len(c.closed) == 1)
            assert isinstance(c.closed[0], BookieUnavailableError)
            assert handler.lost == 1
        finally:
            await server.close()

    run(main())


# --- oversized messages -------------------------------------------------------------------------


@pytest.mark.parametrize("make, scheme", [(ZmqTransport, "zmq"), (TcpTransport, "tcp")])
def test_oversized_message_disconnects_only_its_sender(make, scheme) -> None:
    limit = 64 * 1024

    async def main() -> None:
        handler = EchoHandler()
        server = await make(max_frame_size=limit).serve(f"{scheme}://127.0.0.1:0", handler)
        try:
            good = await Client().connect(make(max_frame_size=limit), server.address)
            bad = await Client().connect(make(max_frame_size=4 * limit), server.address)
            bad.conn.send(b"x" * (2 * limit))
            await wait_until(lambda: len(bad.closed) == 1, timeout=10)
            assert bad.received == []
            good.conn.send(b"still served")
            await wait_until(lambda: good.received == [b"still served"], timeout=10)
            assert handler.frames == 1
            stats = server.stats()
            assert stats.get("oversized_frames", 0) + stats.get("disconnects", 0) >= 1
            await good.conn.close()
        finally:
            await server.close()

    run(main())


# --- tcp+tls ------------------------------------------------------------------------------------


@needs_openssl
def test_tls_client_without_the_ca_cannot_connect_and_good_client_is_served(pki) -> None:
    async def main() -> None:
        server = await TlsTcpTransport(cert_file=pki["server.pem"], key_file=pki["server.key"]).serve(
            "tcp+tls://127.0.0.1:0", EchoHandler())
        try:
            # trusts only the system CAs, which did not sign the bookie's certificate
            with pytest.raises(BookieUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
                await Client().connect(TlsTcpTransport(), server.address)
            await _assert_echoes(TlsTcpTransport(ca_file=pki["ca.pem"]), server.address)
        finally:
            await server.close()

    run(main())


@needs_openssl
def test_tls_client_without_a_certificate_is_refused_when_one_is_required(pki) -> None:
    async def main() -> None:
        handler = EchoHandler()
        server = await TlsTcpTransport(cert_file=pki["server.pem"], key_file=pki["server.key"],
                                       ca_file=pki["ca.pem"], require_client_cert=True).serve(
            "tcp+tls://127.0.0.1:0", handler)
        try:
            # With TLS 1.3 the client finishes its half of the handshake before the bookie checks
            # the client certificate, so the refusal shows either at connect or as a closed connection.
            try:
                c = await Client().connect(TlsTcpTransport(ca_file=pki["ca.pem"]), server.address)
            except BookieUnavailableError:
                pass
            else:
                try:
                    c.conn.send(b"anyone there?")
                except BookieUnavailableError:
                    pass
                await wait_until(lambda: len(c.closed) == 1, timeout=10)
                assert c.received == []
            await wait_until(lambda: server.stats()["refused_handshakes"] >= 1, timeout=10)
            assert handler.frames == 0
            await _assert_echoes(TlsTcpTransport(ca_file=pki["ca.pem"], client_cert_file=pki["client.pem"],
                                                 client_key_file=pki["client.key"]), server.address)
        finally:
            await server.close()

    run(main())


def test_tls_missing_or_unreadable_files_are_config_errors(tmp_path) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"'cert_file'.*missing\.pem.*does not exist"):
        TlsTcpTransport(cert_file=missing, key_file=missing)
    with pytest.raises(ConfigError, match=r"'ca_file'.*missing\.pem"):
        TlsTcpTransport(ca_file=missing)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"'cert_file'.*garbage\.pem.*cannot load"):
        TlsTcpTransport(cert_file=str(garbage), key_file=str(garbage))
    with pytest.raises(ConfigError, match="'cert_file' and 'key_file'"):
        run(TlsTcpTransport().serve("tcp+tls://127.0.0.1:0", EchoHandler()))


def test_zmq_frame_over_the_limit_inside_a_small_message_closes_only_that_peer() -> None:
    """libzmq's MAXMSGSIZE admits a full batch, so a small limit is also checked per frame."""

    async def main() -> None:
        handler = EchoHandler()
        server = await ZmqTransport(max_frame_size=1024).serve("zmq://127.0.0.1:0", handler)
        try:
            bad = await Client().connect(ZmqTransport(), server.address)
            bad.conn.send(b"y" * 2000)
            await wait_until(lambda: len(bad.closed) == 1, timeout=10)
            assert isinstance(bad.closed[0], BookieUnavailableError)
            assert server.stats()["oversized_frames"] == 1 and handler.frames == 0
            await _assert_echoes(ZmqTransport(max_frame_size=1024), server.address)
        finally:
            await server.close()

    run(main())


# --- zmq framing (pure) ---------------------------------------------------------------------------


@given(st.lists(st.integers(0, 300) | st.integers(BATCH_BYTES - 10, BATCH_BYTES + 10), max_size=40))
@settings(max_examples=60, deadline=None)
def test_zmq_packing_round_trips_and_respects_the_batch_size(sizes) -> None:
    frames = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
    messages = pack(frames)
    out: list[bytes] = []
    for message, count in messages:
        before = len(out)
        unpack(message, BATCH_BYTES + 10, out)
        assert len(out) - before == count
        assert len(message) <= BATCH_BYTES or count == 1
    assert out == frames


def test_zmq_unpack_rejects_truncated_and_oversized_frames() -> None:
    (message, _), = pack([b"abc", b"defgh"])
    with pytest.raises(ProtocolError, match="ends inside a frame"):
        unpack(message[:-1], 100, [])
    with pytest.raises(ProtocolError, match="frame header"):
        unpack(message + b"\x00", 100, [])
    with pytest.raises(FrameTooLargeError):
        unpack(message, 4, [])
