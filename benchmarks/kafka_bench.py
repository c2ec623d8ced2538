"""The Kafka front end against the log API it runs on, same run, same cluster.

Usage::

    python benchmarks/kafka_bench.py                      # ~1 minute
    python benchmarks/kafka_bench.py --records 100000 --json

It starts ``ledgerstore standalone --kafka-port`` (3 bookies, the defaults: E=3 Qw=2 Qa=2, every
bookie fsyncs its journal before it acknowledges) in a temporary directory and measures, in this
order:

1. **produce**: confluent-kafka (librdkafka) producing ``--records`` 100-byte records to one
   partition, ``acks=all``, batching on (``linger.ms=5``, up to 10,000 records a batch): records/s
   from the first ``produce()`` to the end of ``flush()``;
2. **append_many**: our own client appending the same number of 100-byte entries to a log with
   ``append_many``, 1,000 entries a call, 8 calls in flight: entries/s;
3. **consume**: a confluent-kafka consumer reading the topic back from offset 0: records/s;
4. **log read**: a log reader reading the log of row 2 back: entries/s;
5. **latency**: confluent-kafka producing at a fixed 5,000 records/s for ``--latency-seconds``
   (``linger.ms=1``), each record timed from when it was due to its delivery report: p50, p99, max.

The ratio produce / append_many is the front end's cost over the log it writes (the issue's
target is at least 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from ledgerstore.aio import Client
from ledgerstore.ports import free_ports

LEDGERSTORE = str(Path(sys.executable).parent / "ledgerstore")
PAYLOAD = b"x" * 100


def start_cluster(directory: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """``ledgerstore standalone --kafka-port``: its process, bootstrap address and metadata URI."""
    port = free_ports(1)[0]
    out = directory / "standalone.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([LEDGERSTORE, "standalone", "--data-dir", str(directory / "data"),
                                 "--port-base", "0", "--kafka-port", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "250"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        found = re.search(r"metadata URI: (\S+)", text)
        if "serving; press Ctrl-C" in text and found:
            return proc, f"127.0.0.1:{port}", found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"kafka_bench: the standalone cluster did not start:\n{out.read_text(errors='replace')}")


def produce(bootstrap: str, topic: str, records: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "batch.num.messages": 10_000, "queue.buffering.max.messages": 1_000_000})
    failed = 0

    def report(err: object, _msg: object) -> None:
        nonlocal failed
        failed += err is not None

    producer.produce(topic, PAYLOAD, on_delivery=report)  # the topic exists and the connection is up
    producer.flush(60)
    start = time.perf_counter()
    for _ in range(records):
        producer.produce(topic, PAYLOAD, on_delivery=report)
        producer.poll(0)
    remaining = producer.flush(300)
    elapsed = time.perf_counter() - start
    if failed or remaining:
        raise SystemExit(f"kafka_bench: {failed} records failed, {remaining} not delivered")
    return records / elapsed


def consume(bootstrap: str, topic: str, records: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False,
                         "fetch.max.bytes": 50 << 20, "max.partition.fetch.bytes": 10 << 20})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.perf_counter()
    while got < records:
        for message in consumer.consume(min(10_000, records - got), timeout=5):
            if message.error() is None:
                got += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return got / elapsed


async def append_and_read(metadata: str, records: int) -> tuple[float, float]:
    async with Client(metadata=metadata) as client:
        writer = await client.open_log("bench-append-many")
        batch = [PAYLOAD] * 1000
        in_flight: list[asyncio.Future[Any]] = []
        start = time.perf_counter()
        for _ in range(records // len(batch)):
            in_flight.append(writer.append_many_async(batch))
            if len(in_flight) >= 8:
                await in_flight.pop(0)
        await asyncio.gather(*in_flight)
        appended = records // len(batch) * len(batch) / (time.perf_counter() - start)
        await writer.close()
        reader = await client.open_log_reader("bench-append-many", "earliest")
        got = 0
        start = time.perf_counter()
        while got < records and (entries := await reader.read_batch(10_000)):
            got += len(entries)
        read = got / (time.perf_counter() - start)
        await reader.close()
        return appended, read


def latency(bootstrap: str, topic: str, rate: int, seconds: float) -> dict[str, float]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    samples: list[float] = []

    def report(due: float, err: object, _msg: object) -> None:
        if err is None:
            samples.append(time.perf_counter() - due)

    producer.produce(topic, PAYLOAD)
    producer.flush(60)
    start = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        while (now := time.perf_counter()) < due:
            producer.poll(min(due - now, 0.001))
        producer.produce(topic, PAYLOAD, on_delivery=functools.partial(report, due))
        producer.poll(0)
    producer.flush(60)
    samples.sort()
    if len(samples) < n:
        raise SystemExit(f"kafka_bench: {n - len(samples)} of {n} latency records failed")
    return {"p50_ms": samples[len(samples) // 2] * 1000, "p99_ms": samples[int(len(samples) * 0.99)] * 1000,
            "max_ms": samples[-1] * 1000, "mean_ms": statistics.fmean(samples) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records produced and appended")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=5000, help="records/s of the latency row")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as tmp:
        proc, bootstrap, metadata = start_cluster(Path(tmp))
        try:
            result: dict[str, Any] = {"load_average": os.getloadavg(), "records": args.records}
            result["produce_records_s"] = produce(bootstrap, "bench", args.records)
            appended, read = asyncio.run(append_and_read(metadata, args.records))
            result["append_many_entries_s"] = appended
            result["produce_over_append_many"] = result["produce_records_s"] / appended
            result["consume_records_s"] = consume(bootstrap, "bench", args.records + 1)
            result["log_read_entries_s"] = read
            result["latency"] = latency(bootstrap, "bench-latency", args.rate, args.latency_seconds)
            result["load_average_after"] = os.getloadavg()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    if args.json:
        print(json.dumps(result))
        return
    lat = result["latency"]
    print(f"produce (confluent-kafka, acks=all)  {result['produce_records_s']:>10,.0f} records/s")
    print(f"append_many on a log                  {result['append_many_entries_s']:>10,.0f} entries/s "
          f"(produce / append_many = {result['produce_over_append_many']:.2f})")
    print(f"consume (confluent-kafka)             {result['consume_records_s']:>10,.0f} records/s")
    print(f"log reader                            {result['log_read_entries_s']:>10,.0f} entries/s")
    print(f"produce latency at {args.rate:,}/s: p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, "
          f"max {lat['max_ms']:.1f} ms")
    print(f"load average before {result['load_average'][0]:.2f}, after {result['load_average_after'][0]:.2f}")


if __name__ == "__main__":
    main()
