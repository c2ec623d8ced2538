"""The operations rows of ``run_all.py``: what an operator's day does to writers.

- ``catchup_isolation``: a writer at 10,000 entries/s while another process reads a ledger whose
  entries are not in the page cache (evicted with ``posix_fadvise(DONTNEED)`` after the bookies
  checkpointed them): the writer's p99 beside its solo p99 of the same run, and the catch-up
  read MB/s beside the disk's read ceiling measured in the same run (a sequential read of an
  evicted file of its own, 1 MiB at a time, on the bookies' disk).
- ``recovery``: 5 bookies holding ledgers (E3 Qw2 Qa2), a writer at 5,000 entries/s on a live
  ledger, one bookie killed with SIGKILL while every bookie runs auto-recovery: ledgers
  re-replicated per minute, MB/s, the time until nothing is under-replicated, and the writer's
  p99 during recovery beside its p99 before.
- ``gc_reclaim``: ledgers written interleaved, then 90% of them deleted while a writer goes on:
  the time until the bookies' disk usage is back within 20% of the live data (no restart), and
  the writer's p99 meanwhile beside its p99 before.

``run_all.py`` declares the rows (:data:`ROWS`) and calls :func:`run_rows`, handing itself over
as ``kit`` (its cluster, latency and disk helpers), so this module does not import it.
``python benchmarks/ops_rows.py read METADATA LEDGER_ID`` is the catch-up reader's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from ledgerstore.aio import Client
from ledgerstore.bench import WriteOptions, run_writes
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import LedgerStoreError
from ledgerstore.proto.digest import ENTRY_HEADER, Crc32cDigest
from ledgerstore.runtime import install_fast_loop, tune_gc

#: (key, name, metric, unit, target, op) of each row, in the order they run
ROWS = [
    ("catchup_isolation", "writer at 10,000 entries/s beside a cold catch-up read, E=3 Qw=3 Qa=2, 100 B",
     "writer p99 / solo p99", "x", 2.0, "<="),
    ("recovery", "5 bookies, E=3 Qw=2 Qa=2, one killed (SIGKILL), auto-recovery, writer at 5,000 entries/s",
     "ledgers re-replicated per minute", "ledgers/min", 1000.0, ">="),
    ("gc_reclaim", "90% of interleaved ledgers deleted while writing goes on: disk usage over live data",
     "disk used / live data after reclaim", "x", 1.2, "<="),
]

PASSWORD = b"ledgerstore-bench"
_MiB = 1024 * 1024


# --- the disk -----------------------------------------------------------------------------------

def evict(paths: list[Path]) -> int:
    """Drop the page cache of every file under ``paths`` (``posix_fadvise(DONTNEED)`` after an
    fdatasync, so dirty pages go too). Returns the bytes of the files evicted."""
    total = 0
    for top in paths:
        for f in (p for p in top.rglob("*") if p.is_file()):
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def write_ceiling_file(directory: Path, size: int) -> Path:
    """A file of ``size`` random bytes in ``directory``, fsync'd and evicted, for
    :func:`disk_read_ceiling`. Written before the data it is compared with, so that no cache
    below this machine's (a virtual disk's host) favours it over that data."""
    path = directory / "read-ceiling"
    block = os.urandom(_MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(max(1, size // _MiB)):
            os.write(fd, block)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def disk_read_ceiling(path: Path) -> dict[str, Any]:
    """The disk's sequential read rate: evict ``path`` and read it 1 MiB at a time (as
    ``dd bs=1M`` would), then remove it; MB/s (10^6 bytes)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        n = 0
        while chunk := os.read(fd, _MiB):
            n += len(chunk)
        seconds = time.perf_counter() - t0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {"bytes": n, "seconds": round(seconds, 3), "mb_per_s": round(n / 1e6 / seconds, 1)}


def du(paths: list[Path]) -> int:
    """Bytes allocated on disk by every file under ``paths`` (``st_blocks``, as ``du`` counts)."""
    return sum(f.stat().st_blocks * 512 for top in paths for f in top.rglob("*") if f.is_file())


def ledger_dirs(cluster: LocalCluster) -> list[Path]:
    """The ledger directories of every bookie of ``cluster`` (``LocalCluster``'s layout)."""
    return [cluster.config_path(i).parent / "ledgers" for i in range(cluster.n)]


@contextlib.contextmanager
def cluster_of(kit: ModuleType, tmp: Path, name: str, bookies: int, extra: str = "",
               admin_http: bool = True) -> Iterator[tuple[LocalCluster, dict[str, str]]]:
    """A started cluster (with admin HTTP ports for the stall attribution), stopped and removed
    afterwards."""
    cluster = LocalCluster(tmp / name, bookies=bookies, port_base=None, extra_bookie_config=extra)
    urls = kit.with_admin_http(cluster) if admin_http else {}
    try:
        cluster.start()
        yield cluster, urls
    finally:
        cluster.stop()
        shutil.rmtree(cluster.data_dir, ignore_errors=True)


def settle(row: Any, measured: float, **other_targets: bool) -> None:
    """Settle ``row`` on its measured value; it passes only if ``other_targets`` (the row's
    further targets, by name: met or not, kept in ``details["other_targets"]``) are met too."""
    row.settle(measured)
    row.details["other_targets"] = other_targets
    if not all(other_targets.values()):
        row.passed = False


async def _settled(kit: ModuleType, cluster: LocalCluster, plan: Any) -> dict[str, Any]:
    """Wait for a settled disk (:func:`run_all.settled_disk`; half a second of prompt fsyncs with
    ``--tiny``, whose rows check their shape, not their figures)."""
    result: dict[str, Any] = await asyncio.to_thread(kit.settled_disk, cluster.data_dir,
                                                     for_s=0.5 if plan.tiny else kit.SETTLED_FOR_S)
    return result


def _ratio(during: float, solo: float) -> float:
    return round(during / solo, 2) if solo > 0 else float("inf")


def _latency(lat: dict[str, Any]) -> dict[str, Any]:
    """What the result keeps of a rate-limited run."""
    keep = ("ledger_id", "rate_target", "rate_achieved", "entries", "warmup_entries", "errors", "first_error",
            "latency_ms", "worst_ms_per_second", "stalls")
    return {k: lat[k] for k in keep if k in lat}


async def _writer(kit: ModuleType, client: Client, rate: float, seconds: float, urls: dict[str, str],
                  probe_dir: Path, ensemble: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                  keep_ledger: bool = False, cluster: LocalCluster | None = None) -> dict[str, Any]:
    """The latency row's rate-limited writer; with ``cluster``, also the CPU each of its
    processes and the whole machine used meanwhile (``cpu``: what bounded the run when the cores
    were busy)."""
    cpu = kit.CpuMeter(cluster) if cluster is not None else None
    machine = kit.MachineCpu()
    lat: dict[str, Any] = await kit.rate_limited_adds(client, rate, seconds, 100, ensemble, write_quorum, ack_quorum,
                                                      warmup=min(1.0, seconds / 4), stall_urls=urls,
                                                      probe_dir=probe_dir, keep_ledger=keep_ledger)
    if lat["errors"]:
        raise LedgerStoreError(f"rate-limited adds failed: {lat['first_error']}")
    out = _latency(lat)
    out["cpu"] = {"machine_busy": machine.busy(), "cores": os.cpu_count(),
                  "percent_of_a_core": cpu.percent() if cpu is not None else None}
    return out


async def _interleaved_ledgers(kit: ModuleType, client: Client, ledgers: int, data_bytes: int,
                               entry_size: int, settle_s: float) -> Any:
    """``data_bytes`` in ``ledgers`` closed ledgers (E=3 Qw=2 Qa=2) written round-robin, 100
    entries at a time (so every entry log holds all of them); then the disk is let settle, and
    ``settle_s`` pass so that the bookies' checkpoint of all that (every 10 s in a
    ``LocalCluster``) has begun; the caller waits for the disk to settle after it
    (:func:`run_all.settled_disk`) before the writer's baseline."""
    w = await run_writes(client, WriteOptions(ensemble=3, write_quorum=2, ack_quorum=2, entry_size=entry_size,
                                              ledgers=ledgers, count=data_bytes // entry_size, keep_ledgers=True,
                                              batch=100))
    if w.errors:
        raise LedgerStoreError(f"writing {ledgers} interleaved ledgers failed: {w.first_error}")
    await asyncio.to_thread(kit.quiet_disk)
    await asyncio.sleep(settle_s)
    return w


# --- catchup_isolation ----------------------------------------------------------------------------

def _checkpoint_and_evict(cluster: LocalCluster) -> int:
    """Restart every bookie (a stop checkpoints the engine, so the entries are in the entry logs
    and nothing is left in a bookie's memory), then evict the ledger directories' page cache."""
    for i in range(cluster.n):
        cluster.kill(i, signal.SIGTERM)
        cluster.restart(i)
    os.sync()
    return evict(ledger_dirs(cluster))


def _start_reader(metadata: str, ledger_id: int) -> subprocess.Popen[bytes]:
    """The catch-up reader, a process of its own (its CPU is not the writer's client's)."""
    return subprocess.Popen([sys.executable, __file__, "read", metadata, str(ledger_id)],
                            stdout=subprocess.PIPE, start_new_session=True)


def _reader_result(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise LedgerStoreError(f"the catch-up reader did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise LedgerStoreError(f"the catch-up reader failed (exit status {proc.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


async def _catchup(kit: ModuleType, cluster: LocalCluster, urls: dict[str, str], plan: Any, row: Any) -> None:
    data_bytes = plan.ops_mb * _MiB
    entry_size = 4096
    # about as long as the catch-up read takes at 100 MB/s (this disk's cold rate), so that the
    # reader is at work for the writer's whole measured run
    seconds = 2.0 if plan.tiny else min(20.0, max(3.0, data_bytes / 100e6))
    ceiling_file = await asyncio.to_thread(write_ceiling_file, cluster.data_dir, min(data_bytes, 512 * _MiB))
    async with Client(metadata=cluster.metadata) as client:
        # the catch-up ledger: striped over the three bookies (E=3 Qw=1), 4 KiB entries
        w = await run_writes(client, WriteOptions(ensemble=3, write_quorum=1, ack_quorum=1, entry_size=entry_size,
                                                  count=data_bytes // entry_size, keep_ledgers=True, batch=100))
        if w.errors:
            raise LedgerStoreError(f"writing the catch-up ledger failed: {w.first_error}")
    lid = w.ledger_ids[0]
    evicted = await asyncio.to_thread(_checkpoint_and_evict, cluster)
    ceiling = await asyncio.to_thread(disk_read_ceiling, ceiling_file)
    async with Client(metadata=cluster.metadata) as client:
        settled = [await _settled(kit, cluster, plan)]
        solo = await _writer(kit, client, plan.rate, seconds, urls, cluster.data_dir, cluster=cluster)
        settled.append(await _settled(kit, cluster, plan))
        reader = _start_reader(cluster.metadata, lid)
        try:
            during = await _writer(kit, client, plan.rate, seconds, urls, cluster.data_dir, cluster=cluster)
        finally:
            # the read rate is the one beside the writer: a reader still reading stops now
            if reader.poll() is None:
                reader.send_signal(signal.SIGTERM)
            read = await asyncio.to_thread(_reader_result, reader, 120.0)
    p99_solo, p99_during = solo["latency_ms"]["p99"], during["latency_ms"]["p99"]
    read_share = round(read["mb_per_s"] / ceiling["mb_per_s"], 3)
    row.details = {
        "catchup_ledger": {"bytes": w.entries * entry_size, "entry_size": entry_size,
                           "ensemble": "E=3 Qw=1 Qa=1", "bytes_evicted": evicted},
        "disk_read_ceiling": ceiling, "catchup_read": read, "read_share_of_ceiling": read_share,
        "settled_disk_before_solo_and_during": settled,
        "writer_solo": solo, "writer_during_catchup": during,
        "p99_solo_ms": p99_solo, "p99_during_ms": p99_during,
        "latency_ms": during["latency_ms"],
    }
    settle(row, _ratio(p99_during, p99_solo), read_at_half_the_disk_ceiling=read_share >= 0.5)


# --- recovery ------------------------------------------------------------------------------------

#: seconds a SIGKILLed bookie's registration outlives it (the metadata session's timeout)
SESSION_S = 4
#: each replication worker's copy throttle in the recovery row (BookKeeper's
#: replicationRateByBytes): four surviving workers copy at most 4 x this
RECOVERY_BYTES_PER_S = 8 * 1000 * 1000


def recovery_config() -> str:
    """The recovery row's bookie settings (dotted keys: the file's last table stays ``[bookie]``)."""
    return (f"metadata_options.session_timeout = {SESSION_S}\n"
            "autorecovery.enabled = true\n"
            "autorecovery.lost_bookie_recovery_delay_s = 0.0\n"
            "autorecovery.audit_interval_s = 60.0\n"
            "autorecovery.lease_s = 10.0\n"
            f"autorecovery.replication_rate_by_bytes = {RECOVERY_BYTES_PER_S}\n")


async def _watch_markers(client: Client, since: float, until_s: float) -> dict[str, Any]:
    """Poll the under-replication markers from ``since`` (the kill) until there were some and
    none is left, or ``until_s`` seconds passed: when the first appeared, when the last went,
    how many ledgers were marked in all."""
    from ledgerstore.recovery.markers import UnderReplicationManager

    assert client.store is not None
    urm = UnderReplicationManager(client.store)
    marked: set[int] = set()
    first_seen = cleared = None
    most = 0
    while time.monotonic() - since < until_s:
        ids = await urm.ledger_ids()
        now = time.monotonic()
        if ids and first_seen is None:
            first_seen = now
        marked.update(ids)
        most = max(most, len(ids))
        if marked and not ids:
            cleared = now
            break
        await asyncio.sleep(0.1)
    return {"ledgers_marked": len(marked), "most_marked_at_once": most,
            "first_marked_after_s": None if first_seen is None else round(first_seen - since, 2),
            "nothing_under_replicated_after_s": None if cleared is None else round(cleared - since, 2),
            "under_replicated_left": len(await urm.ledger_ids())}


async def _recovery(kit: ModuleType, cluster: LocalCluster, urls: dict[str, str], plan: Any, row: Any) -> None:
    data_bytes = plan.ops_mb * _MiB
    ledgers = 20 if plan.tiny else max(10, min(1000, plan.ops_mb * 1000 // 2048))
    entry_size = 4096
    rate = 5000.0
    seconds = 3.0 if plan.tiny else 20.0
    async with Client(metadata=cluster.metadata) as client:
        w = await _interleaved_ledgers(kit, client, ledgers, data_bytes, entry_size, 0 if plan.tiny else 11)
        settled = [await _settled(kit, cluster, plan)]
        before = await _writer(kit, client, rate, seconds, urls, cluster.data_dir, 3, 2, 2, cluster=cluster)
        settled.append(await _settled(kit, cluster, plan))
        victim = cluster.n - 1
        held = du([cluster.config_path(victim).parent / "ledgers"])
        dead_urls = {k: v for k, v in urls.items() if k != f"bookie{victim}"}

        async def kill_and_watch() -> dict[str, Any]:
            await asyncio.sleep(min(1.0, seconds / 4) + 0.5)  # once the writer's warm-up is over
            await asyncio.to_thread(cluster.kill, victim)
            return await _watch_markers(client, time.monotonic(), 60.0 if plan.tiny else 600.0)

        watcher = asyncio.ensure_future(kill_and_watch())
        during = await _writer(kit, client, rate, seconds, dead_urls, cluster.data_dir, 3, 2, 2, cluster=cluster)
        watch = await watcher
    took = watch["nothing_under_replicated_after_s"]
    # the rate of re-replication itself: from the first marker (the session timeout and the
    # audit before it are in ``first_marked_after_s``) to the last one gone
    busy = took - watch["first_marked_after_s"] if took is not None else None
    per_min = round(watch["ledgers_marked"] / busy * 60, 1) if busy else 0.0
    p99_before, p99_during = before["latency_ms"]["p99"], during["latency_ms"]["p99"]
    row.details = {
        "ledgers": ledgers, "bytes_written": w.bytes, "entry_size": entry_size, "ensemble": "E=3 Qw=2 Qa=2",
        "lost_bookie_held_bytes": held, "replication_rate_by_bytes_per_worker": RECOVERY_BYTES_PER_S,
        "session_timeout_s": SESSION_S, **watch,
        "rereplicating_s": None if busy is None else round(busy, 2),
        "ledgers_per_minute": per_min, "mb_per_s": round(held / 1e6 / busy, 1) if busy else 0.0,
        "settled_disk_before_and_during": settled,
        "writer_before": before, "writer_during_recovery": during,
        "p99_before_ms": p99_before, "p99_during_ms": p99_during, "p99_ratio": _ratio(p99_during, p99_before),
        "latency_ms": during["latency_ms"],
    }
    settle(row, per_min, nothing_under_replicated=took is not None,
           writer_p99_at_most_twice=row.details["p99_ratio"] <= 2.0)


# --- gc_reclaim ----------------------------------------------------------------------------------

#: entry-log bytes per entry beyond its payload: the record header (length, CRC, ledger and entry
#: ids), then the entry as the client signed it: its header (ledger id, entry id, LAC) and the
#: default digest (CRC32C) before the payload
RECORD_OVERHEAD = 24 + ENTRY_HEADER.size + Crc32cDigest.size


def gc_config(tiny: bool) -> str:
    """The gc_reclaim row's bookie settings: GC every few seconds (the default, 15 minutes, is
    BookKeeper's gcWaitTime of its sample configuration and alone would exceed the 5 minutes)."""
    return f"gc_wait_time_ms = {1000 if tiny else 10_000}\n"


async def _gc_reclaim(kit: ModuleType, cluster: LocalCluster, urls: dict[str, str], plan: Any, row: Any) -> None:
    data_bytes = plan.ops_mb * _MiB
    ledgers = 20 if plan.tiny else 100
    entry_size = 4096
    rate = plan.rate
    chunk = 2.0 if plan.tiny else 10.0
    limit_s = 30.0 if plan.tiny else 300.0
    dirs = ledger_dirs(cluster)
    async with Client(metadata=cluster.metadata) as client:
        w = await _interleaved_ledgers(kit, client, ledgers, data_bytes, entry_size, 0 if plan.tiny else 11)
        settled = [await _settled(kit, cluster, plan)]
        before = await _writer(kit, client, rate, chunk, urls, cluster.data_dir, cluster=cluster)  # its ledger is deleted
        settled.append(await _settled(kit, cluster, plan))
        used_full = du(dirs)
        keep = w.ledger_ids[: max(1, ledgers // 10)]
        t0 = time.monotonic()
        for lid in w.ledger_ids[len(keep):]:
            await client.delete_ledger(lid)
        deleted_s = time.monotonic() - t0
        per_ledger = w.entries // ledgers * (entry_size + RECORD_OVERHEAD) * 2  # Qw=2 copies of each
        # live data: the kept ledgers and everything the writer wrote (its ledgers are kept)
        kept = per_ledger * len(keep)
        writer_record = (100 + RECORD_OVERHEAD) * 3  # the writer's ledgers are E=3 Qw=3
        live = kept
        runs: list[dict[str, Any]] = []
        reclaimed_at = None
        samples: list[tuple[float, int]] = []
        while time.monotonic() - t0 < limit_s:
            runs.append(await _writer(kit, client, rate, chunk, urls, cluster.data_dir, keep_ledger=True,
                                      cluster=cluster))
            used = du(dirs)
            live = kept + sum(r["entries"] + r["warmup_entries"] for r in runs) * writer_record
            samples.append((round(time.monotonic() - t0, 1), used))
            if used <= 1.2 * live:
                reclaimed_at = time.monotonic() - t0
                break
    used_end = samples[-1][1]
    worst = max(runs, key=lambda r: r["latency_ms"]["p99"])
    p99_before, p99_during = before["latency_ms"]["p99"], worst["latency_ms"]["p99"]
    row.details = {
        "ledgers": ledgers, "ledgers_kept": len(keep), "bytes_written": w.bytes, "entry_size": entry_size,
        "ensemble": "E=3 Qw=2 Qa=2", "ledger_dirs_bytes_before_delete": used_full, "kept_bytes": kept,
        "live_bytes": live,
        "ledger_dirs_bytes_end": used_end, "deleting_s": round(deleted_s, 2),
        "reclaimed_within_20pct_after_s": None if reclaimed_at is None else round(reclaimed_at, 1),
        "du_samples_s_bytes": samples, "writer_runs_s": chunk,
        "settled_disk_before_and_during": settled,
        "writer_before": before, "writer_worst_run_during_gc": worst,
        "p99_before_ms": p99_before, "p99_during_ms": p99_during, "p99_ratio": _ratio(p99_during, p99_before),
        "p99_per_run_ms": [r["latency_ms"]["p99"] for r in runs],
        "latency_ms": worst["latency_ms"],
    }
    settle(row, round(used_end / live, 2), within_5_minutes=reclaimed_at is not None,
           writer_p99_at_most_twice=row.details["p99_ratio"] <= 2.0)


# --- the rows ----------------------------------------------------------------------------------------

def run_rows(kit: ModuleType, plan: Any, rows: dict[str, Any], tmp: Path) -> None:
    """Run the rows of :data:`ROWS` that ``plan`` wants, each on a cluster of its own; ``kit`` is
    ``run_all``."""
    if plan.wants("catchup_isolation"):
        row = rows["catchup_isolation"]
        kit.quiet_disk()
        row.load_before = kit.uptime()
        with cluster_of(kit, tmp, "catchup", 3) as (cluster, urls):
            asyncio.run(_catchup(kit, cluster, urls, plan, row))
    if plan.wants("recovery"):
        row = rows["recovery"]
        kit.quiet_disk()
        row.load_before = kit.uptime()
        with cluster_of(kit, tmp, "recovery", 5, recovery_config()) as (cluster, urls):
            asyncio.run(_recovery(kit, cluster, urls, plan, row))
    if plan.wants("gc_reclaim"):
        row = rows["gc_reclaim"]
        kit.quiet_disk()
        row.load_before = kit.uptime()
        with cluster_of(kit, tmp, "gc", 3, gc_config(plan.tiny)) as (cluster, urls):
            asyncio.run(_gc_reclaim(kit, cluster, urls, plan, row))


# --- the catch-up reader's process ----------------------------------------------------------------

async def _read(metadata: str, ledger_id: int, machine_meter: Any, batch: int = 256, window: int = 4) -> dict[str, Any]:
    """Read the ledger from its first entry, ``window`` batches of ``batch`` entries in flight,
    until its end or SIGTERM (the writer's measured run is over); what was read, how fast, and
    how busy the machine was meanwhile (``machine_meter()``: a ``run_all.MachineCpu``; the
    writer's own figure covers its whole run, of which the read may be only a part)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    entries = nbytes = 0
    async with Client(metadata=metadata) as client:
        handle = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        last = handle.last_add_confirmed
        start = time.perf_counter()
        cpu0 = time.process_time()
        machine = machine_meter()
        inflight: list[asyncio.Task[Any]] = []
        first = 0
        while (first <= last or inflight) and not stop.is_set():
            while first <= last and len(inflight) < window:
                hi = min(last, first + batch - 1)
                inflight.append(asyncio.ensure_future(handle.read(first, hi)))
                first = hi + 1
            got = await inflight.pop(0)
            entries += len(got)
            nbytes += sum(len(e.payload) for e in got)
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        machine_busy = machine.busy()
        for t in inflight:
            t.cancel()
    return {"entries": entries, "bytes": nbytes, "seconds": round(seconds, 3),
            "mb_per_s": round(nbytes / 1e6 / seconds, 1) if seconds else 0.0, "finished": first > last,
            "stopped": stop.is_set(), "cpu_percent_of_a_core": round(100 * cpu / seconds, 1) if seconds else 0.0,
            "machine_busy": machine_busy}


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "read":
        sys.exit(f"usage: {sys.argv[0]} read METADATA LEDGER_ID")
    # as an application whose hot loop is the client would run it (and as ``ledgerstore bench``
    # and the writer's process do): uvloop when installed, the collector tuned
    install_fast_loop()
    tune_gc()
    import run_all  # this script's directory is on the path: the meter the writer's figures use

    print(json.dumps(asyncio.run(_read(sys.argv[2], int(sys.argv[3]), run_all.MachineCpu))))
