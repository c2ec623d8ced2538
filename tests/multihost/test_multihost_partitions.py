"""Partitions between real hosts: every bookie, client and the metadata server on its own address
(network namespaces on one bridge, see :mod:`ledgerstore.testing.netns`), and hosts that go
silent without a reset, so only timeouts notice."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from ledgerstore.testing.netns import KAFKA_PORT
from tests.multihost.conftest import (
    ADD_TIMEOUT_S,
    BOOKIES,
    METADATA_READ_RETRY_S,
    METADATA_TIMEOUT_S,
    MultiHost,
    host_of,
)

pytestmark = pytest.mark.multihost

#: what a writer may wait beyond its add timeout for a replacement (metadata round trips, the
#: resend), far below the minutes TCP itself takes to give up on a silent peer
ENSEMBLE_CHANGE_SLACK_S = 3.0


def _check_nothing_acknowledged_is_lost(cluster: MultiHost, ledger: int, acked: list[int]) -> int:
    """Recover ``ledger`` from the other client host and read it whole; return its last entry."""
    reader = cluster.agent("c2")
    last = reader.ask("recover", ledger=ledger)["last"]
    assert max(acked) <= last, f"acknowledged entry {max(acked)} is beyond the recovered last entry {last}"
    read = reader.ask("read", ledger=ledger)
    assert read["count"] == last + 1 and read["bad"] == [], read
    return int(last)


def test_a_silent_bookie_is_replaced_within_the_add_timeout(cluster: MultiHost) -> None:
    writer = cluster.agent("c1")
    ledger = writer.ask("create", e=3, qw=2, qa=2)["ledger"]
    first = writer.ask("append", n=50)
    assert first["error"] is None
    victim = writer.ask("metadata", ledger=ledger)["ensembles"][0][1][0]

    writer.send("write_for", seconds=3 * ADD_TIMEOUT_S + 4, batch=20)
    time.sleep(1.5)
    cluster.net.link_down(host_of(victim))  # no FIN, no RST: its packets just stop
    during = writer.answer()

    assert during["error"] is None, during["error"]
    assert during["max_gap"] < ADD_TIMEOUT_S + ENSEMBLE_CHANGE_SLACK_S, (
        f"the writer waited {during['max_gap']:.1f}s for one batch; the add timeout is {ADD_TIMEOUT_S}s")
    ensembles = writer.ask("metadata", ledger=ledger)["ensembles"]
    assert len(ensembles) >= 2 and victim not in ensembles[-1][1], ensembles
    acked = first["acked"] + during["acked"]
    assert acked == list(range(len(acked))), "acknowledgements out of order or with holes"
    cluster.net.link_up(host_of(victim))
    _check_nothing_acknowledged_is_lost(cluster, ledger, acked)


def test_a_writer_cut_off_from_the_metadata_server_keeps_acknowledging_until_it_needs_it(
        cluster: MultiHost) -> None:
    writer = cluster.agent("c1")
    ledger = writer.ask("create", e=3, qw=2, qa=2)["ledger"]
    acked = writer.ask("append", n=20)["acked"]
    victim = writer.ask("metadata", ledger=ledger)["ensembles"][-1][1][0]
    cluster.net.cut("c1", ["meta"])
    # adds to an open ledger need the bookies only
    during = writer.ask("append", n=200)
    assert during["error"] is None and len(during["acked"]) == 200
    acked += during["acked"]
    # a bookie failure needs an ensemble change, which is a metadata write: the writer stops
    # acknowledging and, once the metadata request's deadline passes, fails the adds
    cluster.net.link_down(host_of(victim))
    t0 = time.monotonic()
    stalled = writer.ask("append", n=20)
    elapsed = time.monotonic() - t0
    # acknowledged: at most the entries before the first whose write quorum holds the silent bookie
    assert stalled["acked"] == list(range(220, 220 + len(stalled["acked"]))) and len(stalled["acked"]) < 3
    assert stalled["error"].startswith("MetadataError"), stalled
    # the ensemble change's reads retry for metadata_read_retry_s, then one last request times out
    assert elapsed < ADD_TIMEOUT_S + METADATA_READ_RETRY_S + METADATA_TIMEOUT_S + ENSEMBLE_CHANGE_SLACK_S, elapsed
    assert writer.ask("append", n=1)["acked"] == [], "the failed handle took another add"
    acked += stalled["acked"]
    cluster.net.heal()
    _check_nothing_acknowledged_is_lost(cluster, ledger, acked)


def test_a_writer_cut_off_from_the_bookies_fails_its_adds_after_the_add_timeout(cluster: MultiHost) -> None:
    writer = cluster.agent("c1")
    ledger = writer.ask("create", e=3, qw=2, qa=2)["ledger"]
    acked = writer.ask("append", n=20)["acked"]
    cluster.net.cut("c1", BOOKIES)  # the metadata server stays reachable
    t0 = time.monotonic()
    stalled = writer.ask("append", n=20)
    elapsed = time.monotonic() - t0
    assert stalled["acked"] == [] and stalled["error"].startswith("AddFailedError"), stalled
    assert elapsed < 2 * ADD_TIMEOUT_S + ENSEMBLE_CHANGE_SLACK_S, elapsed
    cluster.net.heal()
    last = _check_nothing_acknowledged_is_lost(cluster, ledger, acked)
    assert last <= 19 + 20


def test_the_old_writer_is_fenced_by_a_recoverer_across_a_partition(cluster: MultiHost) -> None:
    writer = cluster.agent("c1")
    ledger = writer.ask("create", e=3, qw=2, qa=2)["ledger"]
    acked = writer.ask("append", n=100)["acked"]
    cluster.net.link_down("c1")
    last = _check_nothing_acknowledged_is_lost(cluster, ledger, acked)
    assert last == 99
    cluster.net.link_up("c1")
    after = writer.ask("append", n=1)
    assert after["acked"] == [] and after["error"].startswith("LedgerFencedError"), after
    assert cluster.agent("c2").ask("metadata", ledger=ledger)["last"] == 99


def test_a_log_leader_partitioned_away_loses_its_log_to_the_new_leader(cluster: MultiHost) -> None:
    name = f"log-{time.monotonic_ns()}"
    old = cluster.agent("c1")
    old.ask("open_log", name=name, tag="old")
    old_acked = old.ask("log_append", n=100)
    assert old_acked["error"] is None
    cluster.net.link_down("c1")
    new = cluster.agent("c2")
    new.ask("open_log", name=name, tag="new")
    assert new.ask("log_append", n=50)["error"] is None
    cluster.net.link_up("c1")
    late = old.ask("log_append", n=5)
    assert late["acked"] == [] and late["error"] is not None, late
    new.ask("close_log")
    payloads = new.ask("read_log", name=name)["payloads"]
    assert payloads == [f"old-{i}" for i in range(100)] + [f"new-{i}" for i in range(50)]


def test_rack_aware_ensembles_span_racks_and_a_lost_rack_is_re_replicated_across_racks(
        cluster: MultiHost) -> None:
    racks = {f"{b}.cluster.test:3181": r for b, r in
             {"b1": "/dc1/r1", "b2": "/dc1/r1", "b3": "/dc1/r2", "b4": "/dc1/r2", "b5": "/dc1/r3"}.items()}
    writer = cluster.agent("c1", placement="rack-aware",
                           placement_options={"topology_file": str(cluster.topology)})
    cluster.wait_bookies(writer)
    ledgers = []
    for _ in range(12):
        ledgers.append(writer.ask("create", e=2, qw=2, qa=2)["ledger"])
        assert writer.ask("append", n=20)["error"] is None
        writer.ask("close")

    def ensembles(ledger: int) -> list[list[str]]:
        return [e for _, e in writer.ask("metadata", ledger=ledger)["ensembles"]]

    for ledger in ledgers:
        for ens in ensembles(ledger):
            assert len({racks[b] for b in ens}) == 2, (ledger, ens)
    lost = {b for b in racks if racks[b] == "/dc1/r1"}
    for b in lost:
        cluster.net.link_down(host_of(b))
    try:
        deadline = time.monotonic() + 60
        while any(lost & set(ens) for ledger in ledgers for ens in ensembles(ledger)):
            assert time.monotonic() < deadline, "the lost rack's ledgers were not re-replicated within 60s"
            time.sleep(1)
        for ledger in ledgers:
            for ens in ensembles(ledger):
                assert len({racks[b] for b in ens}) == 2, f"ledger {ledger} re-replicated onto one rack: {ens}"
            assert writer.ask("read", ledger=ledger)["count"] == 20
    finally:
        cluster.net.heal()
        cluster.wait_bookies(writer)


def test_partition_actions_run_while_a_writer_writes(cluster: MultiHost) -> None:
    """The partition helpers are safe to call from another thread while agents talk."""
    writer = cluster.agent("c1")
    writer.ask("create", e=3, qw=2, qa=2)
    t = threading.Thread(target=lambda: (cluster.net.cut("b5", ["c1"]), cluster.net.heal("b5")))
    writer.send("append", n=100)
    t.start()
    t.join()
    assert writer.answer()["error"] is None


#: a Kafka client run inside a host: produce ``n`` records with acks=all to one topic through the
#: front end at ``argv[1]``, read them back from the start, print how many came back, whether in
#: order, and the brokers Metadata named
_KAFKA_CLIENT = """
import sys
from kafka import KafkaConsumer, KafkaProducer
boot, n = sys.argv[1], int(sys.argv[2])
producer = KafkaProducer(bootstrap_servers=boot, acks="all", request_timeout_ms=20000)
for i in range(n):
    producer.send("across-hosts", f"record {i}".encode()).get(timeout=30)
brokers = sorted(f"{b.host}:{b.port}" for b in producer._metadata.brokers())  # as Metadata named them
producer.close()
consumer = KafkaConsumer("across-hosts", bootstrap_servers=boot, auto_offset_reset="earliest",
                         consumer_timeout_ms=5000)
got = [m.value.decode() for m in consumer]
consumer.close()
print(len(got), got == [f"record {i}" for i in range(n)], *brokers)
"""


def test_a_kafka_client_on_one_host_uses_a_front_end_on_another_by_its_name(cluster: MultiHost) -> None:
    """``ledgerstore kafka`` on host c2 over the bookies of b1..b5 and etcd on meta; kafka-python on
    host c1 bootstraps from c2's name, is sent that name back in Metadata (the front end's
    ``advertised_host``), produces with acks=all and reads every record back, in order."""
    net = cluster.net
    front = net.start_kafka("c2", cluster.metadata)
    try:
        done = subprocess.run(net.command("c1", [sys.executable, "-c", _KAFKA_CLIENT,
                                                 f"{net.host('c2').hostname}:{KAFKA_PORT}", "50"]),
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["50", "True", f"{net.host('c2').hostname}:{KAFKA_PORT}"], done.stdout
    finally:
        net.stop(front)
