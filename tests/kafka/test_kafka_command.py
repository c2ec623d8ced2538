"""``ledgerstore kafka --config kafka.toml``: one broker process for a running cluster; its
configuration refused in one line; topics auto-created or not, as configured."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient

from ledgerstore.aio import Client
from ledgerstore_kafka.partition import log_name
from tests.kafka.conftest import LEDGERSTORE, KafkaCluster, kafka_command

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(("text", "fragment"), [
    ('metadata = "sqlite+tcp://127.0.0.1:1"\n[kafka]\nport = "x"\n', "port"),
    ('metadata = "sqlite+tcp://127.0.0.1:1"\n[kafka]\nnum_partitions = 0\n', "num_partitions"),
    ('metadata = "sqlite+tcp://127.0.0.1:1"\nlisten = 1\n', "'listen'"),
    ("[kafka]\nport = 9092\n", "metadata"),
    ("metadata = \n", "kafka.toml"),
])
def test_a_bad_kafka_toml_is_one_line_and_exit_code_2(tmp_path: Path, text: str, fragment: str) -> None:
    config = tmp_path / "kafka.toml"
    config.write_text(text)
    done = subprocess.run([LEDGERSTORE, "kafka", "--config", str(config)], capture_output=True, timeout=60)
    assert done.returncode == 2, done
    err = done.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err, err


def test_the_kafka_command_serves_a_cluster_and_creates_topics_only_when_configured(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    with kafka_command(kafka_cluster.metadata, tmp_path, "auto_create_topics = false\n") as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        missing = admin.list_topics(topic="never-made", timeout=30).topics["never-made"]
        assert missing.error is not None and missing.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART

        async def make_log() -> None:  # a topic is its partitions' logs: make partition 0's log
            async with Client(metadata=kafka_cluster.metadata) as client:
                writer = await client.open_log(log_name("made-as-a-log", 0))
                await writer.close()

        asyncio.run(make_log())
        producer = ConfluentProducer({"bootstrap.servers": bootstrap, "acks": "all"})
        producer.produce("made-as-a-log", b"hello")
        assert producer.flush(30) == 0
        assert admin.list_topics(topic="made-as-a-log", timeout=30).topics["made-as-a-log"].error is None
