"""Which hot path runs, compiled or pure Python, is visible: ``ledgerstore plugins`` and
``ledgerstore --version --verbose`` print it, a bookie logs it once at start and exports it as the
``ledgerstore_hot_path_compiled`` gauge, and the pure path always says why it runs."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledgerstore.cluster import LocalCluster, free_ports
from ledgerstore.proto import speedups

BUILT = speedups.load() is not None
needs_built = pytest.mark.skipif(not BUILT, reason="the compiled hot path is not built here (scripts/setup.sh)")
FORCED = f"{speedups.PURE_PYTHON_ENV}=1"


def ledgerstore(*args: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != speedups.PURE_PYTHON_ENV}
    out = subprocess.run([sys.executable, "-m", "ledgerstore", *args], env={**base, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout


@needs_built
def test_plugins_and_version_say_the_compiled_hot_path_runs() -> None:
    assert ledgerstore("plugins").splitlines()[-1] == "hot path: compiled"
    verbose = ledgerstore("--version", "--verbose").splitlines()
    assert verbose[0].startswith("ledgerstore, version ") and "hot path: compiled" in verbose
    rows = json.loads(ledgerstore("plugins", "--json"))
    assert {"slot": "hot path", "name": "compiled", "status": "ok"}.items() <= rows[-1].items()


def test_the_pure_path_says_it_was_forced_by_the_environment() -> None:
    env = {speedups.PURE_PYTHON_ENV: "1"}
    assert ledgerstore("plugins", **env).splitlines()[-1] == f"hot path: pure Python ({FORCED})"
    assert f"hot path: pure Python ({FORCED})" in ledgerstore("--version", "-v", **env).splitlines()
    row = json.loads(ledgerstore("plugins", "--json", **env))[-1]
    assert (row["slot"], row["name"], row["status"]) == ("hot path", "pure Python", FORCED)
    assert "hot path" not in ledgerstore("--version", **env)


def _chosen_after(setup: str) -> list[str]:
    """Whether a fresh interpreter that first runs ``setup`` runs the pure path, and its state."""
    code = f"{setup}\nfrom ledgerstore.proto import speedups; print(speedups.compiled is None); print(speedups.state)"
    env = {k: v for k, v in os.environ.items() if k != speedups.PURE_PYTHON_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.splitlines()


def test_the_pure_path_says_the_extension_was_not_built() -> None:
    # the import system's own way of saying a module is absent, as on an install built without a compiler
    assert _chosen_after("import sys; sys.modules['ledgerstore.proto._speedups'] = None") == [
        "True", "pure Python (ledgerstore.proto._speedups is not built; a build without a working C compiler skips it)"]


@needs_built
def test_a_stale_build_without_a_function_of_this_checkout_is_not_used() -> None:
    # an extension built from an older checkout (before the varint log entry was compiled) imports fine
    assert _chosen_after("import ledgerstore.proto._speedups as built; del built.log_entry_varint") == [
        "True", "pure Python (ledgerstore.proto._speedups is out of date (no log_entry_varint); rebuild it with scripts/setup.sh)"]


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, f"nothing listens on the admin port {port}"
        time.sleep(0.05)


@pytest.mark.parametrize("path", [pytest.param("compiled", marks=needs_built), "pure"])
def test_a_bookie_logs_its_hot_path_at_start_and_exports_it_as_a_gauge(
        cluster_factory: Callable[..., LocalCluster], path: str) -> None:
    (port,) = free_ports(1)
    forced = path == "pure"
    env = {speedups.PURE_PYTHON_ENV: "1" if forced else "0"}
    cluster = cluster_factory(1, env=env, extra_bookie_config=f"http_port = {port}\n")
    cluster.start()
    _wait_listening(port)
    want = f"pure Python ({FORCED})" if forced else "compiled"
    started = [line for line in cluster.log_path(0).read_text().splitlines() if " serving on " in line]
    assert len(started) == 1 and started[0].endswith(f"hot path: {want})"), started
    gauge = {labels: v for (name, labels), v in _scrape(port).items() if name == "ledgerstore_hot_path_compiled"}
    assert gauge == ({(("reason", FORCED),): 0.0} if forced else {(("reason", ""),): 1.0})
