"""The writer's cost per add, without a network: one ``LedgerHandle`` (E=3 Qw=3 Qa=2) whose
bookie client answers every ADD_BATCH frame with an all-OK at the next loop iteration, so what
is timed is the client's own work per ``append_async`` (future, pending add, signing, framing,
in-order acknowledgement), and, separately, what an application adds on top of it to handle each
future (a done-callback per add, or one task awaiting the futures in order, as the benchmark's
``run_writes`` does).

Usage::

    python benchmarks/client_add_path.py                  # compiled and pure-Python, 5 runs each
    python benchmarks/client_add_path.py --adds 1000000 --runs 7

Each mode runs ``--runs`` times in a fresh event loop (uvloop when installed); the output is the
min / median / max of the microseconds per add. The pure-Python figures come from a child
process with ``LEDGERSTORE_PURE_PYTHON=1``. To measure an older checkout (its hot path built
in place by its own ``scripts/setup.sh``), put its ``core`` first: ``PYTHONPATH=OLD/core python
benchmarks/client_add_path.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

from ledgerstore.bench.workload import _Acks

try:
    from ledgerstore.bench.workload import _InOrder
except ImportError:  # an older ledgerstore (PYTHONPATH=OLD_CHECKOUT/core): that mode is left out
    _InOrder = None
from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.config import ClientConfig
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.proto import codec, speedups
from ledgerstore.runtime import install_fast_loop, tune_gc

THROTTLE = 10_000
TURN = 1000  # adds per event-loop turn, as run_writes issues them


class InstantBookies:
    """A bookie client that acknowledges every ADD_BATCH frame whole at the next iteration."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def add_batch(self, bid: str, body: bytes, cb: Any, timeout: float) -> None:
        count = struct.unpack_from(">QHI", body)[2]
        resp = codec.AddBatchResponse(request_id=0, status=0, ledger_id=1, count=count, all_ok=True)
        self.loop.call_soon(cb, resp, None)


def _handle(loop: asyncio.AbstractEventLoop) -> LedgerHandle:
    ctx: Any = SimpleNamespace(loop=loop, config=ClientConfig(), bookie_client=InstantBookies(loop))
    md = LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=3, ack_quorum=2, digest_type="crc32c",
                        password_check="", ensembles=[(0, ["b0:1", "b1:1", "b2:1"])])
    return LedgerHandle(ctx, md, b"pw")


async def library_only(n: int) -> float:
    """append_async with nothing done per future: the library's own cost."""
    lh = _handle(asyncio.get_running_loop())
    payload = b"x" * 100
    t0 = time.perf_counter()
    futs: list[asyncio.Future[int]] = []
    for i in range(n):
        futs.append(lh.append_async(payload))
        if i % TURN == TURN - 1:
            await asyncio.sleep(0)
            if len(futs) >= THROTTLE:
                await futs[-1]
                futs = []
    if futs:
        await futs[-1]
    return (time.perf_counter() - t0) / n * 1e6


def _start() -> tuple[LedgerHandle, _Acks, float]:
    """A handle, the benchmark's bookkeeping of outstanding adds, and the start time."""
    acks = _Acks(THROTTLE)
    acks.measure_from = t0 = time.perf_counter()
    return _handle(asyncio.get_running_loop()), acks, t0


async def with_callbacks(n: int) -> float:
    """A done-callback per add that records its latency (BookKeeper's benchmark style)."""
    lh, acks, t0 = _start()
    payload = b"x" * 100
    for i in range(n):
        if acks.outstanding >= THROTTLE:
            acks.space.clear()
            await acks.space.wait()
        t = time.perf_counter()
        fut = lh.append_async(payload)
        acks.issued()
        fut.add_done_callback(functools.partial(acks.done, t, True))
        if i % TURN == TURN - 1:
            await asyncio.sleep(0)
    await acks.drained.wait()
    return (time.perf_counter() - t0) / n * 1e6


async def awaited_in_order(n: int) -> float:
    """One task awaits the futures in issue order and records each latency (``run_writes``)."""
    lh, acks, t0 = _start()
    payload = b"x" * 100
    in_order = _InOrder(acks)
    consumer = asyncio.create_task(in_order.consume())
    i = 0
    while i < n:
        if acks.outstanding >= THROTTLE:
            acks.space.clear()
            await acks.space.wait()
            continue
        k = min(THROTTLE - acks.outstanding, TURN, n - i)
        in_order.issue([lh], payload, i, k, True)
        i += k
        await asyncio.sleep(0)
    await acks.drained.wait()
    consumer.cancel()
    if acks.measured != n:
        raise RuntimeError(f"{acks.measured} of {n} adds acknowledged")
    return (time.perf_counter() - t0) / n * 1e6


MODES = {"library only": library_only, "a done-callback per add": with_callbacks,
         "awaited in order (run_writes)": awaited_in_order}


def measure(adds: int, runs: int) -> dict[str, dict[str, float]]:
    install_fast_loop()
    tune_gc()
    out = {}
    for name, fn in MODES.items():
        if fn is awaited_in_order and _InOrder is None:
            continue
        vals = sorted(asyncio.run(fn(adds)) for _ in range(runs))
        out[name] = {"min": round(vals[0], 3), "median": round(statistics.median(vals), 3), "max": round(vals[-1], 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adds", type=int, default=300_000, help="adds per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print this path's figures as JSON (used for the child)")
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps(measure(args.adds, args.runs)))
        return 0
    paths = {}
    for label, pure in (("compiled", False), ("pure Python", True)):
        if not pure and speedups.compiled is None:
            print("the compiled hot path is not built (scripts/setup.sh) or LEDGERSTORE_PURE_PYTHON is set")
            continue
        env = dict(os.environ, **{speedups.PURE_PYTHON_ENV: "1" if pure else "0"})
        res = subprocess.run([sys.executable, __file__, "--json", "--adds", str(args.adds), "--runs", str(args.runs)],
                             env=env, capture_output=True, text=True)
        if res.returncode:
            print(f"the {label} run failed:\n{res.stderr}", file=sys.stderr)
            return 1
        paths[label] = json.loads(res.stdout)
    print(f"µs per add, {args.adds:,} adds of 100 B, E=3 Qw=3 Qa=2, instant bookies; min / median / max of {args.runs}")
    for label, modes in paths.items():
        for mode, v in modes.items():
            print(f"  {label:12} {mode:32} {v['min']:.2f} / {v['median']:.2f} / {v['max']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
