"""Cluster administration through the real CLI: healthcheck, updatebookieinledger and
updateledgers, recover -sk / -l, admin HTTP errors, and the commands that need an existing cluster."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import ledgerstore
from ledgerstore.cluster import LocalCluster, free_ports

from .test_cli import ls, shell


def md_of(cluster: LocalCluster, lid: int) -> dict[str, object]:
    return json.loads(shell(cluster, "ledgermetadata", "-l", str(lid), "--json").stdout)  # type: ignore[no-any-return]


def wait_unregistered(cluster: LocalCluster, bookie: str) -> None:
    deadline = time.monotonic() + 30
    while bookie in cluster.registered():
        assert time.monotonic() < deadline, f"{bookie} still registered"
        time.sleep(0.1)


def bookies_of(md: dict[str, object]) -> set[str]:
    return {b for _, ens in md["ensembles"] for b in ens}  # type: ignore[attr-defined]


def test_healthcheck_switch_is_kept_in_the_cluster_metadata(shared_cluster: LocalCluster) -> None:
    assert json.loads(shell(shared_cluster, "healthcheck", "-status", "--json").stdout) == {"enabled": True}
    assert json.loads(shell(shared_cluster, "healthcheck", "-enable", "false", "--json").stdout) == {"enabled": False}
    assert "health check is disabled" in shell(shared_cluster, "healthcheck", "-status").stdout
    assert json.loads(shell(shared_cluster, "healthcheck", "-enable", "true", "--json").stdout) == {"enabled": True}
    assert json.loads(shell(shared_cluster, "healthcheck", "-disable", "--json").stdout) == {"enabled": False}
    assert json.loads(shell(shared_cluster, "healthcheck", "--enable", "true", "--json").stdout) == {"enabled": True}
    assert shell(shared_cluster, "healthcheck", "-enable", "true", "-disable", check=False).returncode == 2


def test_updatebookieinledger_refuses_a_running_source_and_an_unregistered_destination(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(4)
    cluster.start()
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        lh = client.create_ledger(3, 3, 3, password=b"pw", bookies=[cluster.bookie_id(i) for i in range(3)])
        lh.close()
    src, dest = cluster.bookie_id(0), cluster.bookie_id(3)
    out = shell(cluster, "updateBookieInLedger", "-srcBookie", src, "-destBookie", dest, "-f", check=False)
    assert out.returncode == 1 and "is registered (running)" in out.stderr, out.stderr
    cluster.kill(0, signal.SIGTERM)
    wait_unregistered(cluster, src)
    out = shell(cluster, "updateBookieInLedger", "-srcBookie", src, "-destBookie", "10.0.0.9:3181", "-f", check=False)
    assert out.returncode == 1 and "not a registered bookie" in out.stderr, out.stderr
    out = shell(cluster, "updateBookieInLedger", "-srcBookie", src, "-destBookie", cluster.bookie_id(1), "-f",
                check=False)  # already in the ensemble: the ledger manager refuses a bookie named twice
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert src in bookies_of(md_of(cluster, lh.ledger_id))
    r = json.loads(shell(cluster, "updatebookieinledger", "-sb", src, "-db", dest, "-updatespersec", "0",
                         "-printprogress", "0", "-verbose", "-limit", "10", "-f", "--json").stdout)
    assert r["updated_ledgers"] == [lh.ledger_id]
    assert bookies_of(md_of(cluster, lh.ledger_id)) == {dest, cluster.bookie_id(1), cluster.bookie_id(2)}


def test_updateledgers_moves_ledgers_from_a_bookies_ip_id_to_its_host_name_id(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3)
    cluster.start()
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        lh = client.create_ledger(3, 3, 3, password=b"pw")
        lh.close()
    old = cluster.bookie_id(0)  # 127.0.0.1:PORT
    port = old.rpartition(":")[2]
    # the same bookie, now configured to be known by its host name (fresh directories keep the test short)
    i = cluster.add_bookie()
    cfg = cluster.config_path(i)
    cfg.write_text(cfg.read_text().replace(cluster.address(i), f"tcp://127.0.0.1:{port}")
                   + f'advertised_address = "tcp://localhost:{port}"\n')
    refused = ls("shell", "updateledgers", "--config", str(cfg), "-bookieid", "hostname", "-f", check=False)
    assert refused.returncode == 1 and "is registered (running)" in refused.stderr, refused.stderr
    refused = ls("shell", "updateledgers", "--config", str(cfg), "-bookieid", "ip", "-f", check=False)
    assert refused.returncode == 2 and "expects the bookie's config to give an IP address" in refused.stderr
    cluster.kill(0, signal.SIGTERM)
    wait_unregistered(cluster, old)
    refused = ls("shell", "updateledgers", "--config", str(cfg), "-bookieid", "hostname", "-f", check=False)
    assert refused.returncode == 1 and "not a registered bookie" in refused.stderr, refused.stderr  # not started yet
    cluster.start_bookie(i)
    deadline = time.monotonic() + 60
    while f"localhost:{port}" not in cluster.registered():
        assert time.monotonic() < deadline, cluster.log_path(i).read_text()
        time.sleep(0.1)
    r = json.loads(ls("shell", "updateledgers", "--config", str(cfg), "-bookieid", "hostname", "-updatespersec", "0",
                      "-f", "--json").stdout)
    assert r == {"src": old, "dest": f"localhost:{port}", "updated_ledgers": [lh.ledger_id]}
    assert f"localhost:{port}" in bookies_of(md_of(cluster, lh.ledger_id))
    assert old not in bookies_of(md_of(cluster, lh.ledger_id))


def test_recover_skip_open_ledgers_and_one_ledger_leave_the_others_on_the_lost_bookie(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(4)
    cluster.start()
    three = [cluster.bookie_id(i) for i in range(3)]
    lost = three[0]
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        closed = []
        for _ in range(2):
            lh = client.create_ledger(3, 2, 2, password=b"pw", bookies=three)
            for k in range(10):
                lh.append(b"c%d" % k)
            lh.close()
            closed.append(lh.ledger_id)
        open_lh = client.create_ledger(3, 2, 2, password=b"pw", bookies=three)
        open_lh.append(b"still open")
        cluster.kill(0)
        wait_unregistered(cluster, lost)
        # -l: only that ledger moves off the lost bookie
        r = json.loads(shell(cluster, "recover", lost, "-l", str(closed[0]), "--open-ledger-grace", "0",
                             "--json").stdout)
        assert r["ledgers"] == 1
        assert lost not in bookies_of(md_of(cluster, closed[0]))
        assert lost in bookies_of(md_of(cluster, closed[1]))
        listed = json.loads(shell(cluster, "recover", lost, "-q", "-sk", "--json").stdout)
        assert [row["ledger_id"] for row in listed] == [closed[1]]  # the open ledger is left out
        # -sk: closed ledgers move; the open one keeps its writer and its ensemble
        r = json.loads(shell(cluster, "recover", lost, "-skipOpenLedgers", "--open-ledger-grace", "0",
                             "--json").stdout)
        assert r["ledgers"] == 1
        assert lost not in bookies_of(md_of(cluster, closed[1]))
        md = md_of(cluster, open_lh.ledger_id)
        assert md["state"] == "OPEN" and lost in bookies_of(md)
        open_lh.append(b"the writer goes on")  # not fenced: the skipped ledger was not recovered
        open_lh.close()


def test_gc_http_errors_are_one_line_and_a_failure_exit(cluster_factory: Callable[..., LocalCluster],
                                                       tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-the-admin")
    token.chmod(0o600)
    (http_port,) = free_ports(1)
    cluster = cluster_factory(1, extra_bookie_config=f'http_port = {http_port}\n[bookie.http]\ntoken_file = "{token}"\n')
    cluster.start()
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    wrong.chmod(0o600)
    for args in ([], ["--token-file", str(wrong)]):
        out = ls("shell", "gc", "--http", f"127.0.0.1:{http_port}", *args, check=False)
        assert out.returncode == 1, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "401" in out.stderr and "--token-file" in out.stderr
    (closed,) = free_ports(1)
    out = ls("shell", "gc", "--http", f"127.0.0.1:{closed}", check=False)
    assert out.returncode == 1 and "cannot reach" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    ok = json.loads(ls("shell", "gc", "--http", f"127.0.0.1:{http_port}", "--token-file", str(token), "--json").stdout)
    assert "reclaimed_bytes" in ok


def test_gc_http_against_something_that_does_not_speak_http_is_one_line() -> None:
    """A reply that is not HTTP (http.client's BadStatusLine is no OSError) is one line, not a traceback."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_garbage() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-not-a-web-server\r\n\r\n")

    t = threading.Thread(target=answer_garbage, daemon=True)
    t.start()
    try:
        out = ls("shell", "gc", "--http", f"127.0.0.1:{port}", check=False)
    finally:
        t.join(30)
        server.close()
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_bench_and_autorecovery_refuse_a_uri_holding_no_cluster(tmp_path: Path) -> None:
    typo = tmp_path / "metdata.db"
    for args in (["bench", "writes", "--metadata", f"sqlite://{typo}", "--count", "10"],
                 ["autorecovery", "--metadata", f"sqlite://{typo}"]):
        out = ls(*args, check=False)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "no cluster is initialised" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert not typo.exists()
    empty = tmp_path / "empty.db"
    ls("shell", "--metadata", f"sqlite://{empty}", "whatisinstanceid")  # a store that exists, holding no cluster
    out = ls("autorecovery", "--metadata", f"sqlite://{empty}", check=False)
    assert out.returncode == 1 and "no cluster is initialised" in out.stderr, out.stderr


def test_a_bookie_on_a_store_holding_no_cluster_fails_in_one_line_naming_initnewcluster(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    cfg = tmp_path / "bookie.toml"
    cfg.write_text(f'[bookie]\nmetadata = "sqlite://{tmp_path / "meta.db"}"\nlisten = "tcp://127.0.0.1:{port}"\n'
                   'journal_dir = "journal"\nledger_dirs = ["ledgers"]\n'
                   'metadata_options = { server = "never" }\n')  # one bookie, no metadata server: direct mode
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "bookie", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "initnewcluster" in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert json.loads(ls("shell", "--metadata", f"sqlite://{tmp_path / 'meta.db'}", "whatisinstanceid",
                         "--json").stdout)["instance_id"] is None  # it created no cluster
    ls("shell", "--metadata", f"sqlite://{tmp_path / 'meta.db'}", "initnewcluster")
    proc = subprocess.Popen([sys.executable, "-m", "ledgerstore", "bookie", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if " ready" in line:
                break
        else:
            raise AssertionError("bookie did not start in the initialised cluster:\n" + "".join(seen))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
