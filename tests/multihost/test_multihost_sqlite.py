"""The sqlite metadata server as the metadata host of a cluster across hosts: the server on host
``meta`` serving TCP with a shared secret (``sqlite+tcp://``), four bookies ``b1``..``b4`` and
client hosts ``c1`` and ``c2``, each its own network namespace. Bookies and clients reach the
server only over the network, so cutting a host off from ``meta`` cuts it off from its metadata.

The partition tests of :mod:`tests.multihost.test_multihost_partitions` that involve the metadata
server run here too, unchanged, against this cluster: what a writer cut off from the metadata
server acknowledges, and when it stops, is what ``docs/protocol.md`` says whatever the store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledgerstore.testing.netns import Service
from tests.multihost.conftest import METADATA_TIMEOUT_S, MultiHost, cluster_hosts, start_bookies
from tests.multihost.test_multihost_partitions import (
    test_a_writer_cut_off_from_the_metadata_server_keeps_acknowledging_until_it_needs_it,
    test_the_old_writer_is_fenced_by_a_recoverer_across_a_partition,
)

pytestmark = pytest.mark.multihost

__all__ = [
    "test_a_writer_cut_off_from_the_metadata_server_keeps_acknowledging_until_it_needs_it",
    "test_the_old_writer_is_fenced_by_a_recoverer_across_a_partition",
]

SQLITE_BOOKIES = ["b1", "b2", "b3", "b4"]
#: session TTL of every process: a silent host's registration lapses after this
SESSION_TTL_S = 3


@pytest.fixture(scope="module")
def multihost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    """This module's cluster (overrides the etcd one of ``conftest``)."""
    with cluster_hosts(tmp_path_factory, "multihost-sqlite", SQLITE_BOOKIES) as net:
        server = net.start_sqlite("meta")
        assert server.secret_file is not None
        # the administrator initialises the cluster on the metadata host, through its Unix socket
        net.init_cluster("meta", f"sqlite://{net.workdir / 'sqlite-meta' / 'meta.db'}")
        options = {"session_timeout": SESSION_TTL_S, "secret_file": str(server.secret_file)}
        metadata = server.uri(scheme="sqlite+tcp")
        start_bookies(net, SQLITE_BOOKIES, metadata,
                      f'metadata_options = {{ session_timeout = {SESSION_TTL_S}, secret_file = "{server.secret_file}" }}\n')
        yield MultiHost(net, metadata, net.workdir / "no-topology",
                        metadata_options={**options, "operation_timeout": METADATA_TIMEOUT_S})


def test_bookies_and_clients_on_other_hosts_write_and_read_through_the_sqlite_metadata_server(
        cluster: MultiHost) -> None:
    writer = cluster.agent("c1")
    cluster.wait_bookies(writer, len(SQLITE_BOOKIES))
    assert sorted(writer.ask("bookies")["bookies"]) == [f"{b}.cluster.test:3181" for b in SQLITE_BOOKIES]
    ledger = writer.ask("create", e=3, qw=2, qa=2)["ledger"]
    written = writer.ask("append", n=100)
    assert written["error"] is None and written["acked"] == list(range(100))
    writer.ask("close")
    reader = cluster.agent("c2")
    assert reader.ask("metadata", ledger=ledger)["last"] == 99
    read = reader.ask("read", ledger=ledger)
    assert read["count"] == 100 and read["bad"] == [], read
    assert "refused" not in _server(cluster).log_text()


def test_a_client_with_a_wrong_secret_is_refused_and_the_server_logs_its_host(cluster: MultiHost) -> None:
    wrong = cluster.net.workdir / "wrong-secret"
    wrong.write_text("not the cluster's secret, but long enough\n")
    wrong.chmod(0o600)
    with pytest.raises(AssertionError, match="MetadataAuthError.*wrong secret"):
        cluster.agent("c2", metadata_options={"secret_file": str(wrong), "session_timeout": SESSION_TTL_S})
    assert f"refused a connection from {cluster.net.host('c2').address}:" in _server(cluster).log_text()


def _server(cluster: MultiHost) -> Service:
    return next(s for s in cluster.net.services if s.log_path.name.startswith("sqlite-"))
