"""Several brokers on one cluster: the standalone cluster's own broker (node 0) and two
``ledgerstore kafka`` processes (nodes 1 and 2) share a topic's partitions by their leases in the
metadata store and answer the same leaders; a broker asked for a partition another leads
answers ``NOT_LEADER_OR_FOLLOWER``; a broker killed with -9 loses its partitions to the others
within the store's session timeout, and a confluent-kafka producer goes on with no record lost."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ledgerstore.cluster import LocalCluster
from ledgerstore.testing.servers import free_port
from ledgerstore_kafka.codec import Writer
from tests.kafka.conftest import KafkaCluster, RawClient, record_batch, start_kafka_process

pytestmark = pytest.mark.timeout(400)

PARTITIONS = 6


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic=topic, timeout=30)
    return {p.id: p.leader for p in meta.topics[topic].partitions.values()}


def brokers(bootstrap: str) -> set[int]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).brokers)


def agreed(addresses: tuple[str, ...], topic: str, live: set[int], timeout: float = 40) -> dict[int, int]:
    """The partitions' leaders once every broker at ``addresses`` lists the ``live`` brokers and
    answers the same leaders, among them (each broker reads the leases on its own second)."""
    deadline = time.monotonic() + timeout
    while True:
        views = [(brokers(a), leaders(a, topic)) for a in addresses]
        if all(b == live and set(v.values()) <= live and v == views[0][1] for b, v in views):
            return views[0][1]
        assert time.monotonic() < deadline, views
        time.sleep(0.5)


def test_partitions_spread_over_brokers_and_a_killed_brokers_move_to_the_others(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    topic = "spread"  # its six partitions land on all three brokers (rendezvous hashing is fixed)
    one = start_kafka_process(kafka_cluster.metadata, tmp_path / "one", free_port(), node_id=1)
    two = start_kafka_process(kafka_cluster.metadata, tmp_path / "two", free_port(), node_id=2)
    try:
        admin = AdminClient({"bootstrap.servers": one.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result(30)
        addresses = (kafka_cluster.bootstrap, one.bootstrap, two.bootstrap)
        before = agreed(addresses, topic, {0, 1, 2})
        assert set(before.values()) == {0, 1, 2}  # spread over the three
        led_by_two = min(p for p, node in before.items() if node == 2)

        raw = RawClient(one.bootstrap)  # node 1 does not lead that partition: it says so
        try:
            raw.create_topic(topic)
            wrong = record_batch(-1, -1, -1, [b"wrong broker"])
            assert raw.produce(topic, wrong, partition=led_by_two)[0] == 6  # NOT_LEADER_OR_FOLLOWER
            # node 0 coordinates the groups (the lowest live id): node 1 answers NOT_COORDINATOR
            assert raw.request(12, 0, Writer().string("g").int32(1).string("m").bytes()).int16() == 16
        finally:
            raw.close()

        producer = Producer({"bootstrap.servers": one.bootstrap, "acks": "all", "linger.ms": 5,
                             "message.timeout.ms": 120_000, "topic.metadata.refresh.interval.ms": 1000})
        acked: dict[int, int] = {}

        def delivered(err: object, msg: object) -> None:
            assert err is None, err
            p = msg.partition()  # type: ignore[attr-defined]
            acked[p] = acked.get(p, 0) + 1

        for i in range(PARTITIONS * 50):
            producer.produce(topic, f"before-{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
        assert producer.flush(60) == 0

        two.proc.send_signal(signal.SIGKILL)
        two.proc.wait(30)
        killed = time.monotonic()
        after = agreed(addresses[:2], topic, {0, 1})
        took = time.monotonic() - killed
        print(f"node 2's partitions moved {took:.1f}s after its SIGKILL: {before} -> {after}")
        assert took < 25  # the store's session timeout (10 s), its reaping and one refresh
        assert {p: n for p, n in after.items() if before[p] != 2} == {p: n for p, n in before.items() if n != 2}

        for i in range(PARTITIONS * 50):
            producer.produce(topic, f"after-{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
        assert producer.flush(90) == 0
        assert acked == {p: 100 for p in range(PARTITIONS)}

        consumer = Consumer({"bootstrap.servers": one.bootstrap, "group.id": f"g-{topic}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got: dict[int, list[int]] = {}
        deadline = time.monotonic() + 60
        while sum(len(v) for v in got.values()) < PARTITIONS * 100 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.setdefault(message.partition(), []).append(message.offset())
        consumer.close()
        assert {p: offsets for p, offsets in got.items()} == {p: list(range(100)) for p in range(PARTITIONS)}
    finally:
        for broker in (one, two):
            if broker.proc.poll() is None:
                broker.proc.send_signal(signal.SIGTERM)
                broker.proc.wait(60)


def test_a_paused_broker_that_lost_its_partition_answers_not_leader_and_writes_nothing(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """A broker frozen (SIGSTOP) past its session loses its partitions to the others; a produce
    already on its socket when it wakes is answered ``NOT_LEADER_OR_FOLLOWER`` (its log writer was
    fenced, or it saw the lease go), and the partition holds no record of it."""
    topic = "paused"
    one = start_kafka_process(kafka_cluster.metadata, tmp_path / "one", free_port(), node_id=1)
    two = start_kafka_process(kafka_cluster.metadata, tmp_path / "two", free_port(), node_id=2)
    raw = None
    try:
        admin = AdminClient({"bootstrap.servers": one.bootstrap})  # kept: results need their client
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result(30)
        addresses = (kafka_cluster.bootstrap, one.bootstrap, two.bootstrap)
        before = agreed(addresses, topic, {0, 1, 2})
        partition = min(p for p, node in before.items() if node == 2)
        raw = RawClient(two.bootstrap)
        assert raw.produce(topic, record_batch(-1, -1, -1, [b"first"]), partition=partition) == (0, 0)

        two.proc.send_signal(signal.SIGSTOP)
        after = agreed(addresses[:2], topic, {0, 1})
        assert after[partition] != 2
        producer = Producer({"bootstrap.servers": one.bootstrap, "acks": "all", "message.timeout.ms": 60_000})
        for i in range(10):
            producer.produce(topic, f"new-leader-{i}".encode(), partition=partition)
        assert producer.flush(60) == 0

        answer: list[tuple[int, int]] = []
        zombie = threading.Thread(target=lambda: answer.append(
            raw.produce(topic, record_batch(-1, -1, -1, [b"zombie"]), partition=partition)))  # type: ignore[union-attr]
        zombie.start()
        time.sleep(0.5)  # the request waits in the frozen broker's socket
        two.proc.send_signal(signal.SIGCONT)
        zombie.join(60)
        assert answer and answer[0][0] == 6, answer  # NOT_LEADER_OR_FOLLOWER

        consumer = Consumer({"bootstrap.servers": one.bootstrap, "group.id": f"g-{topic}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, partition, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < 11 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
        assert consumer.poll(2.0) is None  # nothing after the eleven
        consumer.close()
        assert values == [b"first", *(f"new-leader-{i}".encode() for i in range(10))]
    finally:
        if raw is not None:
            raw.close()
        if two.proc.poll() is None:
            two.proc.send_signal(signal.SIGCONT)
        for broker in (one, two):
            if broker.proc.poll() is None:
                broker.proc.send_signal(signal.SIGTERM)
                broker.proc.wait(60)


def coordinator_seen_by(bootstrap: str, group: str) -> int:
    raw = RawClient(bootstrap)
    try:
        r = raw.request(10, 0, Writer().string(group).bytes())  # FindCoordinator v0
        return r.int32() if r.int16() == 0 else -1
    finally:
        raw.close()


def wait_for_coordinator(addresses: tuple[str, ...], group: str, node: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (seen := [coordinator_seen_by(a, group) for a in addresses]) != [node] * len(addresses):
        assert time.monotonic() < deadline, seen
        time.sleep(0.5)


def test_a_coordinator_that_lost_the_groups_and_regains_them_answers_the_offsets_committed_meanwhile(
        shared_cluster: LocalCluster, tmp_path: Path) -> None:
    """Broker 1 coordinates (the lowest live id) and holds a group's offset 5; frozen past its
    session, broker 2 takes the groups over and the group commits 9 there; woken, broker 1 is the
    coordinator again and must answer 9, read from the groups' log, not the 5 it held."""
    topic, group = "coordinated", "g-coordinated"
    one = start_kafka_process(shared_cluster.metadata, tmp_path / "one", free_port(), node_id=1)
    two = start_kafka_process(shared_cluster.metadata, tmp_path / "two", free_port(), node_id=2)
    try:
        admin = AdminClient({"bootstrap.servers": one.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
        both = (one.bootstrap, two.bootstrap)
        wait_for_coordinator(both, group, 1)

        def commit(bootstrap: str, offset: int) -> None:
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
            try:
                consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
            finally:
                consumer.close()

        commit(one.bootstrap, 5)
        one.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for_coordinator(both[1:], group, 2)
            commit(two.bootstrap, 9)
        finally:
            one.proc.send_signal(signal.SIGCONT)
        wait_for_coordinator(both, group, 1)
        consumer = Consumer({"bootstrap.servers": one.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        finally:
            consumer.close()
        assert committed.offset == 9
    finally:
        for broker in (one, two):
            if broker.proc.poll() is None:
                broker.proc.send_signal(signal.SIGCONT)
                broker.proc.send_signal(signal.SIGTERM)
                broker.proc.wait(60)
