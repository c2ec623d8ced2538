"""What CPU alone does to a writer's p99 on this machine: the control of the operations rows.

The ``catchup_isolation`` and ``recovery`` rows hold a writer's p99 beside background work to at
most twice its p99 alone. That work (a catch-up reader's client, the bookies' read workers, the
replication workers) needs CPU, and on a small machine it takes that CPU from the same cores the
writer's client and the bookies run on. This measures the part no storage code can remove: a
3-bookie cluster, the latency row's writer (10,000 entries/s, E=3 Qw=3 Qa=2, 100 B) alone, then
beside ``--hogs`` processes that only spin in Python (no disk, no network, nothing of ours), in
alternating rounds, each after the disk has settled:

    python benchmarks/cpu_interference.py --rounds 3 --hogs 1
    python benchmarks/cpu_interference.py --rounds 3 --hogs 1 --nice 19

``--nice`` runs the spinning processes at that niceness (the scheduler's share a background
process would get at that priority). Prints one JSON document: each run's writer p50 / p99 / max,
and the ratio of the p99 beside the hogs to the p99 alone, per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ops_rows  # noqa: E402
import run_all  # noqa: E402

from ledgerstore.aio import Client  # noqa: E402
from ledgerstore.runtime import install_fast_loop, tune_gc  # noqa: E402

SPIN = "while True:\n    pass\n"


def start_hogs(n: int, nice: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that spin in Python at niceness ``nice``, each in a session of its own."""
    def lower() -> None:
        os.nice(nice)
    return [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True,
                             preexec_fn=lower if nice else None)
            for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for p in hogs:
        p.send_signal(signal.SIGKILL)
    for p in hogs:
        p.wait()


def _summary(w: dict[str, Any]) -> dict[str, Any]:
    lat = w["latency_ms"]
    return {"p50_ms": lat["p50"], "p99_ms": lat["p99"], "max_ms": lat["max"],
            "rate_achieved": w.get("rate_achieved")}


async def _rounds(cluster: Any, urls: dict[str, str], rounds: int, hogs: int, nice: int, rate: float,
                  seconds: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with Client(metadata=cluster.metadata) as client:
        for _ in range(rounds):
            await asyncio.to_thread(run_all.settled_disk, cluster.data_dir)
            alone = await ops_rows._writer(run_all, client, rate, seconds, urls, cluster.data_dir)
            await asyncio.to_thread(run_all.settled_disk, cluster.data_dir)
            spinning = start_hogs(hogs, nice)
            try:
                beside = await ops_rows._writer(run_all, client, rate, seconds, urls, cluster.data_dir)
            finally:
                stop_hogs(spinning)
            out.append({"alone": _summary(alone), "beside_hogs": _summary(beside),
                        "p99_ratio": round(beside["latency_ms"]["p99"] / alone["latency_ms"]["p99"], 2)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating alone / beside-the-hogs rounds")
    ap.add_argument("--hogs", type=int, default=1, help="processes that spin in Python meanwhile")
    ap.add_argument("--nice", type=int, default=0, help="the spinning processes' niceness (0-19)")
    ap.add_argument("--rate", type=float, default=10_000, help="the writer's entries per second")
    ap.add_argument("--seconds", type=float, default=15.0, help="each writer run's measured seconds")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.hogs < 1 or not 0 <= args.nice <= 19 or args.rate <= 0 or args.seconds <= 0:
        ap.error("--rounds and --hogs must be at least 1, --nice 0-19, --rate and --seconds positive")
    install_fast_loop()
    tune_gc()
    with tempfile.TemporaryDirectory(prefix="ledgerstore-cpu-") as tmp:
        run_all.quiet_disk()
        load = run_all.uptime()
        with ops_rows.cluster_of(run_all, Path(tmp), "cpu", 3) as (cluster, urls):
            rounds = asyncio.run(_rounds(cluster, urls, args.rounds, args.hogs, args.nice, args.rate, args.seconds))
    ratios = sorted(r["p99_ratio"] for r in rounds)
    print(json.dumps({"hogs": args.hogs, "nice": args.nice, "rate": args.rate, "seconds": args.seconds,
                      "cores": os.cpu_count(), "load_before": load, "rounds": rounds,
                      "p99_ratio_min_median_max": [ratios[0], ratios[len(ratios) // 2], ratios[-1]]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
