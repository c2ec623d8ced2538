"""Ledger data and metadata over a live bookie's admin HTTP, through a real HTTP client: reading
them needs the admin credential unless the operator opens them up, and no answer of any endpoint,
no shell output and no log line carries anything derived from a ledger password (neither the
unsalted check older releases stored, nor the salted hash, nor its salt)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ledgerstore.aio import Client
from ledgerstore.bookie.http_bookie import bookie_routes
from ledgerstore.bookie.http_cluster import cluster_routes
from ledgerstore.bookie.http_ledgers import ledger_routes
from ledgerstore.cluster import LocalCluster, free_ports
from ledgerstore.proto.digest import legacy_password_check

TOKEN = "admin-token-ledger-secrets-41d7"
PASSWORD = b"ledger-password-8c2f1a"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 120))


@dataclasses.dataclass
class Bookie:
    cluster: LocalCluster
    http_port: int

    def get(self, path: str, token: str | None = None, headers: dict[str, str] | None = None,
            method: str = "GET") -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        try:
            conn.request(method, path, headers=sent)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


def start_bookie(data_dir: Path, http_table: str) -> Bookie:
    cluster = LocalCluster(data_dir, bookies=1, port_base=None)
    cluster.data_dir.mkdir(parents=True, exist_ok=True)
    cluster.write_configs()
    (http_port,) = free_ports(1)
    token_file = cluster.data_dir / "admin-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with open(cluster.config_path(0), "a") as fh:
        fh.write(f'http_port = {http_port}\n[bookie.http]\ntoken_file = "{token_file}"\n{http_table}')
    cluster.start()
    deadline = time.monotonic() + 30
    while True:  # the bookie registers just before its admin server listens
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=1).close()
            return Bookie(cluster, http_port)
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bookie]:
    b = start_bookie(tmp_path_factory.mktemp("ledger-secrets"), "")
    try:
        yield b
    finally:
        b.cluster.stop()


async def write_ledger(metadata: str, legacy: bool = False) -> int:
    """A closed ledger of three entries; with ``legacy`` its metadata holds the unsalted check
    an older release wrote."""
    async with Client(metadata=metadata) as client:
        lh = await client.create_ledger(1, 1, 1, password=PASSWORD)
        for i in range(3):
            await lh.append(b"entry %d" % i)
        await lh.close()
        if legacy:
            md = await client.ledgers.read(lh.ledger_id)
            await client.ledgers.write(dataclasses.replace(md, password_check=legacy_password_check(PASSWORD)))
        return lh.ledger_id


async def stored_check(metadata: str, ledger_id: int) -> str:
    async with Client(metadata=metadata) as client:
        return (await client.ledgers.read(ledger_id)).password_check


def secrets_of(check: str) -> set[str]:
    """Every spelling of a stored check and its parts that must never be shown."""
    out = {check}
    if check.startswith("scrypt$"):
        for part in check.split("$")[-2:]:
            raw = base64.b64decode(part)
            out |= {part, part.rstrip("="), raw.hex(), raw.hex().upper()}
    return out


def test_ledger_reads_need_the_admin_credential_by_default(bookie: Bookie) -> None:
    lid = run(write_ledger(bookie.cluster.metadata))
    pw = {"X-Ledger-Password": PASSWORD.decode()}
    for path, headers in ((f"/api/v1/ledger/metadata?ledger_id={lid}", {}),
                          ("/api/v1/ledger/list?print_metadata=true", {}),
                          (f"/api/v1/ledger/read?ledger_id={lid}", pw)):
        status, body = bookie.get(path, headers=headers)
        assert status == 401, (path, status, body)
        assert "Bearer" in json.loads(body)["error"]
        assert b"entry 0" not in body
        assert bookie.get(path, token="not-the-token", headers=headers)[0] == 401
        status, body = bookie.get(path, token=TOKEN, headers=headers)
        assert status == 200, (path, status, body)
    _, body = bookie.get(f"/api/v1/ledger/read?ledger_id={lid}", token=TOKEN, headers=pw)
    assert json.loads(body) == {"0": "entry 0", "1": "entry 1", "2": "entry 2"}
    # the credential does not replace the ledger's password
    assert bookie.get(f"/api/v1/ledger/read?ledger_id={lid}", token=TOKEN,
                      headers={"X-Ledger-Password": "guess"})[0] == 403
    # other reads keep following allow_anonymous_read (on by default)
    assert bookie.get("/api/v1/bookie/state")[0] == 200


def test_an_option_opens_ledger_reads_to_anonymous_callers(tmp_path: Path) -> None:
    b = start_bookie(tmp_path, "allow_anonymous_ledger_read = true\n")
    try:
        lid = run(write_ledger(b.cluster.metadata))
        assert b.get(f"/api/v1/ledger/metadata?ledger_id={lid}")[0] == 200
        assert b.get("/api/v1/ledger/list")[0] == 200
        status, body = b.get(f"/api/v1/ledger/read?ledger_id={lid}", headers={"X-Ledger-Password": PASSWORD.decode()})
        assert status == 200 and b"entry 2" in body
        assert b.get(f"/api/v1/ledger/read?ledger_id={lid}")[0] == 403  # the ledger's password is still needed
        assert b.get(f"/api/v1/ledger/delete?ledger_id={lid}", method="DELETE")[0] == 401  # deletes never
    finally:
        b.cluster.stop()


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every built-in endpoint, from the route tables the server is built from."""
    unbound = SimpleNamespace(bookie=None)
    open_routes, protected = bookie_routes(unbound)
    return sorted({(m, p) for m, p, _ in [*open_routes, *protected, *ledger_routes(unbound), *cluster_routes(unbound)]})


def test_no_answer_shell_output_or_log_line_carries_a_password_derived_value(bookie: Bookie) -> None:
    metadata = bookie.cluster.metadata
    new_lid = run(write_ledger(metadata))
    old_lid = run(write_ledger(metadata, legacy=True))
    secrets = {legacy_password_check(PASSWORD), base64.b64encode(PASSWORD).decode(), PASSWORD.decode()}
    secrets |= secrets_of(run(stored_check(metadata, new_lid)))
    assert run(stored_check(metadata, old_lid)) == legacy_password_check(PASSWORD)

    seen: list[tuple[str, int, bytes]] = []
    query = f"ledger_id={new_lid}&print_metadata=true&limit=100"
    for lid in (old_lid, new_lid):
        for method, path in every_route():
            for token in (None, TOKEN):
                if method != "GET" and token is not None:
                    continue  # state changes are answered only for their refusal here
                status, body = bookie.get(f"{path}?{query.replace(str(new_lid), str(lid))}", token=token,
                                          headers={"X-Ledger-Password": PASSWORD.decode()}, method=method)
                seen.append((f"{method} {path} ({'token' if token else 'anonymous'})", status, body))
    answered = {what for what, status, _ in seen if status == 200}
    for must in ("GET /api/v1/ledger/metadata (token)", "GET /api/v1/ledger/list (token)",
                 "GET /api/v1/ledger/read (token)", "GET /metrics (anonymous)"):
        assert must in answered, must
    assert any(f'"ledger_id": {old_lid}'.encode() in body or f'"ledger_id":{old_lid}'.encode() in body
               for what, _, body in seen if what == "GET /api/v1/ledger/metadata (token)")

    # reading the old ledger through HTTP verified its password: its check was rewritten by CAS
    upgraded = run(stored_check(metadata, old_lid))
    assert upgraded.startswith("scrypt$")
    secrets |= secrets_of(upgraded)

    shell = [sys.executable, "-m", "ledgerstore", "shell", "--metadata", metadata]
    for lid in (old_lid, new_lid):
        for extra in ([], ["--json"]):
            out = subprocess.run([*shell, "ledgermetadata", "-l", str(lid), *extra], capture_output=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert str(lid).encode() in out.stdout
            seen.append((f"shell ledgermetadata {lid} {extra}", 0, out.stdout + out.stderr))
    bookie.cluster.stop()
    seen.append(("bookie log", 0, bookie.cluster.log_path(0).read_bytes()))

    for what, _, body in seen:
        for secret in secrets:
            assert secret.encode() not in body, (what, secret)
