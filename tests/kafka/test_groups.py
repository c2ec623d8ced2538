"""Consumer groups with real clients: subscribe, consume, commit, and a new consumer of the
group resumes at the committed offset; committed offsets are kept in the ``kafka_groups`` log
and outlive the broker; three members share three partitions and rebalance when one leaves and when one is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from kafka import KafkaConsumer, KafkaProducer

from tests.kafka.conftest import (
    KafkaCluster,
    confluent_poll,
    kafka_command,
    start_standalone,
    stop_standalone,
)

pytestmark = pytest.mark.timeout(300)


def produce(bootstrap: str, topic: str, n: int) -> list[bytes]:
    values = [f"{topic}-{i}".encode() for i in range(n)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    for v in values:
        producer.send(topic, v)
    producer.flush()
    producer.close()
    return values


def kafka_python_group_read(bootstrap: str, topic: str, group: str, n: int) -> list[bytes]:
    """Subscribe as a member of ``group``, read ``n`` records, commit, leave."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=30_000)
    got = []
    for message in consumer:
        got.append(message.value)
        if len(got) == n:
            break
    consumer.commit()
    consumer.close()
    return got


def test_kafka_python_commits_and_a_new_member_resumes_at_the_committed_offset(kafka_cluster: KafkaCluster,
                                                                               topic: str) -> None:
    values = produce(kafka_cluster.bootstrap, topic, 100)
    assert kafka_python_group_read(kafka_cluster.bootstrap, topic, f"g-{topic}", 60) == values[:60]
    assert kafka_python_group_read(kafka_cluster.bootstrap, topic, f"g-{topic}", 40) == values[60:]


def confluent_group_read(bootstrap: str, topic: str, group: str, n: int) -> list[bytes]:
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False})
    consumer.subscribe([topic])
    messages = confluent_poll(consumer, n)
    # commit exactly what was read (librdkafka may have fetched further)
    consumer.commit(message=messages[-1], asynchronous=False)
    consumer.close()
    return [m.value() for m in messages]


def test_confluent_kafka_commits_and_a_new_member_resumes_at_the_committed_offset(kafka_cluster: KafkaCluster,
                                                                                  topic: str) -> None:
    producer = ConfluentProducer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all"})
    values = [f"c-{i}".encode() for i in range(100)]
    for v in values:
        producer.produce(topic, v)
    assert producer.flush(60) == 0
    assert confluent_group_read(kafka_cluster.bootstrap, topic, f"cg-{topic}", 70) == values[:70]
    assert confluent_group_read(kafka_cluster.bootstrap, topic, f"cg-{topic}", 30) == values[70:]


def test_committed_offsets_outlive_a_restart_of_the_broker(tmp_path: Path) -> None:
    cluster = start_standalone(tmp_path)
    try:
        values = produce(cluster.bootstrap, "kept", 50)
        assert kafka_python_group_read(cluster.bootstrap, "kept", "survivor", 20) == values[:20]
    finally:
        stop_standalone(cluster.proc)
    cluster = start_standalone(tmp_path)
    try:
        assert kafka_python_group_read(cluster.bootstrap, "kept", "survivor", 30) == values[20:]
    finally:
        stop_standalone(cluster.proc)


class Member(threading.Thread):
    """A kafka-python group member polling on its own thread until told to leave."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                      session_timeout_ms=6000, heartbeat_interval_ms=500)
        self.assigned: frozenset[int] = frozenset()
        self.leave = threading.Event()

    def run(self) -> None:
        while not self.leave.is_set():
            self.consumer.poll(timeout_ms=200)
            self.assigned = frozenset(tp.partition for tp in self.consumer.assignment())
        self.consumer.close()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.2)


def test_a_group_of_three_shares_three_partitions_and_rebalances_when_one_leaves(kafka_cluster: KafkaCluster,
                                                                                 tmp_path: Path) -> None:
    with kafka_command(kafka_cluster.metadata, tmp_path, "num_partitions = 3\n") as bootstrap:
        produce(bootstrap, "shared", 30)
        members = [Member(bootstrap, "shared", "three") for _ in range(3)]
        for m in members:
            m.start()
        try:
            wait_until(lambda: sorted(len(m.assigned) for m in members) == [1, 1, 1]
                       and frozenset().union(*(m.assigned for m in members)) == {0, 1, 2},
                       "each of three members holds one partition")
            members[2].leave.set()
            members[2].join(30)
            wait_until(lambda: frozenset().union(*(m.assigned for m in members[:2])) == {0, 1, 2}
                       and not members[0].assigned & members[1].assigned,
                       "the two members left share the three partitions")
        finally:
            for m in members:
                m.leave.set()
            for m in members:
                m.join(30)


MEMBER_PROCESS = """
import sys
from kafka import KafkaConsumer
consumer = KafkaConsumer(sys.argv[2], bootstrap_servers=sys.argv[1], group_id=sys.argv[3], session_timeout_ms=6000,
                         heartbeat_interval_ms=500)
while True:
    consumer.poll(timeout_ms=200)
    print(sorted(tp.partition for tp in consumer.assignment()), flush=True)
"""


def test_a_member_killed_with_sigkill_loses_its_partitions_within_its_session_timeout(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    with kafka_command(kafka_cluster.metadata, tmp_path, "num_partitions = 3\n") as bootstrap:
        produce(bootstrap, "victim", 30)
        members = [Member(bootstrap, "victim", "killed") for _ in range(2)]
        victim = subprocess.Popen([sys.executable, "-c", MEMBER_PROCESS, bootstrap, "victim", "killed"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for m in members:
            m.start()
        try:
            wait_until(lambda: sorted(len(m.assigned) for m in members) == [1, 1],
                       "the two members and the process hold one partition each")
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            killed_at = time.monotonic()
            wait_until(lambda: frozenset().union(*(m.assigned for m in members)) == {0, 1, 2},
                       "the killed member's partition moves to the others")
            assert time.monotonic() - killed_at < 6 + 10  # the session timeout, and time to rejoin
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait(10)
            for m in members:
                m.leave.set()
            for m in members:
                m.join(30)
