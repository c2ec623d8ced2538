"""A standalone cluster serving Kafka (``ledgerstore standalone --kafka-port P`` on a free port),
shared by the tests of a module and stopped by its PID; and helpers the Kafka tests share."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from ledgerstore.testing.servers import free_port
from ledgerstore_kafka.codec import Reader, Writer

LEDGERSTORE = str(Path(sys.executable).parent / "ledgerstore")


@dataclass(frozen=True)
class KafkaCluster:
    """A running ``ledgerstore standalone --kafka-port``."""

    bootstrap: str
    metadata: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_standalone(data_dir: Path, timeout: float = 90.0) -> KafkaCluster:
    port = free_port()
    log = data_dir / "standalone.out"
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen([LEDGERSTORE, "standalone", "--data-dir", str(data_dir / "data"), "--port-base", "0",
                                 "--kafka-port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "COLUMNS": "250"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "serving; press Ctrl-C" in text:
            match = re.search(r"metadata URI: (\S+)", text)
            assert match, text
            return KafkaCluster(f"127.0.0.1:{port}", match.group(1), proc, log)
        if proc.poll() is not None:
            raise AssertionError(f"standalone exited with {proc.returncode}:\n{text}")
        time.sleep(0.2)
    stop_standalone(proc)
    raise AssertionError(f"standalone did not serve Kafka within {timeout}s:\n{log.read_text(errors='replace')}")


def stop_standalone(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def kafka_command(metadata: str, tmp_path: Path, options: str = "") -> Iterator[str]:
    """``ledgerstore kafka --config`` on a free port for the cluster at ``metadata``, with more
    ``[kafka]`` lines in ``options``; yields its bootstrap address, stops it by PID (exit 0)."""
    port = free_port()
    config = tmp_path / "kafka.toml"
    config.write_text(f'metadata = "{metadata}"\n[kafka]\nport = {port}\n{options}')
    out = tmp_path / "kafka.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([LEDGERSTORE, "kafka", "--config", str(config)], stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while f"kafka ready on 127.0.0.1:{port}" not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, out.read_text()


def refused_config(metadata: str, tmp_path: Path, lines: str) -> str:
    """The one line ``ledgerstore kafka --config`` prints when refusing ``[kafka]`` ``lines``
    (after checking the exit code is 2 and there is no traceback)."""
    config = tmp_path / "kafka.toml"
    config.write_text(f'metadata = "{metadata}"\n[kafka]\nport = 0\n{lines}')
    done = subprocess.run([LEDGERSTORE, "kafka", "--config", str(config)], capture_output=True, timeout=60)
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, done
    return err


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = start_standalone(tmp_path_factory.mktemp("kafka"))
    try:
        yield cluster
    finally:
        stop_standalone(cluster.proc)


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return f"t-{uuid.uuid4().hex[:10]}"


def confluent_poll(consumer: Any, n: int, timeout_s: float = 60.0) -> list[Any]:
    """Up to ``n`` messages polled from a confluent-kafka consumer within ``timeout_s``; an error
    message fails the test."""
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(messages) < n and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        assert message.error() is None, message.error()
        messages.append(message)
    return messages


class RawClient:
    """Kafka requests written with our codec on a plain socket, to hand the broker exactly the
    batches a test means (a retry, a gap, an old epoch)."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0

    def request(self, api_key: int, version: int, body: bytes) -> Reader:
        self.correlation += 1
        frame = Writer().int16(api_key).int16(version).int32(self.correlation).nullable_string("raw").bytes() + body
        self.sock.sendall(len(frame).to_bytes(4, "big") + frame)
        size = int.from_bytes(self._exactly(4), "big")
        r = Reader(self._exactly(size))
        assert r.int32() == self.correlation
        return r

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return data

    def init_producer_id(self, transactional_id: str | None = None) -> tuple[int, int, int]:
        r = self.request(22, 1, Writer().nullable_string(transactional_id).int32(60_000).bytes())
        r.int32()  # throttle
        return r.int16(), r.int64(), r.int16()

    def create_topic(self, topic: str) -> None:
        self.request(3, 4, Writer().array_length(1).string(topic).boolean(True).bytes())

    def produce(self, topic: str, batch: bytes, partition: int = 0) -> tuple[int, int]:
        """``(error, base offset)`` of a Produce v7 with one batch for ``partition``, acks=all."""
        body = (Writer().nullable_string(None).int16(-1).int32(30_000).array_length(1).string(topic)
                .array_length(1).int32(partition).nullable_bytes(batch).bytes())
        r = self.request(0, 7, body)
        assert r.array_length() == 1 and r.string() == topic and r.array_length() == 1
        assert r.int32() == partition
        return r.int16(), r.int64()

    def close(self) -> None:
        self.sock.close()


def record_batch(producer_id: int, epoch: int, base_sequence: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, epoch, base_sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, int(time.time() * 1000), None, value, [])
    return bytes(builder.build())


@dataclass(frozen=True)
class KafkaProcess:
    """A running ``ledgerstore kafka --config`` (its output in ``directory / "kafka.out"``)."""

    bootstrap: str
    proc: subprocess.Popen[bytes]


def start_kafka_process(metadata: str, directory: Path, port: int, node_id: int = 0) -> KafkaProcess:
    """``ledgerstore kafka --config`` as broker ``node_id`` on ``port``, once it serves (started
    again on the same directory, it appends to the same output)."""
    directory.mkdir(parents=True, exist_ok=True)
    config, out = directory / "kafka.toml", directory / "kafka.out"
    config.write_text(f'metadata = "{metadata}"\n[kafka]\nport = {port}\nnode_id = {node_id}\n')
    ready = f"kafka ready on 127.0.0.1:{port}"
    before = out.read_text().count(ready) if out.exists() else 0
    with open(out, "ab") as fh:
        proc = subprocess.Popen([LEDGERSTORE, "kafka", "--config", str(config)], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while out.read_text().count(ready) == before:
        assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
        time.sleep(0.1)
    return KafkaProcess(f"127.0.0.1:{port}", proc)
