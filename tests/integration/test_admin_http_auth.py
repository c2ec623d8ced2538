"""Who may use a bookie's admin HTTP server, against real bookie processes: state changes need the
bearer token or a client certificate, a wrong token is refused, anonymous reads follow the
``allow_anonymous_read`` switch, a bookie without credentials refuses state changes with advice,
and neither the token nor a ledger password ever reaches the log."""

from __future__ import annotations

import base64
import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ledgerstore.cluster import free_ports, start_metadata_server_process, stop_process
from ledgerstore.testing.servers import make_pki

TOKEN = "s3cr3t-admin-token-7d2e9a"
WRONG = "wrong-token-0b5c44"

#: every state-changing endpoint of the built-in API, with a body it would accept
STATE_CHANGES = [
    ("PUT", "/api/v1/bookie/state", {"readOnly": True}),
    ("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}),
    ("PUT", "/api/v1/bookie/gc", {"major": True}),
    ("PUT", "/api/v1/bookie/gc/suspend_compaction", {"suspendMajor": True}),
    ("PUT", "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": True}),
    ("PUT", "/api/v1/bookie/expand_storage", {"ledger_dirs": []}),
    ("PUT", "/api/v1/config/server_config", {"disk_usage_threshold": 0.99}),
    ("DELETE", "/api/v1/ledger/delete?ledger_id=1", None),
    ("PUT", "/api/v1/autorecovery/trigger_audit", None),
    ("PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay", {"delay_seconds": 5}),
    ("PUT", "/api/v1/autorecovery/status?enabled=false", None),
    ("PUT", "/api/v1/autorecovery/decommission", {"bookie_src": "127.0.0.1:1"}),
    ("PUT", "/api/v1/autorecovery/bookie", {"bookie_src": ["127.0.0.1:1"]}),
]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@dataclass
class BookieProcess:
    """One bookie process with its admin server; ``log`` is everything the process printed."""

    proc: subprocess.Popen[bytes]
    http_port: int
    log: Path
    tls: ssl.SSLContext | None = None

    def request(self, method: str, path: str, body: object = None, token: str | None = None,
                headers: dict[str, str] | None = None, tls: ssl.SSLContext | None = None) -> Reply:
        ctx = tls or self.tls
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection("127.0.0.1", self.http_port, timeout=60, context=ctx) if ctx
            else http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60))
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, path, body=data, headers=sent)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def start_bookie(tmp_path: Path) -> Iterator[Callable[..., BookieProcess]]:
    """Start a bookie process whose ``[bookie.http]`` table is ``http_table``."""
    started: list[BookieProcess] = []
    servers: list[subprocess.Popen[bytes]] = []

    def start(http_table: str, log_level: str = "INFO", tls: ssl.SSLContext | None = None) -> BookieProcess:
        d = tmp_path / f"bookie-{len(started)}"
        d.mkdir()
        # the bookie reaches its sqlite file through a metadata server, as every bookie does by default
        servers.append(start_metadata_server_process(d / "meta.db", d / "metadata-server.log"))
        port, http_port = free_ports(2)
        cfg = d / "bookie.toml"
        cfg.write_text(
            "[bookie]\n"
            f'metadata = "sqlite://{d / "meta.db"}"\nlisten = "tcp://127.0.0.1:{port}"\nauto_init_cluster = true\n'
            'journal_dir = "journal"\nledger_dirs = ["ledgers"]\n'
            f"http_port = {http_port}\n[bookie.http]\n{http_table}\n")
        log = d / "bookie.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "ledgerstore", "bookie", "--config", str(cfg),
                                     "--log-level", log_level], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        b = BookieProcess(proc, http_port, log, tls)
        started.append(b)
        deadline = time.monotonic() + 60
        while True:  # the admin port listens just before the bookie registers
            assert proc.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", http_port), timeout=1).close()
                if b.request("GET", "/api/v1/bookie/is_ready").status == 200:
                    return b
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    yield start
    for b in started:
        b.stop()
    for server in servers:
        stop_process(server)


def token_table(tmp_path: Path, extra: str = "") -> str:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return f'token_file = "{token_file}"\n{extra}'


def test_an_anonymous_state_change_is_refused_with_401_and_changes_nothing(start_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = start_bookie(token_table(tmp_path))
    for method, path, body in STATE_CHANGES:
        r = b.request(method, path, body)
        assert r.status == 401, (method, path, r.status, r.body)
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "Bearer" in r.json()["error"]  # type: ignore[index]
    # nothing changed: the bookie is writable, compaction runs, auto-recovery is on
    assert b.request("GET", "/api/v1/bookie/state/readonly").json() == {"readOnly": False}
    assert b.request("GET", "/api/v1/bookie/gc/suspend_compaction").json() == {
        "isMajorGcSuspended": "false", "isMinorGcSuspended": "false"}
    assert b.request("GET", "/api/v1/autorecovery/status").json() == {"enabled": True}
    # the token makes the same request work
    r = b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}, token=TOKEN)
    assert (r.status, r.json()) == (200, {"readOnly": True})
    assert b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": False}, token=TOKEN).status == 200


def test_a_wrong_token_is_refused_even_where_anonymity_would_do(start_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = start_bookie(token_table(tmp_path))
    r = b.request("PUT", "/api/v1/bookie/state", {"readOnly": True}, token=WRONG)
    assert r.status == 401 and r.json()["error"] == "wrong bearer token"  # type: ignore[index]
    assert b.request("GET", "/api/v1/bookie/state", token=WRONG).status == 401
    assert b.request("GET", "/api/v1/bookie/state", headers={"Authorization": f"Basic {TOKEN}"}).status == 401
    assert b.request("GET", "/api/v1/bookie/state", headers={"Authorization": "Bearer "}).status == 401
    assert b.request("GET", "/api/v1/bookie/state", token=TOKEN[:-1]).status == 401  # a prefix is not the token
    assert b.request("GET", "/api/v1/bookie/state").json()["readOnly"] is False  # type: ignore[index]


def test_reads_are_anonymous_only_when_the_switch_allows_it(start_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    closed = start_bookie(token_table(tmp_path, "allow_anonymous_read = false\n"))
    for path in ("/api/v1/bookie/state", "/metrics", "/api/v1/bookie/info", "/api/v1/ledger/list",
                 "/api/v1/autorecovery/status", "/api/v1/no/such/endpoint"):
        assert closed.request("GET", path).status == 401, path
        assert closed.request("HEAD", path).status == 401, path
    assert closed.request("GET", "/api/v1/bookie/state", token=TOKEN).status == 200
    assert closed.request("GET", "/metrics", token=TOKEN).status == 200  # Prometheus: authorization credentials_file
    # the probes stay open (anonymous_paths): they tell nothing a TCP connect does not
    assert closed.request("GET", "/heartbeat").status == 200
    assert closed.request("GET", "/api/v1/bookie/is_ready").status == 200

    open_ = start_bookie(token_table(tmp_path))  # allow_anonymous_read defaults to true
    assert open_.request("GET", "/api/v1/bookie/state").status == 200
    assert open_.request("GET", "/metrics").status == 200
    # ...but not the protected reads: the configuration, and the sanity test that writes a ledger
    assert open_.request("GET", "/api/v1/config/server_config").status == 401
    assert open_.request("GET", "/api/v1/bookie/sanity").status == 401
    assert open_.request("GET", "/api/v1/config/server_config", token=TOKEN).status == 200


def test_without_credentials_configured_state_changes_answer_403_saying_how_to_configure(start_bookie) -> None:  # type: ignore[no-untyped-def]
    b = start_bookie("")
    for method, path, body in STATE_CHANGES:
        r = b.request(method, path, body)
        assert r.status == 403, (method, path, r.status)
        assert "token_file" in r.json()["error"]  # type: ignore[index]
    assert b.request("PUT", "/api/v1/bookie/state", {"readOnly": True}, token=TOKEN).status == 401
    assert b.request("GET", "/api/v1/bookie/state").json()["readOnly"] is False  # type: ignore[index]


def test_neither_the_token_nor_a_ledger_password_is_ever_logged(start_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = start_bookie(token_table(tmp_path), log_level="DEBUG")
    assert b.request("PUT", "/api/v1/bookie/state", {"readOnly": False}, token=TOKEN).status == 200
    assert b.request("GET", "/api/v1/bookie/state", token=TOKEN).status == 200
    assert b.request("PUT", "/api/v1/bookie/state", {"readOnly": True}, token=WRONG).status == 401
    assert b.request("GET", "/api/v1/ledger/read?ledger_id=7", token=TOKEN,
                     headers={"X-Ledger-Password": "ledger-pw-91ab"}).status == 404
    # a ledger password in the URL is refused (URLs end up in logs and shell histories)
    r = b.request("GET", "/api/v1/ledger/read?ledger_id=7&password=url-pw-33cd", token=TOKEN)
    assert r.status == 400 and "X-Ledger-Password" in r.json()["error"]  # type: ignore[index]
    assert b.request("GET", f"/api/v1/bookie/state?token={TOKEN}").status == 400
    with socket.create_connection(("127.0.0.1", b.http_port), timeout=30) as s:  # a malformed header line
        s.sendall(f"GET /heartbeat HTTP/1.1\r\nAuthorization Bearer {TOKEN}\r\n\r\n".encode())
        assert s.recv(65536).startswith(b"HTTP/1.1 400 ")
    b.stop()
    text = b.log.read_text()
    # the requests were logged (the check below proves something)...
    assert "PUT /api/v1/bookie/state -> 200" in text and "by token" in text
    assert "GET /api/v1/bookie/state -> 200" in text
    assert "PUT /api/v1/bookie/state -> 401" in text and "wrong bearer token" in text
    assert "password=***" in text
    # ...without a secret
    for secret in (TOKEN, WRONG, "ledger-pw-91ab", "url-pw-33cd"):
        assert secret not in text, secret


def test_a_client_certificate_signed_by_the_ca_authenticates(start_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "rogue").mkdir()
    rogue = make_pki(tmp_path / "rogue")  # another CA: its client certificate must not be accepted

    def client_context(cert: str | None, key: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=pki["ca.pem"])
        if cert and key:
            ctx.load_cert_chain(cert, key)
        return ctx

    anonymous = client_context(None, None)
    b = start_bookie(token_table(tmp_path, f'tls_cert_file = "{pki["server.pem"]}"\n'
                                           f'tls_key_file = "{pki["server.key"]}"\ntls_ca_file = "{pki["ca.pem"]}"\n'),
                     tls=anonymous)
    with_cert = client_context(pki["client.pem"], pki["client.key"])
    r = b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}, tls=with_cert)
    assert (r.status, r.json()) == (200, {"readOnly": True})
    r = b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": False}, tls=anonymous)  # TLS, no cert
    assert r.status == 401 and "client certificate" in r.json()["error"]  # type: ignore[index]
    assert b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": False}, token=TOKEN).status == 200
    assert b.request("GET", "/api/v1/bookie/state").status == 200
    with pytest.raises((ssl.SSLError, ConnectionError)):
        b.request("GET", "/api/v1/bookie/state", tls=client_context(rogue["client.pem"], rogue["client.key"]))
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):  # plain HTTP is not served
        _plain_get(b.http_port)
    assert b.request("GET", "/heartbeat").status == 200  # the server survived all of it


def _plain_get(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/api/v1/bookie/state")
        conn.getresponse().read()
    finally:
        conn.close()


def test_a_bookie_with_an_unreadable_token_file_does_not_start(tmp_path: Path) -> None:
    cfg = tmp_path / "bookie.toml"
    port, http_port = free_ports(2)
    cfg.write_text(f'[bookie]\nmetadata = "sqlite://{tmp_path / "meta.db"}"\nlisten = "tcp://127.0.0.1:{port}"\n'
                   'auto_init_cluster = true\nmetadata_options = { server = "never" }\n'  # no metadata server
                   f'journal_dir = "j"\nledger_dirs = ["l"]\nhttp_port = {http_port}\n'
                   f'[bookie.http]\ntoken_file = "{tmp_path / "missing-token"}"\n')
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "bookie", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "token_file" in out.stdout + out.stderr and "missing-token" in out.stdout + out.stderr


USER_PASSWORD = "basic-pw-4e19c2"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def credentials_table(tmp_path: Path) -> str:
    """A credential file with the user ``ops``, written by ``ledgerstore credentials add`` with
    the password on stdin, as an operator would."""
    path = tmp_path / "users"
    done = subprocess.run([sys.executable, "-m", "ledgerstore", "credentials", "add", "ops", "--file", str(path)],
                          input=USER_PASSWORD + "\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    assert USER_PASSWORD not in path.read_text()
    return f'credentials_file = "{path}"\n'


def test_a_user_of_the_credentials_file_authenticates_with_http_basic(start_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = start_bookie(credentials_table(tmp_path), log_level="DEBUG")
    r = b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}, headers=basic("ops", USER_PASSWORD))
    assert (r.status, r.json()) == (200, {"readOnly": True})
    assert b.request("GET", "/api/v1/bookie/state/readonly").json() == {"readOnly": True}
    wrong = b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": False}, headers=basic("ops", "nope"))
    assert wrong.status == 401 and wrong.json()["error"] == "wrong user name or password"  # type: ignore[index]
    assert "Basic" in wrong.headers["www-authenticate"]
    unknown = b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": False},
                        headers=basic("nobody", USER_PASSWORD))
    assert unknown.status == 401 and unknown.json()["error"] == "wrong user name or password"  # type: ignore[index]
    assert b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": False}).status == 401
    assert b.request("PUT", "/api/v1/bookie/state/readonly", {"readOnly": False}, token=TOKEN).status == 401
    assert b.request("GET", "/api/v1/bookie/state/readonly").json() == {"readOnly": True}  # nothing changed
    b.stop()
    text = b.log.read_text()
    assert "PUT /api/v1/bookie/state/readonly -> 200" in text and "by user ops" in text
    assert "wrong user name or password" in text
    assert USER_PASSWORD not in text and "nope" not in text


def test_a_bookie_whose_credentials_file_is_open_to_others_does_not_start(tmp_path: Path) -> None:
    table = credentials_table(tmp_path)
    (tmp_path / "users").chmod(0o644)
    cfg = tmp_path / "bookie.toml"
    port, http_port = free_ports(2)
    cfg.write_text(f'[bookie]\nmetadata = "sqlite://{tmp_path / "meta.db"}"\nlisten = "tcp://127.0.0.1:{port}"\n'
                   'auto_init_cluster = true\nmetadata_options = { server = "never" }\n'
                   f'journal_dir = "j"\nledger_dirs = ["l"]\nhttp_port = {http_port}\n[bookie.http]\n{table}')
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "bookie", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "credentials_file" in out.stdout + out.stderr and "chmod 600" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
