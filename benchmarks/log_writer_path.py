"""The log writer's own work per append, plain against sequenced: a ``LogWriter`` over a ledger
handle that acknowledges every add at the next loop iteration (no network, no bookies), 200,000
appends of 100 B with 5,000 in flight, as the ``log_dedup`` row of ``run_all.py`` appends them.

Usage::

    python benchmarks/log_writer_path.py                # 4 runs of each mode, alternated
    python benchmarks/log_writer_path.py --runs 8 --no-gc

Prints the least and median nanoseconds per append of each mode and their difference. With
``--no-gc`` the garbage collector is off during the runs, which separates its share. To measure
an older checkout, run its copy of this script with its own environment.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from types import SimpleNamespace
from typing import Any

from ledgerstore.client.log.writer import LogWriter

#: appends per run and appends in flight, as the log_dedup row
APPENDS = 200_000
WINDOW = 5_000


class InstantLedger:
    """Acknowledges every add at the next loop iteration, in order."""

    ledger_id = 7

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.next_id = 0
        self.batch: list[asyncio.Future[int]] = []

    def append_async(self, data: bytes) -> asyncio.Future[int]:
        fut = self.loop.create_future()
        self.batch.append(fut)
        if len(self.batch) == 1:
            self.loop.call_soon(self._ack)
        return fut

    def _ack(self) -> None:
        batch, self.batch = self.batch, []
        for fut in batch:
            fut.set_result(self.next_id)
            self.next_id += 1


async def one_run(sequenced: bool) -> float:
    """Nanoseconds of this process's CPU per append over one run."""
    loop = asyncio.get_running_loop()
    client: Any = SimpleNamespace(loop=loop, store=object(), metadata=None)
    md: Any = SimpleNamespace(name="bench")
    w = LogWriter(client, md, InstantLedger(loop), None, None, None,  # type: ignore[arg-type]
                  producer_id="bench" if sequenced else None)
    payload = b"x" * 100
    pending: list[asyncio.Future[Any]] = []
    t0 = time.process_time()
    for i in range(APPENDS):
        pending.append(w.append_async(payload, seq=i) if sequenced else w.append_async(payload))
        if len(pending) >= WINDOW:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return (time.process_time() - t0) / APPENDS * 1e9


async def main(runs: int, no_gc: bool) -> None:
    if no_gc:
        gc.disable()
    ns: dict[bool, list[float]] = {False: [], True: []}
    for r in range(runs):
        for sequenced in ((False, True) if r % 2 == 0 else (True, False)):
            ns[sequenced].append(await one_run(sequenced))
    plain, seq = min(ns[False]), min(ns[True])
    print(f"plain {plain:.0f} ns, sequenced {seq:.0f} ns per append (least of {runs}), {seq - plain:+.0f} ns; "
          f"medians {statistics.median(ns[False]):.0f} / {statistics.median(ns[True]):.0f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4, help="runs of each mode")
    ap.add_argument("--no-gc", action="store_true", help="turn the garbage collector off during the runs")
    args = ap.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(args.runs, args.no_gc))
