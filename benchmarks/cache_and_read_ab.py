"""Two A/B comparisons of bookie settings behind the issue-30 figures in ``docs/performance.md``,
each on fresh 3-bookie ``LocalCluster``s, the settings alternated in the order given:

- ``many``: the ``many_ledgers`` row's own code (10,000 ledgers, 1,000,000 entries a pass) with
  the index page cache at the old default (``cache64``: 64 MiB) or holding every ledger's tail
  page (``cache128``: 128 MiB);
- ``read``: a 10-second ledger of 100 B entries read 3 times by the read row's reader, entries
  read on the read workers (``workers``, the default) or on the event loop (``loop``:
  ``num_read_worker_threads = 0``).

Usage::

    python benchmarks/cache_and_read_ab.py many cache64 cache128 cache64 cache128
    python benchmarks/cache_and_read_ab.py read workers loop workers loop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import run_all  # noqa: E402
import scale_rows  # noqa: E402

from ledgerstore.aio import Client  # noqa: E402
from ledgerstore.bench.workload import ReadOptions, WriteOptions, run_reads, run_writes  # noqa: E402
from ledgerstore.cluster import LocalCluster  # noqa: E402

SETTINGS = {
    "cache64": "storage_options = { page_limit_bytes = 67108864 }\n",
    "cache128": "storage_options = { page_limit_bytes = 134217728 }\n",
    "workers": "",
    "loop": "num_read_worker_threads = 0\n",
}


async def _reads(cluster: LocalCluster) -> dict[str, Any]:
    async with Client(metadata=cluster.metadata) as client:
        w = await run_writes(client, WriteOptions(duration=10, warmup=1, ensemble=3, write_quorum=3, ack_quorum=2,
                                                  entry_size=100, batch=100, password=run_all.PASSWORD,
                                                  keep_ledgers=True))
        rates = []
        for _ in range(3):
            await asyncio.to_thread(run_all.quiet_disk)
            rd = await run_reads(client, ReadOptions(ledger_id=w.ledger_ids[0], password=run_all.PASSWORD,
                                                     batch=run_all.READ_BATCH, window=run_all.READ_WINDOW))
            rates.append(round(rd.entries_per_s))
        return {"written_entries_per_s": round(w.entries_per_s), "read_entries_per_s": rates}


def run(kind: str, setting: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="ab-"))
    cluster = LocalCluster(tmp / "c", bookies=3, port_base=None, storage="entrylog",
                           extra_bookie_config=SETTINGS[setting])
    try:
        cluster.start()
        if kind == "read":
            return asyncio.run(_reads(cluster))
        d = asyncio.run(scale_rows._many_ledgers(cluster, 10_000, 1_000_000, run_all.rss_mb))
        return {k: d[k] for k in ("passes_entries_per_s", "reference", "bookie_rss_mb")}
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("many", "read"))
    ap.add_argument("settings", nargs="+", choices=sorted(SETTINGS))
    args = ap.parse_args()
    for setting in args.settings:
        run_all.quiet_disk()
        print(setting, run_all.uptime(), json.dumps(run(args.kind, setting)), flush=True)


if __name__ == "__main__":
    main()
