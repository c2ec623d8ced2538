"""Kafka clients nobody here wrote, unchanged, against ``ledgerstore standalone --kafka-port``:
kafka-python, aiokafka, confluent-kafka (librdkafka) and Debian's kcat produce 1,000 records each
with acks=all and read them back in order; the topic reads as a ledgerstore log; ListOffsets,
long-polling fetches and oversized batches answer as Kafka does."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import MessageSizeTooLargeError

from ledgerstore.aio import Client
from ledgerstore_kafka.partition import log_name
from ledgerstore_kafka.records import parse_batch_header
from tests.kafka.conftest import KafkaCluster, confluent_poll

N = 1000
pytestmark = pytest.mark.timeout(300)


def values(prefix: str, n: int = N) -> list[bytes]:
    return [f"{prefix}-{i:05d}".encode() for i in range(n)]


def kafka_python_producer(bootstrap: str, **kw: object) -> KafkaProducer:
    # kafka-python 3 makes an acks=all producer idempotent by default (InitProducerId, sequences)
    return KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **kw)


def kafka_python_read(bootstrap: str, topic: str, n: int, timeout_s: float = 60) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(timeout_s * 1000))
    consumer.assign([TopicPartition(topic, 0)])
    got = []
    for message in consumer:
        got.append(message.value)
        if len(got) >= n:
            break
    consumer.close()
    return got


def test_kafka_python_produces_1000_with_acks_all_and_reads_them_in_order(kafka_cluster: KafkaCluster,
                                                                          topic: str) -> None:
    producer = kafka_python_producer(kafka_cluster.bootstrap)
    futures = [producer.send(topic, v) for v in values("kp")]
    producer.flush()
    offsets = [f.get(timeout=30).offset for f in futures]
    producer.close()
    assert offsets == list(range(N))  # continuous offsets, in send order
    assert kafka_python_read(kafka_cluster.bootstrap, topic, N) == values("kp")


def test_aiokafka_produces_1000_with_acks_all_and_reads_them_in_order(kafka_cluster: KafkaCluster,
                                                                      topic: str) -> None:
    async def main() -> tuple[list[int], list[bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all")
        await producer.start()
        try:
            sent = [await producer.send(topic, v) for v in values("ak")]
            offsets = [(await f).offset for f in sent]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        got: list[bytes] = []
        try:
            consumer.assign([AioTopicPartition(topic, 0)])
            await consumer.seek_to_beginning()
            while len(got) < N:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
                for messages in batches.values():
                    got.extend(m.value for m in messages if m.value is not None)
        finally:
            await consumer.stop()
        return offsets, got

    offsets, got = asyncio.run(main())
    assert offsets == list(range(N))
    assert got == values("ak")


def confluent_read(bootstrap: str, topic: str, n: int, timeout_s: float = 60) -> list[bytes]:
    # a group id is required by the client; offsets are assigned by hand and never committed
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([ConfluentTopicPartition(topic, 0, 0)])
    try:
        return [m.value() for m in confluent_poll(consumer, n, timeout_s)]
    finally:
        consumer.close()


def test_confluent_kafka_produces_1000_with_acks_all_and_reads_them_in_order(kafka_cluster: KafkaCluster,
                                                                             topic: str) -> None:
    producer = ConfluentProducer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all", "linger.ms": 5})
    delivered: list[int] = []
    errors: list[object] = []

    def on_delivery(err: object, message: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(message.offset())  # type: ignore[attr-defined]

    for v in values("ck"):
        producer.produce(topic, v, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []
    assert delivered == list(range(N))
    assert confluent_read(kafka_cluster.bootstrap, topic, N) == values("ck")


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (scripts/setup.sh installs it)")
def test_kcat_produces_1000_with_acks_all_and_reads_them_in_order(kafka_cluster: KafkaCluster, topic: str) -> None:
    lines = b"".join(v + b"\n" for v in values("kc"))
    produced = subprocess.run(["kcat", "-P", "-b", kafka_cluster.bootstrap, "-t", topic, "-X", "acks=all"],
                              input=lines, capture_output=True, timeout=120)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-C", "-b", kafka_cluster.bootstrap, "-t", topic, "-o", "beginning", "-e",
                               "-q"], capture_output=True, timeout=120)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == values("kc")


def test_records_of_one_client_read_back_with_the_others(kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = ConfluentProducer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all"})
    for v in values("mix", 200):
        producer.produce(topic, v)
    assert producer.flush(60) == 0
    assert kafka_python_read(kafka_cluster.bootstrap, topic, 200) == values("mix", 200)
    assert confluent_read(kafka_cluster.bootstrap, topic, 200) == values("mix", 200)


def test_the_topic_reads_as_a_ledgerstore_log_one_batch_per_entry_with_continuous_offsets(
        kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = kafka_python_producer(kafka_cluster.bootstrap, batch_size=1)  # one record per batch
    for v in values("log", 300):
        producer.send(topic, v)
    producer.flush()
    # a log's newest entry becomes readable once the writer's next add carries the LAC past it
    producer.send(topic, b"marker").get(timeout=30)
    producer.close()

    async def read_log() -> list[bytes]:
        async with Client(metadata=kafka_cluster.metadata) as client:
            assert log_name(topic, 0) in await client.list_logs()
            reader = await client.open_log_reader(log_name(topic, 0), "earliest")
            entries: list[bytes] = []
            while batch := await reader.read_batch(100):
                entries += [payload for _, payload in batch]
            await reader.close()
            return entries

    entries = asyncio.run(read_log())
    infos = [parse_batch_header(e) for e in entries]
    assert len(infos) == 300 and all(i.record_count == 1 for i in infos)
    expected_base = 0
    for info in infos:
        assert info.base_offset == expected_base  # each entry carries its own base offset, continuous
        expected_base = info.last_offset + 1


def test_list_offsets_earliest_latest_and_by_timestamp(kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = kafka_python_producer(kafka_cluster.bootstrap, batch_size=1)
    early = int(time.time() * 1000) - 60_000
    producer.send(topic, b"old", timestamp_ms=early).get(timeout=30)
    middle = int(time.time() * 1000)
    producer.send(topic, b"new", timestamp_ms=middle + 1000).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, group_id=None)
    tp = TopicPartition(topic, 0)
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.end_offsets([tp]) == {tp: 2}
    found = consumer.offsets_for_times({tp: middle})
    assert found[tp] is not None and found[tp].offset == 1
    assert consumer.offsets_for_times({tp: middle + 10_000})[tp] is None
    consumer.close()


def test_a_waiting_fetch_returns_when_a_record_arrives_not_at_its_deadline(kafka_cluster: KafkaCluster,
                                                                            topic: str) -> None:
    producer = kafka_python_producer(kafka_cluster.bootstrap)
    producer.send(topic, b"first").get(timeout=30)
    consumer = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, group_id=None, auto_offset_reset="earliest",
                             fetch_max_wait_ms=10_000, consumer_timeout_ms=30_000)
    consumer.assign([TopicPartition(topic, 0)])
    assert next(consumer).value == b"first"
    sent_at: list[float] = []

    def send_later() -> None:
        time.sleep(1.0)
        sent_at.append(time.monotonic())
        producer.send(topic, b"second").get(timeout=30)

    sender = threading.Thread(target=send_later)
    sender.start()
    assert next(consumer).value == b"second"
    waited = time.monotonic() - sent_at[0]
    sender.join()
    consumer.close()
    producer.close()
    assert waited < 5.0, f"the fetch waited {waited:.1f}s after the record was acknowledged (max wait 10s)"


def test_a_batch_over_the_limit_is_refused_with_message_too_large(kafka_cluster: KafkaCluster, topic: str) -> None:
    # plain, not idempotent: kafka-python's idempotent producer takes the refusal as fatal and
    # aborts what follows (it would against Kafka too)
    producer = kafka_python_producer(kafka_cluster.bootstrap, max_request_size=8 << 20, batch_size=4 << 20,
                                     compression_type=None, enable_idempotence=False)
    producer.send(topic, b"small").get(timeout=30)
    with pytest.raises(MessageSizeTooLargeError):
        producer.send(topic, b"x" * (2 << 20)).get(timeout=30)
    producer.send(topic, b"after").get(timeout=30)  # the connection and the partition serve on
    producer.close()
    assert kafka_python_read(kafka_cluster.bootstrap, topic, 2) == [b"small", b"after"]


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x40" + b"\x00\x00",                           # a frame cut short, then EOF
    b"\x7f\xff\xff\xff",                                         # a length over the limit
    b"\x00\x00\x00\x0c\x00\x00\x00\x08\x00\x00\x00\x01\x00\x07ab",  # Produce v8 whose client id runs past the end
    b"\x00\x00\x00\x0a\x00\x01\x00\x0b\x00\x00\x00\x01\xff\xff",  # Fetch v11 with no body at all
    b"\x00\x00\x00\x08\x00\x63\x00\x00\x00\x00\x00\x01",          # API key 99
])
def test_a_malformed_request_closes_its_connection_while_another_client_keeps_working(
        kafka_cluster: KafkaCluster, topic: str, garbage: bytes) -> None:
    producer = kafka_python_producer(kafka_cluster.bootstrap)
    producer.send(topic, b"before").get(timeout=30)
    host, port = kafka_cluster.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as bad:
        bad.sendall(garbage)
        if garbage.startswith(b"\x00\x00\x00\x40"):
            bad.shutdown(socket.SHUT_WR)
        assert bad.recv(1024) == b""  # closed without an answer
    producer.send(topic, b"after").get(timeout=30)
    producer.close()
    assert kafka_python_read(kafka_cluster.bootstrap, topic, 2) == [b"before", b"after"]


def test_api_versions_at_a_version_not_served_is_answered_in_v0_with_unsupported_version(
        kafka_cluster: KafkaCluster) -> None:
    host, port = kafka_cluster.bootstrap.split(":")
    request = b"\x00\x12\x00\x63\x00\x00\x00\x07\x00\x00"  # ApiVersions v99, correlation id 7, empty client id
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(len(request).to_bytes(4, "big") + request)
        size = int.from_bytes(s.recv(4), "big")
        body = b""
        while len(body) < size:
            body += s.recv(size - len(body))
    assert body[:4] == (7).to_bytes(4, "big")
    assert body[4:6] == (35).to_bytes(2, "big")  # UNSUPPORTED_VERSION
    count = int.from_bytes(body[6:10], "big")
    keys = {int.from_bytes(body[10 + 6 * i:12 + 6 * i], "big"): (int.from_bytes(body[12 + 6 * i:14 + 6 * i], "big"),
                                                                 int.from_bytes(body[14 + 6 * i:16 + 6 * i], "big"))
            for i in range(count)}
    assert keys[18] == (0, 2) and keys[0][0] == 3


def test_acks_0_gets_no_answer_and_the_records_are_stored_all_the_same(kafka_cluster: KafkaCluster,
                                                                        topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks=0, enable_idempotence=False)
    for v in values("a0", 100):
        producer.send(topic, v)
    producer.flush()
    producer.close()
    assert kafka_python_read(kafka_cluster.bootstrap, topic, 100) == values("a0", 100)


def test_acks_1_is_answered_once_the_log_acknowledged(kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = ConfluentProducer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": 1})
    for v in values("a1", 100):
        producer.produce(topic, v)
    assert producer.flush(60) == 0
    assert confluent_read(kafka_cluster.bootstrap, topic, 100) == values("a1", 100)


def test_a_fenced_partition_answers_not_leader_and_the_retried_produce_lands_after_a_reopen(
        kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = kafka_python_producer(kafka_cluster.bootstrap, retries=5, retry_backoff_ms=200)
    first = [producer.send(topic, v).get(timeout=30).offset for v in values("before", 10)]
    assert first == list(range(10))

    async def take_the_log_over() -> None:  # another writer fences the broker's ledger of the partition
        async with Client(metadata=kafka_cluster.metadata) as client:
            writer = await client.open_log(log_name(topic, 0))
            await writer.close()

    asyncio.run(take_the_log_over())
    # the broker's next append is refused (fenced): NOT_LEADER_OR_FOLLOWER, the producer retries,
    # the broker opens the log again (recovering it) and the record lands after the ten
    assert producer.send(topic, b"after").get(timeout=60).offset == 10
    producer.close()
    assert kafka_python_read(kafka_cluster.bootstrap, topic, 11) == [*values("before", 10), b"after"]
