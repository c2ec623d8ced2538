"""``ledgerstore standalone --http-port-base P --autorecovery``: bookie i serves admin HTTP on
P+i, state changes need the token from the file it names (the token itself is never printed),
and an auditor and replication workers run inside the standalone's bookies."""

from __future__ import annotations

import http.client
import json
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from prometheus_client.parser import text_string_to_metric_families

from ledgerstore.ports import consecutive_free_ports

CLI = [sys.executable, "-m", "ledgerstore"]


def request(port: int, method: str, path: str, token: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def read_until(stream: IO[str], marker: str) -> str:
    """What ``stream`` printed up to the line holding ``marker`` (all of it if it ended first)."""
    out = ""
    while marker not in out:
        line = stream.readline()
        if not line:
            raise AssertionError(f"the standalone ended before printing {marker!r}:\n{out}")
        out += line
    return out


def auditors_elected(ports: list[int], token: str) -> float:
    total = 0.0
    for port in ports:
        status, text = request(port, "GET", "/metrics", token)
        assert status == 200, text
        total += sum(s.value for f in text_string_to_metric_families(text)
                     if f.name == "ledgerstore_auditor_elected" for s in f.samples)
    return total


def test_standalone_serves_admin_http_per_bookie_with_a_token_file_and_runs_autorecovery(tmp_path: Path) -> None:
    base = consecutive_free_ports(2)
    data = tmp_path / "d"
    proc = subprocess.Popen([*CLI, "standalone", "--data-dir", str(data), "--bookies", "2", "--port-base", "0",
                             "--http-port-base", str(base), "--autorecovery"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        out = read_until(proc.stdout, "serving")
        token_file = data.resolve() / "admin-token"
        token = token_file.read_text().strip()
        assert len(token) >= 32 and token not in out, "the token is named by its file, never printed"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert str(token_file) in out and "auto-recovery: on" in out, out
        ports = [base, base + 1]
        for port in ports:
            assert f"admin http://127.0.0.1:{port}" in out, out

        # a state change needs the credential; with it, it is done
        assert request(base + 1, "PUT", "/api/v1/bookie/gc?minor=true")[0] in (401, 403)
        status, body = request(base + 1, "PUT", "/api/v1/bookie/gc?minor=true", token)
        assert status == 200, body

        # exactly one of the bookies is the elected auditor
        deadline = time.monotonic() + 60
        while auditors_elected(ports, token) != 1:
            assert time.monotonic() < deadline, "no auditor was elected inside the standalone"
            time.sleep(0.2)
        metadata = f"sqlite://{data.resolve() / 'metadata.db'}"
        who = subprocess.run([*CLI, "shell", "--metadata", metadata, "whoisauditor", "--json"],
                             capture_output=True, text=True, timeout=60)
        assert who.returncode == 0 and json.loads(who.stdout)["auditor"], who.stdout + who.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_an_http_port_base_leaving_the_port_range_fails_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run([*CLI, "standalone", "--data-dir", str(tmp_path / "d"), "--bookies", "3", "--port-base", "0",
                          "--http-port-base", "65534"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "--http-port-base 65534" in errors[0], out.stderr
