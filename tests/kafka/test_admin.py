"""Topic administration with Kafka's own admin clients: confluent-kafka's ``AdminClient`` and
kafka-python's ``KafkaAdminClient`` create topics (their partitions' logs), are refused what the
mapping cannot do, describe a topic's and the broker's configuration and delete topics (their
logs); a transactional producer id is refused, the other transaction requests are answered
``UNSUPPORTED_VERSION``."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as PyConfigResource
from kafka.admin import ConfigResourceType
from kafka.admin import NewTopic as PyNewTopic
from kafka.errors import TopicAlreadyExistsError

from ledgerstore.aio import Client
from ledgerstore_kafka.codec import Writer
from tests.kafka.conftest import KafkaCluster, RawClient

pytestmark = pytest.mark.timeout(300)


def error_of(future: object) -> int:
    with pytest.raises(KafkaException) as exc:
        future.result(30)  # type: ignore[attr-defined]
    return int(exc.value.args[0].code())


def kafka_logs(metadata: str, topic: str) -> list[str]:
    async def names() -> list[str]:
        async with Client(metadata=metadata) as client:
            return sorted(n for n in await client.list_logs() if n.startswith(f"kafka-{topic}-"))
    return asyncio.run(names())


def test_confluent_admin_creates_describes_and_deletes_topics_as_logs(kafka_cluster: KafkaCluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    assert admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(30) is None
    assert kafka_logs(kafka_cluster.metadata, topic) == [f"kafka-{topic}-{i}" for i in range(3)]
    assert len(admin.list_topics(topic=topic, timeout=30).topics[topic].partitions) == 3
    producer = ConfluentProducer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all"})
    producer.produce(topic, b"on partition 2", partition=2)
    assert producer.flush(30) == 0

    again = admin.create_topics([NewTopic(topic, num_partitions=1)])[topic]
    assert error_of(again) == KafkaError.TOPIC_ALREADY_EXISTS
    compact = f"{topic}-c"
    refused = admin.create_topics([NewTopic(compact, num_partitions=1, config={"cleanup.policy": "compact"})])[compact]
    assert error_of(refused) == KafkaError.INVALID_CONFIG
    bad = admin.create_topics([NewTopic(f"{topic}-z", num_partitions=0)])[f"{topic}-z"]
    assert error_of(bad) == KafkaError.INVALID_PARTITIONS
    assert kafka_logs(kafka_cluster.metadata, compact) == []

    resource = ConfigResource("topic", topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "delete" and configs["cleanup.policy"].is_read_only
    assert configs["max.message.bytes"].value == "1048588"
    broker = ConfigResource("broker", "0")
    assert admin.describe_configs([broker])[broker].result(30)["auto.create.topics.enable"].value == "true"

    assert admin.delete_topics([topic])[topic].result(30) is None
    assert kafka_logs(kafka_cluster.metadata, topic) == []
    assert topic not in admin.list_topics(timeout=30).topics
    assert error_of(admin.delete_topics([topic])[topic]) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_kafka_python_admin_creates_describes_and_deletes_a_topic(kafka_cluster: KafkaCluster, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
    try:
        admin.create_topics([PyNewTopic(topic, num_partitions=2, replication_factor=1)])
        assert kafka_logs(kafka_cluster.metadata, topic) == [f"kafka-{topic}-0", f"kafka-{topic}-1"]
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([PyNewTopic(topic, num_partitions=2, replication_factor=1)])
        described = admin.describe_configs([PyConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
        text = repr(described)
        assert "cleanup.policy" in text and "delete" in text
        admin.delete_topics([topic])
        assert kafka_logs(kafka_cluster.metadata, topic) == []
    finally:
        admin.close()


def test_transaction_requests_are_answered_unsupported_version(kafka_cluster: KafkaCluster) -> None:
    raw = RawClient(kafka_cluster.bootstrap)
    try:
        assert raw.init_producer_id("payments")[0] == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        body = Writer().string("payments").int64(1).int16(0).array_length(1).string("t").array_length(2)
        r = raw.request(24, 1, body.int32(0).int32(1).bytes())  # AddPartitionsToTxn
        r.int32()
        assert r.array_length() == 1 and r.string() == "t" and r.array_length() == 2
        assert [(r.int32(), r.int16()) for _ in range(2)] == [(0, 35), (1, 35)]
        r = raw.request(26, 1, Writer().string("payments").int64(1).int16(0).boolean(True).bytes())  # EndTxn
        r.int32()
        assert r.int16() == 35
    finally:
        raw.close()


def test_a_transactional_confluent_producer_is_refused_at_once(kafka_cluster: KafkaCluster) -> None:
    producer = ConfluentProducer({"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": "payments"})
    with pytest.raises(KafkaException) as exc:
        producer.init_transactions(30)
    # fatal: librdkafka gives up at the first answer instead of retrying until the 30 s timeout
    assert exc.value.args[0].fatal()
    assert exc.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
