"""Throughput and latency benchmarks, shared by ``ledgerstore bench`` and scripts.

Modelled on BookKeeper's ``BenchThroughputLatency``: pipelined adds to one or more ledgers with a
bound on outstanding adds, latency per add from append to acknowledgement recorded in an HDR
histogram, throughput per second. Use from a script::

    from ledgerstore.aio import Client
    from ledgerstore.bench import WriteOptions, run_writes

    async with Client(metadata="sqlite:///tmp/meta.db") as client:
        result = await run_writes(client, WriteOptions(count=10_000))
    print(result.entries_per_s, result.latency_ms["p99"])
"""

from ledgerstore.bench.latency import LatencyRecorder
from ledgerstore.bench.workload import (
    ReadOptions,
    ReadResult,
    WriteOptions,
    WriteResult,
    run_reads,
    run_writes,
)

__all__ = [
    "LatencyRecorder",
    "ReadOptions",
    "ReadResult",
    "WriteOptions",
    "WriteResult",
    "run_reads",
    "run_writes",
]
