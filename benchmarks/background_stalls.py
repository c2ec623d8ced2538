"""How long the add path waits while the entrylog engine compacts or checkpoints in the background.

The bookie adds entries on its event loop under the engine's lock; a compaction or a checkpoint
runs in a worker thread and takes the same lock in steps. This builds an engine in a temporary
directory, then, while a thread runs a major compaction (half the data deleted) and then a
checkpoint of ``--entries`` dirty index slots, adds one entry every millisecond from this thread
and reports how long those adds took (the event loop would have been blocked that long):

    python benchmarks/background_stalls.py --entries 400000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerstore_entrylog import EntryLogStorage


def _adds_during(e: EntryLogStorage, work: Callable[[], object], ledger: int) -> dict[str, Any]:
    """Add one 100 B entry every millisecond while ``work`` runs in a thread."""
    took: list[float] = []
    t = threading.Thread(target=work)
    start = time.perf_counter()
    t.start()
    eid = 0
    payload = bytes(100)
    while t.is_alive():
        t0 = time.perf_counter()
        e.add_entry(ledger, eid, payload)
        took.append(time.perf_counter() - t0)
        eid += 1
        time.sleep(0.001)
    t.join()
    took.sort()
    return {"seconds": round(time.perf_counter() - start, 2), "adds": len(took),
            "add_ms_p99": round(took[int(len(took) * 0.99)] * 1000, 2) if took else None,
            "add_ms_max": round(took[-1] * 1000, 2) if took else None}


def run(entries: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ledgerstore-stalls-") as tmp:
        e = EntryLogStorage([Path(tmp)])
        e.open()
        for start in range(0, entries, 1000):
            for lid in (1, 2):
                e.add_entries(lid, [(eid, bytes(100)) for eid in range(start, min(entries, start + 1000))])
        e.flush()
        e.close()
        e = EntryLogStorage([Path(tmp)])
        e.open()
        try:
            e.delete_ledger(2)
            compaction = _adds_during(e, lambda: e.compact(0.8), ledger=3)
            # a fresh ledger with one dirty index slot per entry, then the checkpoint writing them
            for start in range(0, entries, 1000):
                e.add_entries(4, [(eid, bytes(100)) for eid in range(start, min(entries, start + 1000))])
            checkpoint = _adds_during(e, e.flush, ledger=5)
        finally:
            e.close()
    return {"entries_per_ledger": entries, "major_compaction": compaction, "checkpoint": checkpoint}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=400_000, help="entries of 100 B per ledger")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
