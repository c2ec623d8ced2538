"""TLS between hosts: a client reaches each bookie by the hostname it registered and accepts only
a certificate that names that host; a certificate for another name is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerstore.testing.netns import NetCluster
from tests.multihost.conftest import Agent

pytestmark = pytest.mark.multihost


def test_clients_check_the_bookie_hostname_against_its_certificate(net_cluster_factory: type[NetCluster],
                                                                   tmp_path: Path) -> None:
    net = net_cluster_factory(["meta", "b1", "b2", "c1"]).start()
    # b2's certificate names another host: signed by the same CA, so only the name check catches it
    certs = net.make_certs(tmp_path / "pki", names={"b2": "elsewhere.cluster.test"})
    metadata = net.start_etcd("meta").uri("/tls")
    net.init_cluster("c1", metadata)
    for b in ("b1", "b2"):
        cert, key = certs[b]
        net.start_bookie(b, metadata, f'[bookie.transport]\ncert_file = "{cert}"\nkey_file = "{key}"\n',
                         scheme="tcp+tls")
    client = Agent(net, "c1", metadata, transport={"tcp+tls": {"ca_file": str(tmp_path / "pki" / "ca.pem")}})

    # both bookies are needed: the one with the wrong name fails the handshake, so the add fails
    client.ask("create", e=2, qw=2, qa=2)
    refused = client.ask("append", n=1)
    assert refused["acked"] == [] and "Hostname mismatch" in refused["error"], refused

    # one bookie is enough: whichever is chosen first, the entry ends on b1, whose name matches
    ledger = client.ask("create", e=1, qw=1, qa=1)["ledger"]
    assert client.ask("append", n=5)["acked"] == [0, 1, 2, 3, 4]
    assert client.ask("metadata", ledger=ledger)["ensembles"][-1][1] == ["b1.cluster.test:3181"]
