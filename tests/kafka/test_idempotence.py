"""Idempotent producers: InitProducerId hands out producer ids, a retried batch is answered with
its original offset and written once, sequence gaps and fenced epochs get Kafka's codes; an
idempotent confluent-kafka producer whose broker is SIGKILLed mid-stream and restarted loses no
acknowledged record and duplicates none; kafka-python's default (idempotent) producer works."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from ledgerstore.testing.servers import free_port
from tests.kafka.conftest import KafkaCluster, RawClient, confluent_poll, record_batch, start_kafka_process

pytestmark = pytest.mark.timeout(400)


def test_init_producer_id_hands_out_a_new_id_each_time_and_refuses_transactional_ids(
        kafka_cluster: KafkaCluster) -> None:
    raw = RawClient(kafka_cluster.bootstrap)
    try:
        first, second = raw.init_producer_id(), raw.init_producer_id()
        assert first[0] == second[0] == 0 and first[2] == second[2] == 0
        assert second[1] > first[1] >= 1
        assert raw.init_producer_id("payments")[0] == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED: no transactions
    finally:
        raw.close()


def test_a_retried_batch_gets_its_original_offset_and_is_stored_once(kafka_cluster: KafkaCluster, topic: str) -> None:
    raw = RawClient(kafka_cluster.bootstrap)
    try:
        raw.create_topic(topic)
        _, pid, epoch = raw.init_producer_id()
        first, second = record_batch(pid, epoch, 0, [b"a", b"b", b"c"]), record_batch(pid, epoch, 3, [b"d", b"e"])
        assert raw.produce(topic, first) == (0, 0)
        assert raw.produce(topic, second) == (0, 3)
        assert raw.produce(topic, first) == (0, 0)  # a retry: the original's offset, nothing written
        assert raw.produce(topic, second) == (0, 3)
        assert raw.produce(topic, record_batch(pid, epoch, 3, [b"d"])) == (46, -1)  # other boundaries: DUPLICATE_SEQUENCE
        assert raw.produce(topic, record_batch(pid, epoch, 7, [b"g"])) == (45, -1)  # a gap: OUT_OF_ORDER_SEQUENCE_NUMBER
        assert raw.produce(topic, record_batch(pid, epoch, 5, [b"f"])) == (0, 5)
        assert raw.produce(topic, record_batch(pid, epoch + 1, 0, [b"x"])) == (0, 6)  # a new epoch starts at 0
        assert raw.produce(topic, record_batch(pid, epoch, 6, [b"old"])) == (47, -1)  # the old epoch is fenced
    finally:
        raw.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, group_id=None, auto_offset_reset="earliest",
                             consumer_timeout_ms=10_000)
    consumer.assign([TopicPartition(topic, 0)])
    got = [(m.offset, m.value) for m in consumer]
    consumer.close()
    assert got == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"), (5, b"f"), (6, b"x")]


def test_kafka_pythons_default_idempotent_producer_produces_in_order(kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all")  # enable_idempotence defaults on
    futures = [producer.send(topic, f"v{i}".encode()) for i in range(500)]
    producer.flush()
    assert [f.get(timeout=30).offset for f in futures] == list(range(500))
    producer.close()


def test_an_idempotent_producer_loses_and_duplicates_nothing_when_its_broker_is_killed_mid_stream(
        kafka_cluster: KafkaCluster, tmp_path: Path, topic: str) -> None:
    port = free_port()
    broker = start_kafka_process(kafka_cluster.metadata, tmp_path, port).proc
    acknowledged: list[str] = []
    failed: list[str] = []

    def delivered(err: object, message: object) -> None:
        key = message.key().decode()  # type: ignore[attr-defined]
        (failed if err is not None else acknowledged).append(key)

    producer = ConfluentProducer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 1, "batch.num.messages": 10, "message.timeout.ms": 120_000, "reconnect.backoff.max.ms": 500})
    sent = 0

    def send(n: int) -> None:  # as fast as the producer takes them, at most 2,000 waiting
        nonlocal sent
        for _ in range(n):
            producer.produce(topic, value=b"x" * 100, key=f"k{sent}".encode(), on_delivery=delivered)
            sent += 1
        producer.poll(0.005 if len(producer) > 2000 else 0)

    try:
        for _kill in range(5):  # five times, with batches in flight
            target, until = len(acknowledged) + 500, time.monotonic() + 0.5
            while len(acknowledged) < target or time.monotonic() < until:
                send(10)
            broker.send_signal(signal.SIGKILL)
            broker.wait(30)
            broker = start_kafka_process(kafka_cluster.metadata, tmp_path, port).proc
        for _ in range(40):
            send(50)
        assert producer.flush(180) == 0
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(60)
    assert not failed and len(acknowledged) == sent
    broker = start_kafka_process(kafka_cluster.metadata, tmp_path, port).proc
    try:
        consumer = ConfluentConsumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": f"g-{topic}",
                                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topic])
        messages = confluent_poll(consumer, sent, timeout_s=60)
        messages += confluent_poll(consumer, 100, timeout_s=3)  # a duplicate would be after them
        consumer.close()
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(60)
    retried = (tmp_path / "kafka.out").read_text().count("answered with its original offset")
    print(f"{len(acknowledged)} records acknowledged, {retried} retried batches answered with their original offset")
    counts = Counter(m.key().decode() for m in messages)
    assert sorted(counts) == sorted(acknowledged)  # none lost
    assert max(counts.values()) == 1  # none duplicated
    assert [m.offset() for m in messages] == list(range(len(messages)))
