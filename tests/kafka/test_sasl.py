"""SASL on the Kafka listener, with clients nobody here wrote: kafka-python, aiokafka and
confluent-kafka (librdkafka) authenticate with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 as users of
the credential file (``ledgerstore credentials add``), then produce and consume; a wrong password
fails in each client with its authentication error; a client without SASL gets nothing; SASL
over TLS (SASL_SSL); kcat; and the wire rules (ApiVersions lists the SASL APIs only when SASL is
on, an unknown mechanism is answered with the enabled list, nothing else before authentication)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.errors import KafkaConnectionError
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import KafkaError as KpKafkaError

from ledgerstore.testing.servers import make_pki
from ledgerstore_kafka.codec import Writer
from tests.kafka.conftest import (
    LEDGERSTORE,
    KafkaCluster,
    RawClient,
    confluent_poll,
    kafka_command,
    refused_config,
)

pytestmark = pytest.mark.timeout(300)

USER, PASSWORD = "app", "correct horse battery"
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def add_user(path: Path, name: str, password: str) -> None:
    done = subprocess.run([LEDGERSTORE, "credentials", "add", name, "--file", str(path)], input=password + "\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done


def sasl_options(directory: Path, mechanisms: list[str] = MECHANISMS) -> str:
    users = directory / "users"
    add_user(users, USER, PASSWORD)
    quoted = ", ".join(f'"{m}"' for m in mechanisms)
    return f'sasl_mechanisms = [{quoted}]\ncredentials_file = "{users}"\n'


@pytest.fixture(scope="module")
def sasl_broker(kafka_cluster: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A ``ledgerstore kafka`` process with SASL on (PLAIN and both SCRAMs): its bootstrap
    address and its output file."""
    directory = tmp_path_factory.mktemp("sasl")
    with kafka_command(kafka_cluster.metadata, directory, sasl_options(directory)) as bootstrap:
        yield bootstrap, directory / "kafka.out"


def values(prefix: str, n: int = 50) -> list[bytes]:
    return [f"{prefix}-{i:03d}".encode() for i in range(n)]


# --- kafka-python ---------------------------------------------------------------------------

def python_sasl(mechanism: str, password: str = PASSWORD) -> dict[str, Any]:
    """kafka-python's and aiokafka's SASL options (they name them alike)."""
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": USER, "sasl_plain_password": password}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_authenticates_then_produces_and_consumes(sasl_broker: tuple[str, Path], topic: str,
                                                               mechanism: str) -> None:
    bootstrap, _ = sasl_broker
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **python_sasl(mechanism))
    futures = [producer.send(topic, v) for v in values(mechanism)]
    producer.flush()
    assert [f.get(timeout=30).offset for f in futures] == list(range(50))
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=30_000, **python_sasl(mechanism))
    consumer.assign([KpTopicPartition(topic, 0)])
    got = [m.value for _, m in zip(range(50), consumer, strict=False)]
    consumer.close()
    assert got == values(mechanism)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_with_a_wrong_password_fails_to_authenticate(sasl_broker: tuple[str, Path], topic: str,
                                                                   mechanism: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    bootstrap, _ = sasl_broker
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KpKafkaError):
        KafkaProducer(bootstrap_servers=bootstrap, bootstrap_timeout_ms=8000, **python_sasl(mechanism, "wrong password"))
    assert "SaslAuthenticationFailedError" in caplog.text and "invalid user name or password" in caplog.text
    assert "wrong password" not in caplog.text


# --- aiokafka --------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_authenticates_then_produces_and_consumes(sasl_broker: tuple[str, Path], topic: str,
                                                           mechanism: str) -> None:
    bootstrap, _ = sasl_broker

    async def main() -> tuple[list[int], list[bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **python_sasl(mechanism))
        await producer.start()
        try:
            offsets = [(await producer.send_and_wait(topic, v)).offset for v in values(mechanism)]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    **python_sasl(mechanism))
        await consumer.start()
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[bytes] = []
            while len(got) < 50:
                batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=1000), 30)
                got += [m.value for m in batch.get(tp, []) if m.value is not None]
        finally:
            await consumer.stop()
        return offsets, got

    offsets, got = asyncio.run(main())
    assert offsets == list(range(50)) and got == values(mechanism)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_with_a_wrong_password_fails_to_authenticate(sasl_broker: tuple[str, Path], mechanism: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    bootstrap, _ = sasl_broker

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **python_sasl(mechanism, "wrong password"))
        try:
            await producer.start()
        finally:
            await producer.stop()

    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        asyncio.run(main())
    assert "SaslAuthenticationFailed" in caplog.text and "invalid user name or password" in caplog.text


# --- confluent-kafka (librdkafka) -------------------------------------------------------------

def confluent_sasl(mechanism: str, password: str = PASSWORD, protocol: str = "SASL_PLAINTEXT") -> dict[str, Any]:
    return {"security.protocol": protocol, "sasl.mechanisms": mechanism, "sasl.username": USER,
            "sasl.password": password}


def confluent_round_trip(bootstrap: str, topic: str, config: dict[str, Any], n: int = 50) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **config})
    for v in values(topic, n):
        producer.produce(topic, v)
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", **config})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = [m.value() for m in confluent_poll(consumer, n)]
    consumer.close()
    return got


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_authenticates_then_produces_and_consumes(sasl_broker: tuple[str, Path], topic: str,
                                                                  mechanism: str) -> None:
    assert confluent_round_trip(sasl_broker[0], topic, confluent_sasl(mechanism)) == values(topic)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_with_a_wrong_password_gets_an_authentication_error(sasl_broker: tuple[str, Path],
                                                                            topic: str, mechanism: str) -> None:
    errors: list[KafkaError] = []
    reports: list[object] = []
    producer = Producer({"bootstrap.servers": sasl_broker[0], "message.timeout.ms": 3000,
                         "error_cb": errors.append, **confluent_sasl(mechanism, "wrong password")})
    producer.produce(topic, b"never", on_delivery=lambda err, _msg: reports.append(err))
    auth = authentication_errors(producer, errors)
    assert auth and "invalid user name or password" in auth[0].str()
    producer.flush(20)
    assert len(reports) == 1 and reports[0] is not None  # never delivered


def authentication_errors(producer: Producer, errors: list[KafkaError], timeout_s: float = 60) -> list[KafkaError]:
    """The authentication errors ``producer`` reported to ``errors``, polled for until the first
    arrives (or ``timeout_s`` passes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
        if found:
            return found
        producer.poll(0.2)
    return []


def test_kcat_authenticates_with_scram_and_produces_and_consumes(sasl_broker: tuple[str, Path], topic: str) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (scripts/setup.sh installs Debian's)")
    sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-256",
            "-X", f"sasl.username={USER}", "-X", f"sasl.password={PASSWORD}"]
    lines = "\n".join(f"kc-{i}" for i in range(20)) + "\n"
    produced = subprocess.run([kcat, "-P", "-b", sasl_broker[0], "-t", topic, *sasl], input=lines, text=True,
                              capture_output=True, timeout=60)
    assert produced.returncode == 0, produced
    consumed = subprocess.run([kcat, "-C", "-b", sasl_broker[0], "-t", topic, "-o", "beginning", "-e", *sasl],
                              capture_output=True, text=True, timeout=60)
    assert consumed.stdout.split() == [f"kc-{i}" for i in range(20)], consumed
    wrong = subprocess.run([kcat, "-L", "-b", sasl_broker[0], "-m", "5", *sasl[:-1], "sasl.password=nope"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0 and "SASL authentication error" in wrong.stderr, wrong


# --- at the wire ------------------------------------------------------------------------------

def api_versions(client: RawClient) -> dict[int, tuple[int, int]]:
    r = client.request(18, 2, b"")
    assert r.int16() == 0
    return {r.int16(): (r.int16(), r.int16()) for _ in range(r.array_length())}


def handshake(client: RawClient, mechanism: str, version: int = 1) -> tuple[int, list[str]]:
    r = client.request(17, version, Writer().string(mechanism).bytes())
    return r.int16(), [r.string() for _ in range(r.array_length())]


def authenticate(client: RawClient, token: bytes, version: int = 1) -> tuple[int, str | None, bytes | None]:
    r = client.request(36, version, Writer().nullable_bytes(token).bytes())
    out = r.int16(), r.nullable_string(), r.nullable_bytes()
    if version >= 1:
        assert r.int64() == 0  # no re-authentication asked for
    return out


def closed(client: RawClient) -> bool:
    """Whether the broker closed the connection (it sends nothing more)."""
    client.sock.settimeout(10)
    return client.sock.recv(1) == b""


def plain_login(bootstrap: str, user: str, password: str) -> tuple[RawClient, int]:
    """A raw connection after a PLAIN exchange, and the exchange's error code."""
    client = RawClient(bootstrap)
    assert handshake(client, "PLAIN")[0] == 0
    return client, authenticate(client, f"\0{user}\0{password}".encode())[0]


def metadata_answers(client: RawClient) -> bool:
    r = client.request(3, 4, Writer().array_length(0).boolean(False).bytes())
    return r.int32() == 0 and r.array_length() >= 1


def test_api_versions_lists_the_sasl_apis_only_when_sasl_is_on(kafka_cluster: KafkaCluster,
                                                               sasl_broker: tuple[str, Path]) -> None:
    plain, sasl = RawClient(kafka_cluster.bootstrap), RawClient(sasl_broker[0])
    try:
        assert 17 not in api_versions(plain) and 36 not in api_versions(plain)
        served = api_versions(sasl)
        assert served[17] == (0, 1) and served[36] == (0, 1)
        assert served[0] == (3, 8)  # the rest as without SASL
    finally:
        plain.close()
        sasl.close()


@pytest.mark.parametrize(("api_key", "version", "body"), [
    (3, 4, Writer().array_length(1).string("t-any").boolean(True).bytes()),  # Metadata
    (0, 7, Writer().nullable_string(None).int16(-1).int32(1000).array_length(0).bytes()),  # Produce
    (19, 0, Writer().array_length(0).int32(1000).bytes()),  # CreateTopics
])
def test_a_client_that_has_not_authenticated_gets_nothing_but_a_closed_connection(
        sasl_broker: tuple[str, Path], api_key: int, version: int, body: bytes) -> None:
    client = RawClient(sasl_broker[0])
    try:
        assert 17 in api_versions(client)  # ApiVersions is answered before authentication
        frame = Writer().int16(api_key).int16(version).int32(99).nullable_string("raw").bytes() + body
        client.sock.sendall(len(frame).to_bytes(4, "big") + frame)
        assert closed(client)
    finally:
        client.close()


def test_a_client_without_sasl_produces_nothing(sasl_broker: tuple[str, Path], topic: str) -> None:
    _, log = sasl_broker
    refusals = log.read_text().count("before SASL authentication")
    reports: list[object] = []
    producer = Producer({"bootstrap.servers": sasl_broker[0], "message.timeout.ms": 3000})
    producer.produce(topic, b"anonymous", on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(20)
    assert len(reports) == 1 and reports[0] is not None
    deadline = time.monotonic() + 30
    while log.read_text().count("before SASL authentication") == refusals:  # its Metadata was refused
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones_and_the_connection_closes(
        sasl_broker: tuple[str, Path]) -> None:
    client = RawClient(sasl_broker[0])
    try:
        assert handshake(client, "GSSAPI") == (33, MECHANISMS)
        assert closed(client)
    finally:
        client.close()


def test_authenticate_before_a_handshake_is_an_illegal_state(sasl_broker: tuple[str, Path]) -> None:
    client = RawClient(sasl_broker[0])
    try:
        error, message, _ = authenticate(client, f"\0{USER}\0{PASSWORD}".encode())
        assert error == 34 and message and "SaslHandshake" in message
        assert closed(client)
    finally:
        client.close()


@pytest.mark.parametrize("version", [0, 1])
def test_plain_at_the_wire_then_requests_are_served_and_a_wrong_password_is_58(
        sasl_broker: tuple[str, Path], version: int) -> None:
    good = RawClient(sasl_broker[0])
    try:
        assert handshake(good, "PLAIN") == (0, MECHANISMS)
        assert authenticate(good, f"\0{USER}\0{PASSWORD}".encode(), version) == (0, None, b"")
        assert metadata_answers(good)  # now served
    finally:
        good.close()
    bad = RawClient(sasl_broker[0])
    try:
        assert handshake(bad, "PLAIN")[0] == 0
        error, message, _ = authenticate(bad, f"\0{USER}\0not the password".encode(), version)
        answered = time.monotonic()
        assert error == 58 and message == "authentication failed: invalid user name or password"
        assert closed(bad)
        # closed a moment after the answer, as Kafka does (connection.failed.authentication.delay.ms):
        # a client that reads the answer and the close together may drop the answer (kafka-python 3)
        assert time.monotonic() - answered >= 0.08
    finally:
        bad.close()
    assert "not the password" not in sasl_broker[1].read_text()


def test_a_v0_handshake_takes_the_tokens_unframed(sasl_broker: tuple[str, Path]) -> None:
    client = RawClient(sasl_broker[0])
    try:
        assert handshake(client, "PLAIN", version=0) == (0, MECHANISMS)
        token = f"\0{USER}\0{PASSWORD}".encode()
        client.sock.sendall(len(token).to_bytes(4, "big") + token)
        assert client.sock.recv(4) == b"\0\0\0\0"  # an empty token back, unframed: authenticated
        assert metadata_answers(client)
    finally:
        client.close()


def test_a_refused_client_does_not_disturb_an_authenticated_one(sasl_broker: tuple[str, Path]) -> None:
    good, error = plain_login(sasl_broker[0], USER, PASSWORD)
    try:
        assert error == 0 and metadata_answers(good)
        for _ in range(3):
            bad, error = plain_login(sasl_broker[0], USER, "guess")
            assert error == 58 and closed(bad)
            bad.close()
        assert metadata_answers(good)
    finally:
        good.close()


def test_a_user_added_while_the_broker_runs_can_log_in_at_once(sasl_broker: tuple[str, Path]) -> None:
    bootstrap, log = sasl_broker
    users = log.parent / "users"
    before, error = plain_login(bootstrap, "late-user", "late password")
    assert error == 58
    before.close()
    add_user(users, "late-user", "late password")
    after, error = plain_login(bootstrap, "late-user", "late password")
    try:
        assert error == 0 and metadata_answers(after)
    finally:
        after.close()


# --- SASL over TLS, and options ----------------------------------------------------------------

def test_sasl_over_tls_with_confluent_kafka(kafka_cluster: KafkaCluster, tmp_path: Path, topic: str) -> None:
    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    options = (f'tls_cert_file = "{pki["server.pem"]}"\ntls_key_file = "{pki["server.key"]}"\n'
               + sasl_options(tmp_path, ["SCRAM-SHA-512"]))
    with kafka_command(kafka_cluster.metadata, tmp_path, options) as bootstrap:
        tls = {"ssl.ca.location": pki["ca.pem"]}
        config = {**confluent_sasl("SCRAM-SHA-512", protocol="SASL_SSL"), **tls}
        assert confluent_round_trip(bootstrap, topic, config) == values(topic)
        errors: list[KafkaError] = []
        producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 3000, "error_cb": errors.append,
                             **confluent_sasl("SCRAM-SHA-512", "wrong password", "SASL_SSL"), **tls})
        producer.produce(topic, b"never")
        assert authentication_errors(producer, errors), errors


@pytest.mark.parametrize(("lines", "fragment"), [
    ('sasl_mechanisms = ["SCRAM-SHA-1"]\ncredentials_file = "/x"\n', "not served"),
    ('sasl_mechanisms = ["PLAIN"]\n', "needs credentials_file"),
    ('credentials_file = "/x"\n', "set sasl_mechanisms"),
    ('sasl_mechanisms = ["PLAIN"]\ncredentials_file = "/nonexistent/users"\n', "cannot be read"),
])
def test_sasl_options_that_do_not_agree_are_one_line_and_exit_2(kafka_cluster: KafkaCluster, tmp_path: Path,
                                                                lines: str, fragment: str) -> None:
    assert fragment in refused_config(kafka_cluster.metadata, tmp_path, lines)


def test_a_credentials_file_open_to_others_is_refused(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    options = sasl_options(tmp_path)
    (tmp_path / "users").chmod(0o644)
    assert "chmod 600" in refused_config(kafka_cluster.metadata, tmp_path, options)
