"""Add latency at a fixed rate right after a burst of large writes.

Starts 3 ``entrylog`` bookies, writes 1 KB entries (E=3 Qw=3 Qa=2) as fast as one client can for
``--load-seconds``, then appends 100 B entries at ``--rate`` per second for ``--duration`` seconds
and reports their latency (from each add's due time, as the latency row of ``run_all.py``) and the
worst latency of each second. On one disk, gigabytes of entry-log data written just before show
up here as journal fsyncs waiting behind the write-back; ``--storage-option
flush_entrylog_bytes=0`` turns the engine's progressive write-back off for comparison.

    python benchmarks/latency_after_load.py --load-seconds 8
    python benchmarks/latency_after_load.py --load-seconds 8 --storage-option flush_entrylog_bytes=0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ledgerstore.aio import Client
from ledgerstore.bench import WriteOptions, run_writes
from ledgerstore.cluster import LocalCluster
from ledgerstore.runtime import install_fast_loop, tune_gc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import rate_limited_adds  # noqa: E402


def _dirty_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Dirty:"):
            return int(line.split()[1])
    return -1


async def _run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    async with Client(metadata=cluster.metadata) as client:
        load = await run_writes(client, WriteOptions(ensemble=3, write_quorum=3, ack_quorum=2, entry_size=1024,
                                                     duration=args.load_seconds, batch=100))
        dirty = _dirty_kb()
        lat = await rate_limited_adds(client, args.rate, args.duration, 100, 3, 3, 2)
    return {"load_entries_per_s": load.entries_per_s, "load_mb_per_s": load.mb_per_s,
            "dirty_kb_after_load": dirty, "latency_ms": lat["latency_ms"],
            "worst_ms_per_second": lat["worst_ms_per_second"], "storage_options": args.storage_option}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load-seconds", type=float, default=8.0, help="seconds of 1 KB writes first")
    ap.add_argument("--rate", type=float, default=10_000, help="adds per second afterwards")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of rate-limited adds")
    ap.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an entrylog engine option for the bookies (repeatable), e.g. flush_entrylog_bytes=0")
    args = ap.parse_args(argv)
    options = "\n".join(f"{k.strip()} = {v.strip()}" for k, v in (o.split("=", 1) for o in args.storage_option))
    install_fast_loop()
    tune_gc()
    with tempfile.TemporaryDirectory(prefix="ledgerstore-lat-") as tmp:
        cluster = LocalCluster(Path(tmp), bookies=3, port_base=None,
                               extra_bookie_config=f"[bookie.storage_options]\n{options}\n" if options else "")
        try:
            cluster.start()
            result = asyncio.run(_run(cluster, args))
        finally:
            cluster.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
