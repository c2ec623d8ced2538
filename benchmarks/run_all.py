"""Run the performance target table in one go; write a JSON result and a Markdown table.

Usage::

    python benchmarks/run_all.py                                  # ~3 minutes, 10 s per row
    python benchmarks/run_all.py --duration 30 --memory-entries 2000000 --profile-dir benchmarks/results/profiles
    python benchmarks/run_all.py --tiny --json-out /tmp/r.json --md-out /tmp/r.md   # shape check, ~20 s
    python benchmarks/run_all.py --memory-entries 0 --repeat 5      # every row 5 times: min / median / max
    python benchmarks/run_all.py --only latency --repeat 5          # the latency row alone, 5 times

Rows (every bookie fsyncs its journal before it acknowledges, the default):

1. 3 bookies, E=3 Qw=3 Qa=2, 100 B entries, ``append_many``, one client: entries/s (target >= 300,000)
   (and, as a detail, the same with one ``append_async`` per entry: a future per add)
2. the same with 1 KB entries: MB/s (target >= 70% of this disk's ceiling for it, measured in the
   same run: the fsync'd sequential write rate of 1 MiB appends, divided by the 6 bytes each
   acknowledged byte costs on disk, 3 replicas x journal + entry log). It runs on fresh bookies
   of its own, once the disk has written out what the 100 B rows left in the page cache, and
   the ceiling is measured just before it, on the same disk.
3. 1 bookie, E=Qw=Qa=1, 100 B: entries/s (target >= 300,000)
4. add latency at a fixed 10,000 adds/s, E=3 Qw=3 Qa=2: p99 (target <= 10 ms)
5. sequential read of the closed ledger written by row 1, right after it (once the disk has
   written out what row 1 left in the page cache): entries/s (target >= 600,000)
6. Redis 7 ``XADD`` (``appendonly yes``, ``appendfsync always``, pipelined, same entry size) in
   the same run: row 1 over Redis's entries/s (target >= 4)
7. log appends with a producer and sequence against plain ones, alternating in the same run on
   three fresh bookies, one ``append_async`` per entry and ``append_many``: sequenced over plain
   entries/s in the worse of the two modes (target >= 0.909, a cost of at most 10%); its details
   hold each mode's cost in % and the producer table's memory for 100,000 producers
   (``--only log_dedup``)

Each run starts once the disk is quiet (``sync``, then less than 32 MB dirty in the page cache),
so a run never measures the write-back of the run before it.

Throughput rows use ``ledgerstore.bench.run_writes`` / ``run_reads`` (the ``ledgerstore bench``
workloads) against bookie processes started by ``ledgerstore.cluster.LocalCluster`` in a temporary
directory; this process is the one client. The latency row issues adds on a fixed schedule and
measures each add from the time it was *due*, so a client that falls behind its schedule shows up
in the latency instead of silently lowering the rate (no coordinated omission).

Also measured: bookie RSS while writing ``--memory-entries`` entries (with the slope per million
entries) and client RSS with 10,000 adds outstanding (the bookies are paused with SIGSTOP so
that the adds stay outstanding). ``--profile-dir`` adds py-spy profiles (raw collapsed stacks) of
the client and one bookie during writes and during reads, with a top self-time summary; the
profiled runs are separate from the measured ones because py-spy takes CPU from them.

``--repeat N`` runs everything N times on fresh bookies: each row's measured value is then the
median, with ``spread`` (min, median, max, the per-run values, runs passing) beside it, and a row
passes only when every run passed ("5 of 5 runs" targets). ``--only ROW`` runs the named rows.

The latency row also says what took its worst seconds: every bookie runs with an admin HTTP port
and serves its per-second peaks (``GET /api/v1/bookie/stalls``: event-loop lag, journal queue
wait and fsync, checkpoint and engine flush, entry-log writes and write-back syncs, GC pauses by
generation; see ``ledgerstore.stalls``), this process probes its own loop lag and GC pauses, and
``details.stalls`` lists, for the worst seconds, the peaks of every process's components.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import gc
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ledgerstore.aio import Client, Position
from ledgerstore.bench import LatencyRecorder, ReadOptions, WriteOptions, run_reads, run_writes
from ledgerstore.cluster import LocalCluster, free_ports
from ledgerstore.errors import LedgerStoreError
from ledgerstore.runtime import install_fast_loop, tune_gc
from ledgerstore.stalls import PeakWindow, attribute, probe_loop_lag, watch_gc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ops_rows  # noqa: E402
import scale_rows  # noqa: E402
from redis_xadd import RedisBenchError, run_xadd  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PASSWORD = b"ledgerstore-bench"


@dataclasses.dataclass
class Row:
    """One line of the target table."""

    key: str
    name: str
    metric: str
    unit: str
    target: float
    #: ">=" (higher is better) or "<=" (lower is better)
    op: str
    measured: float | None = None
    passed: bool | None = None
    skipped: str | None = None
    load_before: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def settle(self, measured: float) -> None:
        self.measured = measured
        self.passed = measured >= self.target if self.op == ">=" else measured <= self.target

    def status(self) -> str:
        if self.skipped is not None:
            return "skipped"
        return "pass" if self.passed else "FAIL"


def _rows() -> dict[str, Row]:
    rows = [
        Row("write_100b_e3", "3 bookies, E=3 Qw=3 Qa=2, 100 B entries, one client", "entries/s", "entries/s",
            300_000, ">="),
        # the target is set by the run from the disk's measured ceiling (disk_ceiling_mb_per_s)
        Row("write_1kb_e3", "3 bookies, E=3 Qw=3 Qa=2, 1 KB entries, one client", "MB/s", "MB/s", 150, ">="),
        Row("write_100b_e1", "1 bookie, E=Qw=Qa=1, 100 B entries", "entries/s", "entries/s", 300_000, ">="),
        Row("latency_10k", "add latency at 10,000 entries/s (rate-limited), E=3 Qw=3 Qa=2, 100 B", "p99", "ms",
            10.0, "<="),
        Row("read_seq_100b", "sequential read of a closed ledger, 100 B (E=3 Qw=3 Qa=2)", "entries/s", "entries/s",
            600_000, ">="),
        Row("vs_redis", "Redis 7 XADD, appendonly yes, appendfsync always, pipelined, 100 B, same run",
            "ledgerstore / Redis entries/s", "x", 4.0, ">="),
        *(Row(*spec) for spec in ops_rows.ROWS),
        *(Row(*spec) for spec in scale_rows.ROWS),
        Row("log_dedup", "log appends with a producer and sequence vs without, same run, E=3 Qw=3 Qa=2, 100 B "
            "(one add per call and append_many; details: the producer table for 100,000 producers)",
            "sequenced / plain entries/s, the worse mode", "x", LOG_DEDUP_TARGET, ">="),
    ]
    return {r.key: r for r in rows}


def uptime() -> str:
    """The machine's load as ``uptime`` prints it (load averages over 1, 5 and 15 minutes)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def dirty_mb() -> float:
    """Page cache waiting to be written to disk (``Dirty`` + ``Writeback`` of /proc/meminfo), MB."""
    total = 0
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(("Dirty:", "Writeback:")):
                    total += int(line.split()[1])
    except OSError:
        return 0.0
    return total / 1024


def quiet_disk(limit_mb: float = 32.0, timeout: float = 60.0) -> dict[str, float]:
    """Write out the page cache (``sync``) and wait until less than ``limit_mb`` of it is dirty,
    so a run does not start while the disk still writes the previous run's files (whose write-back
    would land in the latency row). Returns what it found and how long it waited."""
    before = dirty_mb()
    t0 = time.perf_counter()
    os.sync()
    while dirty_mb() >= limit_mb and time.perf_counter() - t0 < timeout:
        time.sleep(0.2)
    return {"dirty_mb_before": round(before, 1), "dirty_mb_after": round(dirty_mb(), 1),
            "waited_s": round(time.perf_counter() - t0, 2)}


#: a disk is settled once every probe fdatasync of this many seconds took at most SETTLED_MS
SETTLED_FOR_S = 3.0
#: the slowest probe fdatasync of a settled disk (this one's take 0.3-1.2 ms when nothing else
#: writes; a write-back burst makes them take 50-900 ms)
SETTLED_MS = 10.0


def settled_disk(directory: Path, timeout: float = 180.0, for_s: float = SETTLED_FOR_S) -> dict[str, float]:
    """:func:`quiet_disk`, then wait until the disk answers an fdatasync promptly again: a 4 KiB
    append + fdatasync in ``directory`` every 100 ms until those of the last ``for_s`` seconds
    each took at most :data:`SETTLED_MS`. The page cache's dirty
    bytes do not show every write still to come: the bookies' own checkpoint of data just
    written (entry logs and index flushed and fsynced), or a virtual disk still writing out what
    its host cached, stall every fsync on the machine for hundreds of milliseconds after
    ``sync`` returned. A writer's baseline, or the window a row measures, starts after them.
    Returns how long it waited and the slowest probe of the settled seconds."""
    t0 = time.perf_counter()
    quiet = quiet_disk()
    path = directory / "settle-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    block = os.urandom(4096)
    recent: list[tuple[float, float]] = []
    worst = 0.0
    try:
        while True:
            os.write(fd, block)
            t = time.perf_counter()
            os.fdatasync(fd)
            now = time.perf_counter()
            ms = (now - t) * 1000
            worst = max(worst, ms)
            recent = [(at, x) for at, x in recent if now - at <= for_s] + [(now, ms)]
            settled = now - t0 >= for_s and recent[0][0] <= now - for_s + 0.2 \
                and max(x for _, x in recent) <= SETTLED_MS
            if settled or now - t0 >= timeout:
                break
            time.sleep(0.1)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"waited_s": round(time.perf_counter() - t0, 2), "settled": settled,
            "slowest_probe_ms_while_waiting": round(worst, 1),
            "slowest_probe_ms_settled": round(max(x for _, x in recent), 2),
            "dirty_mb_before": quiet["dirty_mb_before"]}


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MB (10^6 bytes), from /proc."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    raise LedgerStoreError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU use of the client (this process) and each bookie over one row, as % of one core:
    shows which process saturates first."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.pids = {"client": os.getpid()} | {f"bookie{i}": p.pid for i, p in sorted(cluster.procs.items())}
        self.t0 = time.perf_counter()
        self.c0 = {k: cpu_seconds(p) for k, p in self.pids.items()}

    def percent(self) -> dict[str, float]:
        """Each process's CPU since the meter was made, as % of one core; a process gone since
        (a bookie killed by the row) is left out."""
        wall = time.perf_counter() - self.t0
        out: dict[str, float] = {}
        for k, p in self.pids.items():
            try:
                out[k] = round(100 * (cpu_seconds(p) - self.c0[k]) / wall, 1)
            except OSError:
                continue
        return out


class MachineCpu:
    """The share of the machine's CPU time that was busy (anything but idle and I/O wait) since
    the meter was made, over every core, from ``/proc/stat``: near 1.0, the cores were the limit
    whatever ran on them."""

    def __init__(self) -> None:
        self.t0 = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            # cpu user nice system idle iowait irq softirq steal ...
            vals = [int(v) for v in fh.readline().split()[1:9]]
        return sum(vals), vals[3] + vals[4]

    def busy(self) -> float:
        total, idle = self._read()
        dt = total - self.t0[0]
        return round(1 - (idle - self.t0[1]) / dt, 3) if dt > 0 else 0.0


def _slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of (entries, MB) points, in MB per million entries."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return round(sum((x - mx) * (y - my) for x, y in points) / sxx * 1e6, 2)


# --- workloads not in ledgerstore.bench -----------------------------------------------------------

def with_admin_http(cluster: LocalCluster) -> dict[str, str]:
    """Give every bookie of ``cluster`` (not started yet) an admin HTTP port; returns the URL of
    each one's ``/api/v1/bookie/stalls`` by name (``bookie0``, ...)."""
    cluster.write_configs()
    urls = {}
    for i, port in enumerate(free_ports(cluster.n)):
        with open(cluster.config_path(i), "a") as fh:  # the file's last table is [bookie]
            fh.write(f"http_port = {port}\n")
        urls[f"bookie{i}"] = f"http://127.0.0.1:{port}/api/v1/bookie/stalls"
    return urls


def read_peaks(urls: dict[str, str]) -> dict[str, dict[str, dict[int, float]]]:
    """Each bookie's per-second peaks (``GET /api/v1/bookie/stalls``), by bookie name."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name, url in urls.items():
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                data = json.loads(resp.read())
        except OSError as exc:
            print(f"could not read the stall peaks of {name} ({url}): {exc}", file=sys.stderr)
            continue
        out[name] = {comp: {int(sec): v for sec, v in pairs} for comp, pairs in data["peaks"].items()}
    return out


def stall_summary(worst_ms: list[float], first_second: int, windows: dict[str, dict[str, dict[int, float]]],
                  top: int = 5, runnable: dict[int, int] | None = None) -> dict[str, Any]:
    """The worst seconds with what each process was doing then, and every component's peak over
    the whole measured run."""
    last = first_second + len(worst_ms)
    overall: dict[str, float] = {}
    for proc, comps in windows.items():
        for comp, by_sec in comps.items():
            vals = [v for sec, v in by_sec.items() if first_second - 1 <= sec < last]
            if vals:
                overall[f"{proc}.{comp}"] = round(max(vals) * 1000, 1)
    worst = attribute(worst_ms, first_second, windows, top=top)
    if runnable:
        for w in worst:
            sec = first_second + w["second"]
            w["runnable"] = max(runnable.get(sec, 0), runnable.get(sec - 1, 0))
    return {"worst_seconds": worst,
            "run_peaks_ms": dict(sorted(overall.items(), key=lambda kv: -kv[1]))}


def procs_running() -> int:
    """Threads of the whole machine running or waiting for a CPU now (``/proc/stat``)."""
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return 0


class DiskProbe:
    """A thread that appends 4 KiB to a file and fdatasyncs it every ``interval`` seconds, and
    records each fdatasync as ``disk_probe``: when it spikes together with the bookies' journal
    fsyncs, the disk itself (or another process's I/O) was slow, not the bookies. Each tick also
    samples how many threads of the machine wanted a CPU (``runnable``, the most per second): a
    loop that was late while many more threads than cores were runnable was waiting for a core."""

    def __init__(self, directory: Path, window: PeakWindow, interval: float = 0.02) -> None:
        self.path = directory / "disk-probe"
        self.window = window
        self.interval = interval
        self.runnable: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-probe", daemon=True)
        # sampled on a thread of its own: an fdatasync that blocks for seconds must not leave
        # those seconds without a count
        self._sampler = threading.Thread(target=self._sample, name="runnable-sampler", daemon=True)

    def __enter__(self) -> DiskProbe:
        self._thread.start()
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sampler.join()
        self.path.unlink(missing_ok=True)

    def _sample(self) -> None:
        while True:
            sec = int(time.time())
            self.runnable[sec] = max(self.runnable.get(sec, 0), procs_running())
            if self._stop.wait(self.interval):
                return

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        block = os.urandom(4096)
        try:
            while not self._stop.wait(self.interval):
                os.write(fd, block)
                t0 = time.perf_counter()
                os.fdatasync(fd)
                self.window.observe("disk_probe", time.perf_counter() - t0)
        finally:
            os.close(fd)


async def rate_limited_adds(client: Client, rate: float, duration: float, entry_size: int, ensemble: int,
                            write_quorum: int, ack_quorum: int, warmup: float = 0.0,
                            stall_urls: dict[str, str] | None = None, probe_dir: Path | None = None,
                            keep_ledger: bool = False) -> dict[str, Any]:
    """Append ``rate`` entries per second for ``warmup + duration`` seconds on a fixed schedule;
    each add's latency runs from its scheduled time to its acknowledgement. Adds due during the
    warm-up (connections opening, first ledger writes) run on the same schedule but are not
    recorded.

    The worst latency of each wall-clock second is kept; with ``stall_urls`` (each bookie's
    ``/api/v1/bookie/stalls``) the result also says, for the worst seconds, what the bookies and
    this client (event-loop lag and GC pauses, probed during the run) were doing then; with
    ``probe_dir`` (a directory on the bookies' disk) a :class:`DiskProbe` runs meanwhile. The
    ledger written is deleted at the end, or with ``keep_ledger`` closed and kept (its id in
    ``ledger_id``)."""
    with contextlib.ExitStack() as stack:
        probe = PeakWindow()
        disk = stack.enter_context(DiskProbe(probe_dir, probe)) if probe_dir is not None else None
        result = await _rate_limited_adds(client, rate, duration, entry_size, ensemble, write_quorum, ack_quorum,
                                          warmup, stall_urls, probe, disk.runnable if disk else None, keep_ledger)
    return result


async def _rate_limited_adds(client: Client, rate: float, duration: float, entry_size: int, ensemble: int,
                             write_quorum: int, ack_quorum: int, warmup: float, stall_urls: dict[str, str] | None,
                             probe: PeakWindow, runnable: dict[int, int] | None, keep_ledger: bool = False
                             ) -> dict[str, Any]:
    lh = await client.create_ledger(ensemble, write_quorum, ack_quorum, password=PASSWORD)
    client_peaks = PeakWindow()
    lag_probe = asyncio.get_running_loop().create_task(probe_loop_lag(client_peaks))
    unwatch_gc = watch_gc(client_peaks)
    payload = os.urandom(entry_size)
    rec = LatencyRecorder()
    errors: list[BaseException] = []
    warm = int(rate * warmup)
    total = warm + max(1, int(rate * duration))
    # Completion is counted in the callbacks: gathering the futures at the end would stall the
    # loop for a moment and inflate the latency of the last adds.
    acked = [0]
    all_acked = asyncio.Event()
    start = time.perf_counter()
    measure_from = start + warmup
    #: worst latency of the adds due in each wall-clock second (from the one measuring starts
    #: in): tells stalls from a uniformly slow path, and lines up with the bookies' peaks
    to_wall = time.time() - start
    first_second = int(measure_from + to_wall)
    worst = [0.0] * (int(duration) + 3)

    def done(due: float, fut: asyncio.Future[int]) -> None:
        now = time.perf_counter()
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            errors.append(exc)
        elif due >= measure_from:
            rec.record(now - due)
            sec = int(due + to_wall) - first_second
            worst[sec] = max(worst[sec], now - due)
        acked[0] += 1
        if acked[0] == total:
            all_acked.set()

    issued = 0
    max_lag = 0.0
    while issued < total:
        now = time.perf_counter()
        due_n = min(total, int((now - start) * rate) + 1)
        max_lag = max(max_lag, now - (start + issued / rate))
        while issued < due_n:
            fut = lh.append_async(payload)
            fut.add_done_callback(functools.partial(done, start + issued / rate))
            issued += 1
        # at least a millisecond: shorter sleeps return at once on the event loops, and spinning
        # takes the CPU the bookies need; adds due meanwhile go out together (latency counts from due)
        await asyncio.sleep(max(0.001, start + issued / rate - time.perf_counter()))
    issue_seconds = time.perf_counter() - start
    await all_acked.wait()
    lag_probe.cancel()
    unwatch_gc()
    await lh.close()
    if not keep_ledger:
        await client.delete_ledger(lh.ledger_id)
    last_second = int(start + issue_seconds + to_wall)
    worst_ms = [round(w * 1000, 1) for w in worst[:max(1, last_second - first_second + 1)]]
    windows = {"client": client_peaks.snapshot(first_second - 1), "machine": probe.snapshot(first_second - 1)}
    if stall_urls:
        windows |= await asyncio.to_thread(read_peaks, stall_urls)
    return {
        "ledger_id": lh.ledger_id, "rate_target": rate, "entries": issued - warm, "warmup_entries": warm,
        "issue_seconds": round(issue_seconds, 3),
        "rate_achieved": round(issued / issue_seconds, 1) if issue_seconds else 0.0,
        "max_schedule_lag_ms": round(max_lag * 1000, 3), "errors": len(errors),
        "first_error": repr(errors[0]) if errors else None, "latency_ms": rec.summary_ms(),
        "worst_ms_per_second": worst_ms,
        "stalls": stall_summary(worst_ms, first_second, windows, runnable=runnable),
    }


async def client_rss_with_outstanding(client: Client, cluster: LocalCluster, outstanding: int,
                                      entry_size: int) -> dict[str, Any]:
    """Client memory with ``outstanding`` adds in flight: the bookies are paused (SIGSTOP) while
    the adds are issued and sent, so none can be acknowledged, then resumed (SIGCONT)."""
    lh = await client.create_ledger(3, 3, 2, password=PASSWORD)
    payload = os.urandom(entry_size)
    await asyncio.gather(*(lh.append_async(payload) for _ in range(1000)))  # connections up, buffers sized
    gc.collect()
    pid = os.getpid()
    before = rss_mb(pid)
    pids = [p.pid for p in cluster.procs.values()]
    tracemalloc.start()
    base_traced = tracemalloc.get_traced_memory()[0]
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        futs = [lh.append_async(payload) for _ in range(outstanding)]
        await asyncio.sleep(0.5)  # let the batches be encoded and written to the sockets
        in_flight = sum(not f.done() for f in futs)
        traced = tracemalloc.get_traced_memory()[0] - base_traced
        during = rss_mb(pid)
    finally:
        tracemalloc.stop()
        for p in pids:
            os.kill(p, signal.SIGCONT)
    await asyncio.gather(*futs)
    await lh.close()
    await client.delete_ledger(lh.ledger_id)
    return {
        "outstanding": in_flight, "entry_size": entry_size, "rss_before_mb": round(before, 1),
        "rss_with_outstanding_mb": round(during, 1), "rss_delta_mb": round(during - before, 1),
        "python_heap_delta_mb": round(traced / 1e6, 2),
        "python_heap_bytes_per_add": round(traced / max(in_flight, 1)),
    }


async def bookie_rss_while_writing(client: Client, pid: int, entries: int, already: int, batch: int = 1) -> dict[str, Any]:
    """Write ``entries`` 100 B entries (E=Qw=Qa=1) and sample the bookie's RSS as they are
    acknowledged; ``already`` is how many entries the bookie stored before."""
    samples: list[tuple[int, float]] = []
    last = [-1]
    step = max(1, entries // 20)

    def tick(_elapsed: float, done: int) -> None:
        if done // step != last[0]:
            last[0] = done // step
            samples.append((already + done, round(rss_mb(pid), 1)))

    samples.append((already, round(rss_mb(pid), 1)))
    res = await run_writes(client, WriteOptions(ensemble=1, write_quorum=1, ack_quorum=1, entry_size=100,
                                                count=entries, keep_ledgers=True, batch=batch), tick)
    samples.append((already + res.entries, round(rss_mb(pid), 1)))
    return {
        "entries_written_by_this_run": res.entries, "entries_on_bookie": already + res.entries,
        "entries_per_s": res.entries_per_s, "rss_mb_start": samples[0][1], "rss_mb_end": samples[-1][1],
        "slope_mb_per_million_entries": _slope(samples[1:] if len(samples) > 3 else samples),
        "samples": samples, "ledger_ids": res.ledger_ids,
    }


# --- profiles -------------------------------------------------------------------------------------

def _pyspy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def start_profile(pid: int, out: Path, seconds: float, rate: int = 100) -> subprocess.Popen[bytes]:
    """py-spy record of ``pid`` for ``seconds`` into ``out`` (raw collapsed stacks)."""
    exe = _pyspy()
    if exe is None:
        raise LedgerStoreError("py-spy is not installed: pip install py-spy")
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(rate),
                             "--format", "raw", "--nonblocking", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def top_self_time(raw: Path, n: int = 15) -> dict[str, Any]:
    """Top ``n`` functions by self time (leaf frames) of a py-spy raw profile."""
    leaf: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frame = stack.rsplit(";", 1)[-1]
        # "func (path/to/file.py:123)" -> "func (file.py)": self time per function, not per line
        m = re.match(r"(.*) \((.*?):\d+\)$", frame)
        name = f"{m.group(1)} ({m.group(2).rsplit('/', 1)[-1]})" if m else frame
        leaf[name] += int(count)
        total += int(count)
    return {"samples": total,
            "top": [{"function": f, "samples": c, "percent": round(100 * c / total, 1)} for f, c in leaf.most_common(n)]}


async def profiled(work: Callable[[], Awaitable[Any]], targets: dict[str, int], out_dir: Path, tag: str,
                   seconds: float) -> dict[str, Any]:
    """Run ``work`` while py-spy records each of ``targets`` (name -> pid) for ``seconds``."""
    procs = {name: (start_profile(pid, out_dir / f"{name}-{tag}.txt", seconds), out_dir / f"{name}-{tag}.txt")
             for name, pid in targets.items()}
    await asyncio.sleep(0.3)  # py-spy attaches before the work starts
    await work()
    result: dict[str, Any] = {}
    for name, (proc, path) in procs.items():
        _, err = await asyncio.get_running_loop().run_in_executor(None, proc.communicate)
        if proc.returncode != 0 or not path.exists():
            result[name] = {"error": err.decode(errors="replace")[-500:]}
            continue
        summary = top_self_time(path)
        summary["file"] = str(path)
        # py-spy drops idle samples, so samples over rate x seconds is the CPU-busy share
        # (summed over threads: a bookie's journal thread can add to its event loop's)
        summary["busy_percent"] = round(100 * summary["samples"] / (100 * seconds), 1)
        result[name] = summary
    return result


async def _read_for(client: Client, ledger_id: int, seconds: float, batch: int = 1000) -> None:
    handle = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
    last = handle.last_add_confirmed
    end = time.perf_counter() + seconds
    first = 0
    while time.perf_counter() < end:
        hi = min(last, first + batch - 1)
        await handle.read(first, hi)
        first = 0 if hi >= last else hi + 1


# --- the run --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Plan:
    """Sizes of one run (``--tiny`` shrinks everything to check the output's shape)."""

    duration: float | None
    count: int | None
    warmup: float
    rate: float
    rate_duration: float
    outstanding: int
    memory_entries: int
    redis_pipeline: int
    profile_dir: Path | None
    profile_seconds: float
    storage: str
    #: entries per append call in the throughput rows (1: append_async per entry)
    batch: int = 100
    #: keys of the rows to run (empty: every row); rows they need run too (``read_seq_100b`` and
    #: ``vs_redis`` read or compare with ``write_100b_e3``)
    only: tuple[str, ...] = ()
    #: ``--tiny``: the rows that size their own data (``ops_rows.py``) shrink it too
    tiny: bool = False
    #: MiB of data the operations rows (``ops_rows.py``) write before they measure
    ops_mb: int = 2048

    def wants(self, *keys: str) -> bool:
        """Whether any of the rows ``keys`` is to be run."""
        return not self.only or any(k in self.only for k in keys)


#: the log_dedup row's target: sequenced appends cost at most 10% (plain / sequenced <= 1.1)
LOG_DEDUP_TARGET = round(1 / 1.1, 3)
#: entries per measured run of the log_dedup row with one add per call (``--tiny``: the plan's count)
LOG_DEDUP_ENTRIES = 400_000
#: entries per measured run of the log_dedup row with ``append_many`` (3 s or so, as the one-add runs)
LOG_DEDUP_ENTRIES_MANY = 1_000_000
#: runs of each mode, plain and sequenced alternating in a balanced order
LOG_DEDUP_ROUNDS = 4
#: adds in flight while the log_dedup row appends one per call
LOG_DEDUP_WINDOW = 5_000
#: producers in the table whose memory the log_dedup row reports
LOG_DEDUP_PRODUCERS = 100_000


async def _log_appends(client: Client, name: str, entries: int, batch: int, sequenced: bool) -> float:
    """Append ``entries`` 100 B entries to a fresh log (``batch`` per ``append_many``, or one
    ``append_async`` per entry when 1), with sequences when ``sequenced``; entries per second."""
    w = await client.open_log(name, ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD,
                              producer_id="bench" if sequenced else None)
    payload = b"x" * 100
    started = time.perf_counter()
    pending: list[asyncio.Future[Position]] = []
    if batch == 1:
        for i in range(entries):
            pending.append(w.append_async(payload, seq=i) if sequenced else w.append_async(payload))
            if len(pending) >= LOG_DEDUP_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
    else:
        payloads = [payload] * batch
        for first in range(0, entries, batch):
            pending.append(w.append_many_async(payloads, first_seq=first) if sequenced
                           else w.append_many_async(payloads))
            if len(pending) * batch >= LOG_DEDUP_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
    await asyncio.gather(*pending)
    seconds = time.perf_counter() - started
    await w.close()
    await client.delete_log(name, password=PASSWORD)
    return entries / seconds


def producer_table_memory(producers: int = LOG_DEDUP_PRODUCERS) -> dict[str, float]:
    """Bytes the leader's producer table holds for ``producers`` producers (ids like
    ``producer-000042``, each with a stored sequence and position), measured with tracemalloc."""
    from ledgerstore.client.log.producers import ProducerTable

    tracemalloc.start()
    try:
        table = ProducerTable()
        for i in range(producers):
            table.add(f"producer-{i:06d}").stored(1_000_000 + i, 1000 + i // 1000, i % 1000)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"producers": producers, "mb": round(used / 1e6, 1), "bytes_per_producer": round(used / producers)}


async def _log_dedup_row(cluster: LocalCluster, plan: Plan, rows: dict[str, Row]) -> None:
    """Sequenced against plain appends on a log, in each mode :data:`LOG_DEDUP_ROUNDS` runs of
    each, in the balanced order plain, sequenced, sequenced, plain, ... (so that neither always
    runs first, on the cleaner disk, or always right after the other's write-back), each run
    starting once the disk has written out the previous one. A mode's figure is the mean of its
    runs' rates: in this order a drift over the row (rates fall as the bookies' logs fill) weighs
    on both alike, where each mode's best run would favour the one that ran first. The client's
    CPU time per entry (this process: the writer's work) is reported beside it."""
    r = rows["log_dedup"]
    r.load_before = uptime()
    modes = {1: plan.count if plan.count is not None else LOG_DEDUP_ENTRIES,
             plan.batch: plan.count if plan.count is not None else LOG_DEDUP_ENTRIES_MANY}
    rates: dict[str, list[float]] = {}
    cpu_us: dict[str, list[float]] = {}
    waited = 0.0
    async with Client(metadata=cluster.metadata) as client:
        for round_ in range(LOG_DEDUP_ROUNDS):
            for batch, entries in modes.items():
                for sequenced in ((False, True) if round_ % 2 == 0 else (True, False)):
                    key = f"{'one_add_per_call' if batch == 1 else f'append_many_{batch}'}_" \
                          f"{'sequenced' if sequenced else 'plain'}"
                    waited += (await asyncio.to_thread(quiet_disk))["waited_s"]
                    cpu0 = time.process_time()
                    rate = await _log_appends(client, f"bench-dedup-{round_}-{key}", entries, batch, sequenced)
                    cpu_us.setdefault(key, []).append((time.process_time() - cpu0) / entries * 1e6)
                    rates.setdefault(key, []).append(rate)
    mean = {k: statistics.fmean(v) for k, v in rates.items()}
    costs, ratios, best_ratios, cpu_ratios = {}, {}, {}, {}
    for mode in ("one_add_per_call", f"append_many_{plan.batch}"):
        plain, seq = mean[f"{mode}_plain"], mean[f"{mode}_sequenced"]
        costs[mode] = round((plain / seq - 1) * 100, 1)
        ratios[mode] = round(seq / plain, 3)
        best_ratios[mode] = round(max(rates[f"{mode}_sequenced"]) / max(rates[f"{mode}_plain"]), 3)
        cpu_ratios[mode] = round(min(cpu_us[f"{mode}_sequenced"]) / min(cpu_us[f"{mode}_plain"]), 3)
    r.details = {"entries_per_run": {("one_add_per_call" if b == 1 else f"append_many_{b}"): n
                                     for b, n in modes.items()},
                 "rounds": LOG_DEDUP_ROUNDS, "quiet_disk_waited_s": round(waited, 1),
                 "entries_per_s": {k: [round(x) for x in v] for k, v in rates.items()},
                 "sequenced_over_plain": ratios, "cost_percent": costs,
                 "sequenced_over_plain_best_runs": best_ratios,
                 "client_cpu_us_per_entry": {k: [round(x, 3) for x in v] for k, v in cpu_us.items()},
                 "client_cpu_sequenced_over_plain_least": cpu_ratios,
                 "producer_table": producer_table_memory()}
    r.settle(min(ratios.values()))


def _write_opts(plan: Plan, **kw: Any) -> WriteOptions:
    return WriteOptions(duration=plan.duration, count=plan.count, warmup=plan.warmup, **({"batch": plan.batch} | kw))


async def _one_add_per_call(client: Client, cluster: LocalCluster, plan: Plan, **kw: Any) -> dict[str, Any]:
    """The same workload with ``append_async`` per entry (a future per add, awaited in issue
    order by one task of the application; BookKeeper's benchmark has a callback per add): a
    detail beside the row, which uses ``plan.batch``."""
    cpu = CpuMeter(cluster)
    w = await run_writes(client, _write_opts(plan, batch=1, **kw))
    if w.errors:
        raise LedgerStoreError(f"write benchmark failed: {w.first_error}")
    return _write_details(w) | {"cpu_percent": cpu.percent()}


async def _three_bookie_rows(cluster: LocalCluster, plan: Plan, rows: dict[str, Row], extra: dict[str, Any],
                             stall_urls: dict[str, str]) -> None:
    async with Client(metadata=cluster.metadata) as client:
        # The latency row runs first, on bookies that have not yet written gigabytes: on one disk
        # the kernel's write-back of the throughput rows' entry logs (and the checkpoint after
        # them) delays journal fsyncs by hundreds of milliseconds for a while (see performance.md)
        if plan.wants("latency_10k"):
            r = rows["latency_10k"]
            r.load_before = uptime()
            cpu = CpuMeter(cluster)
            lat = await rate_limited_adds(client, plan.rate, plan.rate_duration, 100, 3, 3, 2, warmup=plan.warmup,
                                          stall_urls=stall_urls, probe_dir=cluster.data_dir)
            r.details = lat | {"cpu_percent": cpu.percent()}
            if lat["errors"]:
                raise LedgerStoreError(f"rate-limited adds failed: {lat['first_error']}")
            r.settle(lat["latency_ms"]["p99"])
        if plan.wants("write_100b_e3", "read_seq_100b", "vs_redis"):
            await _throughput_and_read_rows(client, cluster, plan, rows, extra)


async def _throughput_and_read_rows(client: Client, cluster: LocalCluster, plan: Plan, rows: dict[str, Row],
                                    extra: dict[str, Any]) -> None:
    r = rows["write_100b_e3"]
    w = await _write_row(client, cluster, plan, r, "entries_per_s", ensemble=3, write_quorum=3, ack_quorum=2,
                         entry_size=100, keep_ledgers=True)
    ledger = w.ledger_ids[0]

    if plan.wants("read_seq_100b"):
        # right after the ledger was written, before the one-add-per-call detail: that detail's
        # write-back (and the collection of its deleted ledger) would otherwise run during the
        # reads; the disk first writes out what the row left in the page cache
        r = rows["read_seq_100b"]
        quiet = await asyncio.to_thread(quiet_disk)
        r.load_before = uptime()
        cpu = CpuMeter(cluster)
        rd = await run_reads(client, ReadOptions(ledger_id=ledger, password=PASSWORD, batch=READ_BATCH,
                                                 window=READ_WINDOW))
        r.details = {"cpu_percent": cpu.percent(), "entries": rd.entries, "seconds": rd.seconds,
                     "mb_per_s": rd.mb_per_s, "read_batch": READ_BATCH, "read_window": READ_WINDOW,
                     "ledger_entries": rd.entries, "batch_latency_ms": rd.batch_latency_ms, "quiet_disk": quiet}
        r.settle(rd.entries_per_s)

    if plan.batch > 1 and plan.wants("write_100b_e3"):
        rows["write_100b_e3"].details["one_add_per_call"] = await _one_add_per_call(
            client, cluster, plan, ensemble=3, write_quorum=3, ack_quorum=2, entry_size=100)

    if plan.profile_dir is not None:
        targets = {"client": os.getpid(), "bookie0": cluster.procs[0].pid}
        extra["profiles"] = {
            "writes": await profiled(
                lambda: run_writes(client, WriteOptions(ensemble=3, write_quorum=3, ack_quorum=2, entry_size=100,
                                                        duration=plan.profile_seconds + 0.5, batch=plan.batch)),
                targets, plan.profile_dir, "writes", plan.profile_seconds),
            "reads": await profiled(lambda: _read_for(client, ledger, plan.profile_seconds + 0.5),
                                    targets, plan.profile_dir, "reads", plan.profile_seconds),
        }
    await client.delete_ledger(ledger)


#: entries per READ_MULTI batch of the read row, and batches in flight: with 2 in flight the row
#: is bound by the batch round trip on two shared cores (window x batch / batch latency), not
#: by any process's CPU; 4 keeps every bookie busy, as a sequential reader's read-ahead would
READ_BATCH = 1000
READ_WINDOW = 2

#: bytes on disk per acknowledged byte of the 1 KB row: 3 replicas, each in the journal and the entry log
DISK_BYTES_PER_ACKED_BYTE = 6
#: the share of the disk's ceiling the 1 KB row must reach
DISK_CEILING_SHARE = 0.7


def disk_ceiling_mb_per_s(directory: Path, total_mb: int = 64, chunk_mb: int = 1) -> float:
    """The fsync'd sequential write rate of this disk: ``chunk_mb`` appends, each followed by
    fdatasync (as a journal group commit does), ``total_mb`` in all, in ``directory``."""
    path = directory / "disk-ceiling.probe"
    chunk = os.urandom(chunk_mb << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        for _ in range(total_mb // chunk_mb):
            os.write(fd, chunk)
            os.fdatasync(fd)
        return total_mb / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()


async def _one_kb_rows(cluster: LocalCluster, plan: Plan, rows: dict[str, Row], extra: dict[str, Any]) -> None:
    async with Client(metadata=cluster.metadata) as client:
        await _one_kb_row_and_client_memory(client, cluster, plan, rows, extra)


async def _one_kb_row_and_client_memory(client: Client, cluster: LocalCluster, plan: Plan, rows: dict[str, Row],
                                        extra: dict[str, Any]) -> None:
    r = rows["write_1kb_e3"]
    ceiling = await asyncio.to_thread(disk_ceiling_mb_per_s, cluster.data_dir, 8 if plan.count is not None else 64)
    r.target = round(DISK_CEILING_SHARE * ceiling / DISK_BYTES_PER_ACKED_BYTE, 2)
    extra["disk_ceiling"] = {"fsynced_sequential_mb_per_s": round(ceiling, 1),
                             "disk_bytes_per_acked_byte": DISK_BYTES_PER_ACKED_BYTE,
                             "row_ceiling_mb_per_s": round(ceiling / DISK_BYTES_PER_ACKED_BYTE, 2),
                             "target_share": DISK_CEILING_SHARE}
    await _write_row(client, cluster, plan, rows["write_1kb_e3"], "mb_per_s", ensemble=3, write_quorum=3,
                     ack_quorum=2, entry_size=1024)

    extra["client_memory"] = await client_rss_with_outstanding(client, cluster, plan.outstanding, 100)


async def _one_bookie_rows(cluster: LocalCluster, plan: Plan, rows: dict[str, Row], extra: dict[str, Any]) -> None:
    pid = cluster.procs[0].pid
    rss_start = rss_mb(pid)
    async with Client(metadata=cluster.metadata) as client:
        r = rows["write_100b_e1"]
        w = await _write_row(client, cluster, plan, r, "entries_per_s", ensemble=1, write_quorum=1, ack_quorum=1,
                             entry_size=100, keep_ledgers=True)
        stored = w.entries + w.warmup_entries
        if plan.batch > 1:
            r.details["one_add_per_call"] = await _one_add_per_call(client, cluster, plan, ensemble=1, write_quorum=1,
                                                                    ack_quorum=1, entry_size=100)
        if plan.memory_entries:
            mem = await bookie_rss_while_writing(client, pid, plan.memory_entries, stored, plan.batch)
            mem["rss_mb_after_bookie_start"] = round(rss_start, 1)
            mem["load_before"] = uptime()
            extra["bookie_memory"] = mem


async def _write_row(client: Client, cluster: LocalCluster, plan: Plan, r: Row, measure: str, **kw: Any) -> Any:
    """Run one throughput row and settle it on ``measure`` (``entries_per_s`` or ``mb_per_s``)."""
    r.load_before = uptime()
    cpu = CpuMeter(cluster)
    w = await run_writes(client, _write_opts(plan, **kw))
    r.details = _write_details(w) | {"cpu_percent": cpu.percent()}
    if w.errors:
        raise LedgerStoreError(f"write benchmark failed: {w.first_error}")
    r.settle(getattr(w, measure))
    return w


def _write_details(w: Any) -> dict[str, Any]:
    return {"entries": w.entries, "seconds": w.seconds, "entries_per_s": w.entries_per_s, "mb_per_s": w.mb_per_s,
            "latency_ms": w.latency_ms, "warmup_entries": w.warmup_entries, "throttle": w.options["throttle"],
            "append_batch": w.options["batch"]}


def _redis_row(plan: Plan, rows: dict[str, Row]) -> None:
    r = rows["vs_redis"]
    r.load_before = uptime()
    try:
        red = run_xadd(100, plan.duration, plan.count, plan.redis_pipeline, plan.warmup)
    except (RedisBenchError, ImportError) as e:
        r.skipped = str(e)
    else:
        ours = rows["write_100b_e3"].measured or 0.0
        r.details = {"redis": red, "ledgerstore_entries_per_s": ours}
        r.settle(round(ours / red["entries_per_s"], 2) if red["entries_per_s"] else 0.0)


def run(plan: Plan) -> dict[str, Any]:
    """Run every row; returns the JSON-able result."""
    install_fast_loop()
    tune_gc()
    rows = _rows()
    extra: dict[str, Any] = {}
    started = datetime.datetime.now(datetime.UTC)
    needed = {"write_100b_e3"} if plan.wants("read_seq_100b", "vs_redis") else set()
    for r in rows.values():
        if not plan.wants(r.key) and r.key not in needed:
            r.skipped = "not run (--only)"
    extra["quiet_disk_before_run"] = quiet_disk()
    with tempfile.TemporaryDirectory(prefix="ledgerstore-perf-") as tmp:
        if plan.wants("latency_10k", "write_100b_e3", "read_seq_100b", "vs_redis"):
            cluster = LocalCluster(Path(tmp) / "three", bookies=3, port_base=None, storage=plan.storage)
            stall_urls = with_admin_http(cluster)
            try:
                cluster.start()
                asyncio.run(_three_bookie_rows(cluster, plan, rows, extra, stall_urls))
            finally:
                cluster.stop()
                shutil.rmtree(cluster.data_dir, ignore_errors=True)
        if plan.wants("write_1kb_e3"):
            # on fresh bookies and a quiet disk, as the rows before it: the 100 B rows leave
            # gigabytes for the kernel and the bookies to write back and collect, on the same disk
            # the row and its ceiling are measured on
            extra["quiet_disk_before_1kb"] = quiet_disk()
            cluster = LocalCluster(Path(tmp) / "three-1kb", bookies=3, port_base=None, storage=plan.storage)
            try:
                cluster.start()
                asyncio.run(_one_kb_rows(cluster, plan, rows, extra))
            finally:
                cluster.stop()
                shutil.rmtree(cluster.data_dir, ignore_errors=True)
        if plan.wants("log_dedup"):
            cluster = LocalCluster(Path(tmp) / "log-dedup", bookies=3, port_base=None, storage=plan.storage)
            try:
                cluster.start()
                asyncio.run(_log_dedup_row(cluster, plan, rows))
            finally:
                cluster.stop()
                shutil.rmtree(cluster.data_dir, ignore_errors=True)
        if plan.wants("write_100b_e1"):
            cluster = LocalCluster(Path(tmp) / "one", bookies=1, port_base=None, storage=plan.storage)
            try:
                cluster.start()
                asyncio.run(_one_bookie_rows(cluster, plan, rows, extra))
            finally:
                cluster.stop()
        if plan.wants(*scale_rows.KEYS):
            scale_rows.run(plan.tiny, plan.wants, rows, extra, Path(tmp), rss_mb, plan.storage)

        ops_rows.run_rows(sys.modules[__name__], plan, rows, Path(tmp))

    if plan.wants("vs_redis"):
        _redis_row(plan, rows)

    return {
        "started": started.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "uptime_at_end": uptime()},
        "plan": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(plan).items()},
        "rows": [dataclasses.asdict(r) | {"status": r.status()} for r in rows.values()],
        **extra,
    }


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result out of several runs of the same plan: every row's measured value becomes the
    median of the runs, with its spread (``min``, ``median``, ``max``, the per-run ``values`` and
    how many runs passed) beside it; a row passes only when every run passed. The per-run rows
    are kept under ``runs``; the memory and profile figures are the last run's."""
    if len(results) == 1:
        return results[0]
    last = results[-1]
    rows = []
    for i, row in enumerate(last["rows"]):
        per_run = [res["rows"][i] for res in results]
        values = [r["measured"] for r in per_run if r["measured"] is not None and not r["skipped"]]
        row = dict(row)
        if values:
            passed = sum(r["passed"] is True for r in per_run)
            row["spread"] = {"min": min(values), "median": statistics.median(values), "max": max(values),
                             "values": values, "passed_runs": passed, "runs": len(per_run)}
            row["measured"] = row["spread"]["median"]
            row["passed"] = passed == len(per_run)
            row["skipped"] = None
            row["status"] = "pass" if row["passed"] else "FAIL"
        rows.append(row)
    return last | {
        "started": results[0]["started"],
        "repeat": len(results),
        "rows": rows,
        "runs": [{"started": res["started"], "uptime_at_end": res["machine"]["uptime_at_end"],
                  "rows": res["rows"]} for res in results],
    }


# --- output ---------------------------------------------------------------------------------------

def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("ms", "x", "MB/s"):
        return f"{v:,.2f}"
    return f"{v:,.0f}"


def to_markdown(result: dict[str, Any]) -> str:
    """The Markdown report: the target table, then memory and profile figures when present."""
    repeat = result.get("repeat", 1)
    out = [f"# ledgerstore performance run, {result['started']}", "",
           f"{result['machine']['cpus']} CPUs, Python {result['machine']['python']}; "
           f"load at end: `{result['machine']['uptime_at_end']}`", ""]
    if repeat > 1:
        out += [f"{repeat} runs of every row; measured is the median, a row passes when every run passed.", "",
                "| Benchmark | Metric | Min / median / max | Target | Runs passing | Result |",
                "|---|---|---|---|---|---|"]
        for r in result["rows"]:
            sp = r.get("spread")
            if sp is None:
                out.append(f"| {r['name']} | {r['metric']} | skipped: {r['skipped']} | - | - | {r['status']} |")
                continue
            u = r["unit"]
            out.append(f"| {r['name']} | {r['metric']} | {_fmt(sp['min'], u)} / {_fmt(sp['median'], u)} / "
                       f"{_fmt(sp['max'], u)} {u} | {r['op']} {_fmt(r['target'], u)} {u} | "
                       f"{sp['passed_runs']} of {sp['runs']} | {r['status']} |")
        out += ["", "Per run:", "", "| Run | " + " | ".join(r["key"] for r in result["rows"]) + " | Load at end |",
                "|---" * (len(result["rows"]) + 2) + "|"]
        for n, run_ in enumerate(result["runs"], 1):
            cells = [_fmt(r["measured"], r["unit"]) if not r["skipped"] else "-" for r in run_["rows"]]
            load = run_["uptime_at_end"].rpartition("load average:")[2].strip()
            out.append(f"| {n} | " + " | ".join(cells) + f" | {load} |")
    else:
        out += ["| Benchmark | Metric | Measured | Target | Result | Load before (1/5/15 min) |",
                "|---|---|---|---|---|---|"]
        for r in result["rows"]:
            load = r["load_before"].rpartition("load average:")[2].strip() or "-"
            measured = f"skipped: {r['skipped']}" if r["skipped"] else f"{_fmt(r['measured'], r['unit'])} {r['unit']}"
            out.append(f"| {r['name']} | {r['metric']} | {measured} | {r['op']} {_fmt(r['target'], r['unit'])} "
                       f"{r['unit']} | {r['status']} | {load} |")
    out += _stall_lines(result)
    out += ["", "## Details", ""]
    for r in result["rows"]:
        d = r["details"]
        lat = d.get("latency_ms") or d.get("batch_latency_ms")
        bits = [f"{k} {d[k]:,}" if isinstance(d[k], int) else f"{k} {d[k]}"
                for k in ("entries", "seconds", "entries_per_s", "mb_per_s", "rate_achieved") if k in d]
        if lat:
            bits.append("latency ms " + " ".join(f"{k} {v}" for k, v in lat.items()))
        if "worst_ms_per_second" in d:
            bits.append(f"worst ms per second {d['worst_ms_per_second']}")
        if "cpu_percent" in d:
            bits.append("CPU % of a core " + " ".join(f"{k} {v}" for k, v in d["cpu_percent"].items()))
        if d.get("append_batch", 1) > 1:
            bits.append(f"{d['append_batch']} entries per append_many call")
        if "one_add_per_call" in d:
            one = d["one_add_per_call"]
            bits.append(f"with one append_async per entry instead: {one['entries_per_s']:,.0f} entries/s, latency ms "
                        f"p50 {one['latency_ms']['p50']} p99 {one['latency_ms']['p99']}, CPU % of a core "
                        + " ".join(f"{k} {v}" for k, v in one["cpu_percent"].items()))
        if "redis" in d:
            red = d["redis"]
            bits.append(f"Redis {red['redis_version']}: {red['entries_per_s']:,.0f} entries/s "
                        f"(pipeline {red['pipeline']}, {red['settings']})")
        if "summary" in d:  # rows that say in one line what their details hold
            bits.append(d["summary"])
        out.append(f"- **{r['key']}**: " + "; ".join(bits))
    if "client_memory" in result:
        c = result["client_memory"]
        out += ["", "## Memory", "",
                f"- client with {c['outstanding']:,} adds outstanding ({c['entry_size']} B): RSS "
                f"{c['rss_before_mb']} MB -> {c['rss_with_outstanding_mb']} MB (+{c['rss_delta_mb']} MB); Python heap "
                f"+{c['python_heap_delta_mb']} MB, {c['python_heap_bytes_per_add']:,} B per outstanding add"]
    if "bookie_memory" in result:
        b = result["bookie_memory"]
        if "client_memory" not in result:
            out += ["", "## Memory", ""]
        out.append(f"- bookie (entrylog) after {b['entries_on_bookie']:,} entries of 100 B: RSS {b['rss_mb_end']} MB "
                   f"(just started: {b['rss_mb_after_bookie_start']} MB; slope {b['slope_mb_per_million_entries']} "
                   f"MB per million entries)")
    for phase, targets in result.get("profiles", {}).items():
        for name, prof in targets.items():
            out += ["", f"## Profile: {name} during {phase}", ""]
            if "error" in prof:
                out.append(f"py-spy failed: {prof['error']}")
                continue
            out += [f"{prof['samples']:,} non-idle samples at 100 Hz: busy {prof['busy_percent']}% of the time "
                    f"(all threads); `{prof['file']}`", "",
                    "| Self % | Function |", "|---|---|"]
            out += [f"| {t['percent']} | `{t['function']}` |" for t in prof["top"]]
    return "\n".join(out) + "\n"


def _stall_lines(result: dict[str, Any]) -> list[str]:
    """Markdown: the worst seconds of each run's latency row and what took them."""
    runs = result.get("runs") or [{"rows": result["rows"]}]
    out: list[str] = []
    for n, run_ in enumerate(runs, 1):
        lat = next((r for r in run_["rows"] if r["key"] == "latency_10k"), None)
        stalls = lat["details"].get("stalls") if lat and not lat["skipped"] else None
        if not stalls:
            continue
        if not out:
            out += ["", "## Latency row: the worst seconds and what the processes were doing", "",
                    "Peaks in that second and the one before, in ms, of each process's components "
                    "(`loop_lag`: event loop late; `journal_queue`/`journal_fsync`: the journal; `checkpoint`, "
                    "`engine_flush`, `entrylog_write`, `writeback_sync`: storage; `gc_genN`: garbage-collector pauses; "
                    "`metadata_lookup`, `metadata_register`, `ledger_gc`: metadata operations; "
                    "`machine.disk_probe`: a 4 KiB append + fdatasync every 20 ms by the benchmark, on the same disk; "
                    "runnable: the most threads of the machine running or waiting for a CPU then, from /proc/stat).",
                    ""]
        d = lat["details"]
        out.append(f"- run {n} (p99 {d['latency_ms']['p99']} ms, p99.9 {d['latency_ms']['p99.9']} ms): "
                   + "; ".join(f"second {w['second']}: {w['worst_add_ms']} ms"
                               + (f" ({w['runnable']} runnable)" if "runnable" in w else "") + " <- "
                               + (", ".join(f"{k} {v}" for k, v in w["peaks_ms"].items()) or "nothing above 1 ms")
                               for w in stalls["worst_seconds"][:3]))
    return out


def print_stalls(result: dict[str, Any]) -> None:
    """The latency row's stall attribution on stdout."""
    for line in _stall_lines(result)[4:]:
        print(line.removeprefix("- "))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json-out", type=Path, default=RESULTS / "latest.json")
    ap.add_argument("--md-out", type=Path, default=RESULTS / "latest.md")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per throughput row")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each throughput row")
    ap.add_argument("--rate", type=float, default=10_000, help="adds per second of the latency row")
    ap.add_argument("--rate-duration", type=float, default=10.0, help="seconds of the latency row")
    ap.add_argument("--outstanding", type=int, default=10_000, help="adds outstanding for the client RSS figure")
    ap.add_argument("--memory-entries", type=int, default=1_000_000,
                    help="entries written to one bookie for its RSS figure (0: skip)")
    ap.add_argument("--redis-pipeline", type=int, default=1000, help="XADDs per Redis round trip")
    ap.add_argument("--profile-dir", type=Path, default=None, help="record py-spy profiles into this directory")
    ap.add_argument("--profile-seconds", type=float, default=8.0)
    ap.add_argument("--storage", default="entrylog", help="storage engine of the bookies")
    ap.add_argument("--batch", type=int, default=100,
                    help="entries per append call in the throughput rows (append_many); 1 = append_async per entry. "
                         "With N > 1 the 100 B rows also run once with one add per call, as a detail")
    ap.add_argument("--ops-mb", type=int, default=2048,
                    help="MiB written by the operations rows (catchup_isolation, recovery, gc_reclaim) before they "
                         "measure")
    ap.add_argument("--tiny", action="store_true",
                    help="a few thousand entries per row: checks that everything runs, measures nothing")
    ap.add_argument("--fail-on-miss", action="store_true", help="exit with status 1 when a row misses its target")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run everything N times (fresh bookies each time) and report each row's spread "
                         "(min, median, max; per-run values in the JSON)")
    ap.add_argument("--only", action="append", default=[], metavar="ROW",
                    help=f"run only this row (repeatable; 'latency' means latency_10k): {', '.join(_rows())}")
    args = ap.parse_args(argv)
    only = tuple("latency_10k" if k == "latency" else k for k in args.only)
    unknown = sorted(set(only) - set(_rows()))
    if unknown or args.repeat < 1:
        ap.error(f"unknown row(s) {unknown}" if unknown else "--repeat must be at least 1")
    plan = Plan(duration=args.duration, count=None, warmup=args.warmup, rate=args.rate, rate_duration=args.rate_duration,
                outstanding=args.outstanding, memory_entries=args.memory_entries, redis_pipeline=args.redis_pipeline,
                profile_dir=args.profile_dir, profile_seconds=args.profile_seconds, storage=args.storage,
                batch=args.batch, only=only, ops_mb=args.ops_mb)
    if args.tiny:
        plan = dataclasses.replace(plan, duration=None, count=2000, warmup=0.0, rate_duration=0.5, tiny=True, ops_mb=min(args.ops_mb, 16),
                                   outstanding=min(args.outstanding, 2000), memory_entries=min(args.memory_entries, 5000),
                                   redis_pipeline=min(args.redis_pipeline, 200),
                                   profile_seconds=min(args.profile_seconds, 1.0))
    if plan.profile_dir is not None:
        plan.profile_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for n in range(args.repeat):
        results.append(run(plan))
        if args.repeat > 1:
            lat = next(r for r in results[-1]["rows"] if r["key"] == "latency_10k")
            print(f"run {n + 1} of {args.repeat} done: " + ", ".join(
                f"{r['key']} {_fmt(r['measured'], r['unit'])}" for r in results[-1]["rows"] if not r["skipped"])
                  + ("" if lat["skipped"] else f" (latency p99.9 {lat['details']['latency_ms']['p99.9']} ms)"),
                  flush=True)
    result = combine(results)
    for path, text in ((args.json_out, json.dumps(result, indent=2) + "\n"), (args.md_out, to_markdown(result))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for r in result["rows"]:
        value = r["skipped"] or f"{_fmt(r['measured'], r['unit'])} {r['unit']}"
        sp = r.get("spread")
        if sp:
            value = (f"min {_fmt(sp['min'], r['unit'])} median {_fmt(sp['median'], r['unit'])} max "
                     f"{_fmt(sp['max'], r['unit'])} {r['unit']}, {sp['passed_runs']} of {sp['runs']} runs pass")
        print(f"{r['status']:>7}  {r['name']}: {value} (target {r['op']} {_fmt(r['target'], r['unit'])})")
    print_stalls(result)
    print(f"wrote {args.json_out} and {args.md_out}")
    return 1 if args.fail_on_miss and any(r["passed"] is False for r in result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
