"""The sqlite metadata server's TCP listener and its credentials, against a real
``ledgerstore metadata-server`` process on 127.0.0.1 and real sockets.

Every TCP connection proves a shared secret (HMAC-SHA256 over a server and a client nonce) before
its first request; a wrong, missing or garbled proof is refused in one line while the server
keeps serving others; connections that do not authenticate are closed after a timeout and bounded
in number.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerstore.cluster import start_metadata_server_process, stop_process
from ledgerstore.errors import ConfigError, MetadataError
from ledgerstore.testing.metadata import run
from ledgerstore.testing.netns import issue_certs
from ledgerstore_sqlite import SqliteMetadataStore
from ledgerstore_sqlite.auth import MetadataAuthError, check_auth, client_answer, read_secret, verify_server
from ledgerstore_sqlite.protocol import decode_body, encode


def write_secret(path: Path, secret: bytes | None = None, mode: int = 0o600) -> Path:
    """A secret file of ``mode`` holding ``secret`` (fresh random text by default)."""
    path.write_bytes((secret or secrets.token_hex(32).encode()) + b"\n")
    path.chmod(mode)
    return path


class TcpServer:
    """A ``ledgerstore metadata-server --listen 127.0.0.1:PORT`` process."""

    def __init__(self, tmp: Path, secret_file: Path, *args: str, port: int = 0) -> None:
        self.db = tmp / "meta.db"
        self.log = tmp / "server.log"
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.proc = start_metadata_server_process(
            self.db, self.log,
            extra_args=("--listen", f"127.0.0.1:{port}", "--secret-file", str(secret_file), *args),
        )
        ready = re.search(r"ready on .* and tcp 127\.0\.0\.1:(\d+)", self.log.read_text()[offset:])
        assert ready, self.log.read_text()
        self.port = int(ready.group(1))
        self.uri = f"sqlite+tcp://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self.proc, sig)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "secret")


@pytest.fixture
def server(tmp_path: Path, secret_file: Path) -> Iterator[TcpServer]:
    srv = TcpServer(tmp_path, secret_file, "--auth-timeout", "0.5", "--max-unauthenticated", "3")
    try:
        yield srv
    finally:
        srv.stop()


def store(server: TcpServer, secret_file: Path, **options: object) -> SqliteMetadataStore:
    options.setdefault("session_ttl", 2.0)
    return SqliteMetadataStore(server.uri, secret_file=str(secret_file), **options)


async def round_trip(s: SqliteMetadataStore, key: str = "/tcp/k") -> None:
    version = await s.put(key, b"v")
    got = await s.get(key)
    assert got is not None and (got.value, got.version) == (b"v", version)


async def serves(server: TcpServer, secret_file: Path, retry_s: float = 0.0, **options: object) -> None:
    """A new store with ``options`` connects (retrying for ``retry_s`` while refused), writes and
    reads back a key, and closes."""
    deadline = asyncio.get_running_loop().time() + retry_s
    while True:
        s = store(server, secret_file, **options)
        try:
            await s.start()
            break
        except MetadataError:
            await s.close()
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)
    try:
        await round_trip(s)
    finally:
        await s.close()


def raw_connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def read_frame(sock: socket.socket) -> dict[str, object] | None:
    """The next frame on ``sock``, or None if the server closed the connection."""
    header = _read_exactly(sock, 4)
    if header is None:
        return None
    (length,) = struct.unpack(">I", header)
    body = _read_exactly(sock, length)
    assert body is not None, "the server hung up in the middle of a frame"
    return decode_body(body)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


# --- the handshake, as pure functions -------------------------------------------------------------


def test_the_handshake_proves_the_secret_both_ways_without_sending_it() -> None:
    secret = b"s" * 32
    server_nonce = os.urandom(32)
    request, sn, cn = client_answer(secret, {"challenge": _b64(server_nonce), "mechanism": "hmac-sha256"})
    assert sn == server_nonce and secret not in encode(request)
    answer = check_auth(secret, server_nonce, request)
    verify_server(secret, sn, cn, answer)  # the server proved it holds the secret too
    with pytest.raises(MetadataAuthError, match="does not hold this client's secret"):
        verify_server(b"t" * 32, sn, cn, answer)
    with pytest.raises(MetadataAuthError, match="wrong secret"):
        check_auth(b"t" * 32, server_nonce, request)
    with pytest.raises(MetadataAuthError, match="wrong secret"):
        check_auth(secret, os.urandom(32), request)  # a recorded proof is useless for another nonce


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


# --- the secret file -------------------------------------------------------------------------------


def test_a_secret_file_open_to_other_users_is_refused_in_one_line(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "secret", mode=0o644)
    with pytest.raises(ConfigError) as err:
        read_secret(str(path))
    assert "0644" in str(err.value) and "chmod 600" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="at least 16"):
        read_secret(str(write_secret(tmp_path / "short", b"short")))
    with pytest.raises(ConfigError, match="cannot be opened"):
        read_secret(str(tmp_path / "missing"))
    assert read_secret(str(write_secret(tmp_path / "ok", b"x" * 20))) == b"x" * 20


def test_the_store_options_name_the_address_in_the_uri_and_the_secret_only_in_a_file(
        tmp_path: Path, secret_file: Path) -> None:
    with pytest.raises(ConfigError, match="needs metadata option 'secret_file'"):
        SqliteMetadataStore("sqlite+tcp://127.0.0.1:4181")
    with pytest.raises(ConfigError, match="HOST:PORT only"):
        SqliteMetadataStore("sqlite+tcp://user:pw@127.0.0.1:4181", secret_file=str(secret_file))
    with pytest.raises(ConfigError, match="HOST:PORT"):
        SqliteMetadataStore("sqlite+tcp://127.0.0.1", secret_file=str(secret_file))
    with pytest.raises(ConfigError, match="is for sqlite\\+tcp"):
        SqliteMetadataStore(f"sqlite://{tmp_path}/meta.db", secret_file=str(secret_file))
    with pytest.raises(ConfigError, match="open to other users"):
        SqliteMetadataStore("sqlite+tcp://127.0.0.1:4181", secret_file=str(write_secret(tmp_path / "w", mode=0o604)))
    store = SqliteMetadataStore("sqlite+tcp://[::1]:4181", secret_file=str(secret_file))
    assert store.tcp is not None and (store.tcp.host, store.tcp.port) == ("::1", 4181)
    assert secret_file.read_text().strip() not in repr(store.tcp)


@pytest.mark.parametrize(("args", "message"), [
    (("--listen", "0.0.0.0:0", "--secret-file", "{secret}"), "binds every interface"),
    (("--listen", "127.0.0.1:0"), "needs a secret_file"),
    (("--listen", "127.0.0.1:0", "--secret-file", "{open}"), "open to other users"),
    (("--listen", "127.0.0.1", "--secret-file", "{secret}"), "is not HOST:PORT"),
])
def test_the_server_refuses_a_bad_listen_setup_in_one_line(tmp_path: Path, secret_file: Path,
                                                           args: tuple[str, ...], message: str) -> None:
    open_file = write_secret(tmp_path / "open", mode=0o644)
    argv = [a.format(secret=secret_file, open=open_file) for a in args]
    done = subprocess.run([sys.executable, "-m", "ledgerstore", "metadata-server", "--db", str(tmp_path / "m.db"),
                           *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- against a real server process ----------------------------------------------------------------


def test_a_client_with_the_secret_reads_and_writes_over_tcp(server: TcpServer, secret_file: Path) -> None:
    async def main() -> None:
        s = store(server, secret_file)
        await s.start()
        try:
            await round_trip(s)
            assert await s.next_id("tcp") == 1
        finally:
            await s.close()

    run(main())


def test_a_wrong_secret_is_refused_in_one_line_and_logged_by_peer_without_the_secret(
        tmp_path: Path, server: TcpServer, secret_file: Path) -> None:
    wrong = write_secret(tmp_path / "wrong")

    async def main() -> None:
        bad = store(server, wrong)
        with pytest.raises(MetadataAuthError) as err:
            await bad.start()
        await bad.close()
        assert "wrong secret" in str(err.value) and "\n" not in str(err.value)
        await serves(server, secret_file)  # the server keeps serving everyone else

    run(main())
    log = server.log.read_text()
    assert re.search(r"refused a connection from 127\.0\.0\.1:\d+: wrong secret", log), log
    for secret in (secret_file.read_bytes().strip(), wrong.read_bytes().strip()):
        assert secret.decode() not in log


def test_a_request_without_authentication_is_refused_and_the_connection_closed(server: TcpServer) -> None:
    with contextlib.closing(raw_connect(server.port)) as sock:
        challenge = read_frame(sock)
        assert challenge is not None and challenge["mechanism"] == "hmac-sha256"
        sock.sendall(encode({"id": 1, "op": "hello", "session": None, "ttl": 5}))
        refused = read_frame(sock)
        assert refused is not None and refused["error"] == "unauthorized", refused
        assert "must be 'auth'" in str(refused["message"])
        assert read_frame(sock) is None  # and hung up


def test_garbage_before_authentication_is_refused_and_the_server_keeps_serving(
        server: TcpServer, secret_file: Path) -> None:
    with contextlib.closing(raw_connect(server.port)) as sock:
        assert read_frame(sock) is not None
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        refused = read_frame(sock)
        assert refused is not None and refused["error"] == "protocol", refused
        assert read_frame(sock) is None
    run(serves(server, secret_file))


def test_an_idle_unauthenticated_connection_is_closed_after_the_auth_timeout(server: TcpServer) -> None:
    with contextlib.closing(raw_connect(server.port)) as sock:
        assert read_frame(sock) is not None
        t0 = time.monotonic()
        assert read_frame(sock) is None  # says nothing: closed after --auth-timeout 0.5
        assert time.monotonic() - t0 < 5.0
    assert "did not authenticate within 0.5s" in server.log.read_text()


def test_unauthenticated_connections_are_bounded_and_the_server_serves_again_once_they_go(
        server: TcpServer, secret_file: Path) -> None:
    idle = [raw_connect(server.port) for _ in range(3)]  # --max-unauthenticated 3
    try:
        for sock in idle:
            assert read_frame(sock) is not None  # each got its challenge and now waits
        with contextlib.closing(raw_connect(server.port)) as extra:
            assert read_frame(extra) is None  # the fourth is closed on accept
        assert "3 connections are already authenticating" in server.log.read_text()
    finally:
        for sock in idle:
            sock.close()

    run(serves(server, secret_file, retry_s=10))  # the idle ones go once the server notices their close


def test_a_client_reconnects_over_tcp_and_resumes_its_session_after_a_server_restart(
        tmp_path: Path, server: TcpServer, secret_file: Path) -> None:
    async def main() -> None:
        s = store(server, secret_file, session_ttl=5.0)
        events: list[str] = []
        s.add_session_listener(events.append)
        await s.start()
        try:
            await s.put_ephemeral("/tcp/eph", b"mine")
            server.stop(signal.SIGKILL)
            with pytest.raises(MetadataError):
                await s.get("/tcp/eph")
            restarted = await asyncio.get_running_loop().run_in_executor(
                None, lambda: TcpServer(tmp_path, secret_file, port=server.port))
            try:
                deadline = asyncio.get_running_loop().time() + 10
                while True:
                    try:
                        got = await s.get("/tcp/eph")
                        break
                    except MetadataError:
                        assert asyncio.get_running_loop().time() < deadline, "the client did not reconnect"
                        await asyncio.sleep(0.1)
                assert got is not None and got.value == b"mine"  # resumed: its ephemeral key lives
                assert events == [], f"the session was not resumed: {events}"
            finally:
                await s.close()
                restarted.stop()
        finally:
            await s.close()

    run(main())


# --- TLS under the handshake ----------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path, secret_file: Path) -> Iterator[tuple[TcpServer, str]]:
    """A server whose TCP listener speaks TLS with a certificate for localhost / 127.0.0.1; yields
    it and the CA file that signed it."""
    cert, key = issue_certs(tmp_path / "pki", {"meta": ("localhost", "127.0.0.1")})["meta"]
    srv = TcpServer(tmp_path, secret_file, "--auth-timeout", "0.5", "--tls-cert-file", cert, "--tls-key-file", key)
    try:
        yield srv, str(tmp_path / "pki" / "ca.pem")
    finally:
        srv.stop()


def test_a_client_trusting_the_servers_ca_works_over_tls(tls_server: tuple[TcpServer, str], secret_file: Path) -> None:
    server, ca = tls_server
    assert "(TLS)" in server.log.read_text()
    run(serves(server, secret_file, ca_file=ca))


def test_tls_refuses_a_client_without_it_and_a_certificate_for_another_name(
        tls_server: tuple[TcpServer, str], secret_file: Path) -> None:
    server, ca = tls_server

    async def main() -> None:
        plain = store(server, secret_file)  # no ca_file: speaks plain TCP to a TLS listener
        with pytest.raises(MetadataError, match="hung up during authentication.*TLS listener"):
            await plain.start()
        await plain.close()
        wrong_name = store(server, secret_file, ca_file=ca, server_hostname="elsewhere.example")
        with pytest.raises(MetadataError, match="Hostname mismatch|certificate verify failed") as err:
            await wrong_name.start()
        await wrong_name.close()
        assert "\n" not in str(err.value)

    run(main())


def test_tls_options_are_checked_in_one_line(tmp_path: Path, secret_file: Path) -> None:
    with pytest.raises(ConfigError, match="server_hostname needs ca_file"):
        SqliteMetadataStore("sqlite+tcp://127.0.0.1:4181", secret_file=str(secret_file), server_hostname="x")
    with pytest.raises(ConfigError, match="not a readable file"):
        SqliteMetadataStore("sqlite+tcp://127.0.0.1:4181", secret_file=str(secret_file), ca_file=str(tmp_path / "no"))
    done = subprocess.run([sys.executable, "-m", "ledgerstore", "metadata-server", "--db", str(tmp_path / "m.db"),
                           "--listen", "127.0.0.1:0", "--secret-file", str(secret_file),
                           "--tls-cert-file", str(secret_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "go together" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_server_that_goes_silent_is_noticed_by_a_ping_and_requests_fail_at_once(
        server: TcpServer, secret_file: Path) -> None:
    """A server that stops answering without closing anything (a partition, a stopped process):
    the client drops the connection after a ping unanswered for two thirds of its TTL, so
    requests fail at once instead of each waiting its operation_timeout."""

    async def main() -> None:
        s = store(server, secret_file, session_ttl=1.5, operation_timeout=60.0)
        await s.start()
        try:
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(1.5 / 3 + 1.5 * 2 / 3 + 0.5)  # the next ping, unanswered
                t0 = time.monotonic()
                with pytest.raises(MetadataError, match="unreachable|lost the connection"):
                    await asyncio.wait_for(s.get("/tcp/k"), 5.0)  # TimeoutError, not this, before
                assert time.monotonic() - t0 < 1.0
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            deadline = time.monotonic() + 15
            while True:  # it reconnects once the server answers again
                try:
                    await round_trip(s)
                    break
                except MetadataError:
                    assert time.monotonic() < deadline, "the client did not reconnect"
                    await asyncio.sleep(0.1)
        finally:
            await s.close()

    run(main())
