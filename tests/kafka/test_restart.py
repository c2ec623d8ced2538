"""A partition's index is rebuilt from its log: after a restart of the whole standalone cluster
every record reads back in order and offsets continue where they were; with no batch cache
every fetch reads its batches from the log, and the newest batches, not yet readable there
(beyond the bookies' last-add-confirmed), are served from memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.kafka.conftest import kafka_command, start_standalone, stop_standalone

pytestmark = pytest.mark.timeout(400)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, batch_size=1)
    futures = [producer.send(topic, v) for v in values]
    producer.flush()
    offsets = [f.get(timeout=30).offset for f in futures]
    producer.close()
    return offsets


def consume(bootstrap: str, topic: str, n: int) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                             consumer_timeout_ms=30_000, max_partition_fetch_bytes=4096)
    consumer.assign([TopicPartition(topic, 0)])
    got = []
    for message in consumer:
        got.append(message.value)
        if len(got) == n:
            break
    consumer.close()
    return got


def test_after_a_restart_records_read_back_in_order_and_offsets_continue(tmp_path: Path) -> None:
    first = [f"a-{i}".encode() for i in range(300)]
    cluster = start_standalone(tmp_path)
    try:
        assert produce(cluster.bootstrap, "kept", first) == list(range(300))
    finally:
        stop_standalone(cluster.proc)
    cluster = start_standalone(tmp_path)  # same data directory, a new Kafka port
    try:
        assert consume(cluster.bootstrap, "kept", 300) == first
        assert produce(cluster.bootstrap, "kept", [b"b-0", b"b-1"]) == [300, 301]
        assert consume(cluster.bootstrap, "kept", 302) == [*first, b"b-0", b"b-1"]
        run_without_cache(cluster.metadata, tmp_path)
    finally:
        stop_standalone(cluster.proc)


def run_without_cache(metadata: str, tmp_path: Path) -> None:
    """``ledgerstore kafka`` with ``cache_bytes = 0``: fetches read their batches from the log."""
    with kafka_command(metadata, tmp_path, "cache_bytes = 0\n") as bootstrap:
        values = [f"cold-{i}".encode() for i in range(250)]
        assert produce(bootstrap, "cold", values) == list(range(250))
        assert consume(bootstrap, "cold", 250) == values


def test_after_a_restart_a_partition_is_found_while_only_another_of_its_topic_is_open(tmp_path: Path) -> None:
    cluster = start_standalone(tmp_path)
    try:
        with kafka_command(cluster.metadata, tmp_path, "num_partitions = 3\n") as bootstrap:
            producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
            assert [producer.send("wide", b"x", partition=p).get(timeout=30).offset for p in range(3)] == [0, 0, 0]
            producer.close()
        with kafka_command(cluster.metadata, tmp_path) as bootstrap:  # a new broker: nothing open
            producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, retries=0)
            assert producer.send("wide", b"y", partition=0).get(timeout=30).offset == 1
            assert producer.send("wide", b"y", partition=2).get(timeout=30).offset == 1
            producer.close()
    finally:
        stop_standalone(cluster.proc)
