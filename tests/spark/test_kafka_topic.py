"""A Kafka topic read through ``spark.read.format("ledgerstore")``: its partition is the log
``kafka-<topic>-0``, one record batch per row, decoded into Kafka's records with
``ledgerstore_kafka.records.decode_records`` in the Spark job (docs/kafka.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as ConfluentProducer

from ledgerstore_kafka.records import decode_records
from tests.kafka.conftest import start_standalone, stop_standalone

pytestmark = pytest.mark.timeout(400)


def test_a_topic_written_by_a_kafka_producer_reads_back_in_spark_record_by_record(spark: Any, tmp_path: Path) -> None:
    cluster = start_standalone(tmp_path)
    try:
        producer = ConfluentProducer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5,
                                      "compression.type": "gzip"})
        for i in range(500):
            producer.produce("orders", key=f"k{i}".encode(), value=f"order {i}".encode())
        assert producer.flush(60) == 0
        producer.produce("orders", b"last")  # its add carries the last-add-confirmed past the 500
        assert producer.flush(60) == 0
        batches = (spark.read.format("ledgerstore").option("metadata", cluster.metadata)
                   .option("log", "kafka-orders-0").load())
        records = batches.select("payload").rdd.flatMap(
            lambda row: [(r.offset, r.key, r.value) for r in decode_records(row.payload)]).toDF(["offset", "key", "value"])
        rows = records.orderBy("offset").collect()
        stored = batches.count()
    finally:
        stop_standalone(cluster.proc)
    assert stored < 500  # batches, not records
    got = [(r.offset, bytes(r.key), bytes(r.value)) for r in rows if r.offset < 500]
    assert got == [(i, f"k{i}".encode(), f"order {i}".encode()) for i in range(500)]
