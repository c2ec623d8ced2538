"""The Kafka protocol handler against the protocol handler conformance suite, on a real cluster
(the handler runs in the test process against the standalone's bookies and metadata)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from ledgerstore.testing import ProtocolHandlerConformance
from tests.kafka.conftest import KafkaCluster


class TestKafkaHandler(ProtocolHandlerConformance):
    handler_name = "kafka"
    bad_options: ClassVar[list[tuple[dict[str, Any], str]]] = [
        ({"port": -1}, "port"),
        ({"port": 70000}, "port"),
        ({"no_such_option": 1}, "no_such_option"),
        ({"num_partitions": 0}, "num_partitions"),
        ({"max_batch_bytes": "big"}, "max_batch_bytes"),
        ({"auto_create_topics": "perhaps"}, "auto_create_topics"),
    ]

    @pytest.fixture
    def metadata_uri(self, kafka_cluster: KafkaCluster) -> str:
        return kafka_cluster.metadata

    async def probe(self, host: str, port: int) -> None:
        """ApiVersions v2 (correlation id 42), answered with error 0 and the Produce range."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
        request = b"\x00\x12\x00\x02\x00\x00\x00\x2a\x00\x05probe"
        writer.write(len(request).to_bytes(4, "big") + request)
        size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
        body = await asyncio.wait_for(reader.readexactly(size), 10)
        writer.close()
        await writer.wait_closed()
        assert body[:4] == (42).to_bytes(4, "big")
        assert body[4:6] == b"\x00\x00"
        assert b"\x00\x00\x00\x03\x00\x08" in body  # Produce: versions 3 to 8
