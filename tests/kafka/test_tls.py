"""TLS on the Kafka listener: confluent-kafka produces and consumes over TLS (and, with
``tls_ca_file``, with a client certificate the broker requires); a plaintext client gets nothing
while a TLS one goes on; certificate options that do not load are refused in one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ledgerstore.testing.servers import make_pki
from tests.kafka.conftest import KafkaCluster, confluent_poll, kafka_command, refused_config

pytestmark = pytest.mark.timeout(300)


def round_trip(bootstrap: str, topic: str, tls: dict[str, str]) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **tls})
    for i in range(100):
        producer.produce(topic, f"secret-{i}".encode())
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", **tls})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = [m.value() for m in confluent_poll(consumer, 100)]
    consumer.close()
    return values


def test_clients_produce_and_consume_over_tls_and_a_plaintext_client_gets_nothing(
        kafka_cluster: KafkaCluster, tmp_path: Path, topic: str) -> None:
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    options = f'tls_cert_file = "{pki["server.pem"]}"\ntls_key_file = "{pki["server.key"]}"\n'
    tls = {"security.protocol": "SSL", "ssl.ca.location": pki["ca.pem"]}
    with kafka_command(kafka_cluster.metadata, tmp_path, options) as bootstrap:
        host, port = bootstrap.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as plain:  # an ApiVersions request in clear
            plain.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")
            answer = plain.recv(100)
            assert not answer.startswith(b"\x00\x00\x00"), answer  # no Kafka answer: a TLS alert or a close
        assert round_trip(bootstrap, topic, tls) == [f"secret-{i}".encode() for i in range(100)]


def test_with_a_ca_the_broker_requires_a_client_certificate(
        kafka_cluster: KafkaCluster, tmp_path: Path, topic: str) -> None:
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    options = (f'tls_cert_file = "{pki["server.pem"]}"\ntls_key_file = "{pki["server.key"]}"\n'
               f'tls_ca_file = "{pki["ca.pem"]}"\n')
    tls = {"security.protocol": "SSL", "ssl.ca.location": pki["ca.pem"],
           "ssl.certificate.location": pki["client.pem"], "ssl.key.location": pki["client.key"]}
    with kafka_command(kafka_cluster.metadata, tmp_path, options) as bootstrap:
        assert round_trip(bootstrap, topic, tls) == [f"secret-{i}".encode() for i in range(100)]
        without = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SSL",
                            "ssl.ca.location": pki["ca.pem"], "message.timeout.ms": 5000})
        reports: list[object] = []
        without.produce(topic, b"no certificate", on_delivery=lambda err, _msg: reports.append(err))
        without.flush(30)
        assert len(reports) == 1 and reports[0] is not None  # never delivered: the handshake is refused


@pytest.mark.parametrize(("lines", "fragment"), [
    ('tls_cert_file = "/nonexistent.pem"\ntls_key_file = "/nonexistent.key"\n', "tls_cert_file"),
    ('tls_cert_file = "/nonexistent.pem"\n', "tls_key_file"),
])
def test_tls_options_that_do_not_load_are_one_line_and_exit_2(kafka_cluster: KafkaCluster, tmp_path: Path,
                                                              lines: str, fragment: str) -> None:
    assert fragment in refused_config(kafka_cluster.metadata, tmp_path, lines)
