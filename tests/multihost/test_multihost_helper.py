"""The test-cluster helper itself: hosts reach each other by name and by address only, partitions
are silent and undone, and everything it made is gone after a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.testing.netns import NETNS_ETC, STATE_DIR, NetCluster, netns_unavailable
from tests.multihost.conftest import Agent

pytestmark = pytest.mark.multihost


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_without_root_the_multihost_tests_skip_with_one_line() -> None:
    if os.geteuid() != 0:
        why = netns_unavailable()
    else:  # ask as an ordinary user what it would be told
        why = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
             "from ledgerstore.testing.netns import netns_unavailable; print(netns_unavailable())"],
            capture_output=True, text=True, timeout=60).stdout.strip()
    assert why == "creating network namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"


def test_everything_made_is_removed_after_a_failure(net_cluster_factory: type[NetCluster]) -> None:
    net = net_cluster_factory(["a", "b"])
    with pytest.raises(RuntimeError), net:
        svc = net.popen("a", ["sleep", "600"])
        made = [h.netns for h in net.hosts.values()] + [net.bridge_ns]
        assert all(ns in _namespaces() for ns in made)
        raise RuntimeError("a failing test")
    assert svc.proc.poll() is not None, "the process started in a host outlived the cluster"
    listed = _namespaces()
    assert not any(ns in listed for ns in made)
    assert not any((NETNS_ETC / ns).exists() for ns in made)
    assert not (STATE_DIR / f"{net.tag}.json").exists()


def test_hosts_resolve_each_other_and_nothing_else(net_cluster_factory: type[NetCluster], tmp_path: Path) -> None:
    net = net_cluster_factory(["a", "b"]).start()
    server = net.popen("b", [sys.executable, "-m", "http.server", "--bind", net.host("b").address, "8000"],
                       log="http.log")
    net.wait_for(server, "Serving HTTP", 30)
    assert net.can_connect("a", "b.cluster.test", 8000)
    routes = subprocess.run(net.command("a", ["ip", "route"]), capture_output=True, text=True).stdout
    assert "default" not in routes and routes.count("\n") == 1, routes  # the subnet, nothing else
    net.link_down("b")
    assert not net.can_connect("a", "b", 8000)
    net.heal()
    net.cut("a", ["b"])
    assert not net.can_connect("a", "b", 8000)
    net.heal("a")
    assert net.can_connect("a", "b", 8000)


def test_bookies_and_clients_on_their_own_hosts_share_a_zookeeper_on_another(
        net_cluster_factory: type[NetCluster]) -> None:
    net = net_cluster_factory(["zk", "b1", "b2", "c1"]).start()
    metadata = net.start_zookeeper("zk").uri("/ledgers", scheme="zk")
    net.init_cluster("c1", metadata)
    for b in ("b1", "b2"):
        net.start_bookie(b, metadata, listen_any=True)  # binds 0.0.0.0, advertises its hostname
    client = Agent(net, "c1", metadata)
    assert client.ask("bookies")["bookies"] == ["b1.cluster.test:3181", "b2.cluster.test:3181"]
    ledger = client.ask("create", e=2, qw=2, qa=2)["ledger"]
    assert client.ask("append", n=10)["acked"] == list(range(10))
    net.cut("c1", ["zk"])  # adds need the bookies only
    assert client.ask("append", n=10)["acked"] == list(range(10, 20))
    net.heal()
    client.ask("close")
    assert client.ask("read", ledger=ledger) == {"count": 20, "last": 19, "bad": []}
