"""Bookie storage operations on real files: space comes back after deletes, and a bookie whose
disk fills turns read-only while writers move on and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster, free_ports
from tests.conftest import ClusterConfig

PER_BATCH = 1_000  # entries of 1 KiB a ledger gets at once, four times


def seeded(ledger_id: int, i: int) -> bytes:
    """1 KiB of incompressible bytes, reproducible from (ledger, i)."""
    import random

    return random.Random(ledger_id * 1_000_003 + i).randbytes(1024)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("engine", ["entrylog", "rocksdb"])
def test_gc_reclaims_space_of_deleted_ledgers(cluster_factory, engine: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (http,) = free_ports(1)
    token_file = tmp_path / "admin-token"
    token_file.write_text("gc-test-token\n")
    extra = f"http_port = {http}\ngc_wait_time_ms = 0\nflush_interval_ms = 300\n"
    # small files, so that 40 MB make as many files as a large disk's worth: the active entry log
    # is never compacted (roll every 2 MiB); RocksDB flushes a memtable into an SST file every 2 MiB
    if engine == "entrylog":
        extra += "[bookie.storage_options]\nentry_log_size_limit = 2097152\n"
    else:
        extra += "[bookie.storage_options]\nwrite_buffer_size = 2097152\n"
    extra += f'[bookie.http]\ntoken_file = "{token_file}"\n'  # forcing a GC changes state: it needs the token
    cluster: LocalCluster = cluster_factory(1, ClusterConfig("sqlite", engine, "tcp"), extra_bookie_config=extra)
    cluster.start()
    ledgers: list[int] = []

    async def write() -> int:
        async with Client(metadata=cluster.metadata) as client:
            written = 0
            for _ in range(10):  # 10 ledgers x 4 MB = 40 MB
                lh = await client.create_ledger(1, 1, 1, password=b"pw")
                for _ in range(4):  # distinct random payloads: nothing for the engine to compress
                    await asyncio.gather(*(lh.append_async(seeded(lh.ledger_id, i)) for i in range(PER_BATCH)))
                    written += PER_BATCH * 1024
                await lh.close()
                ledgers.append(lh.ledger_id)
            for lid in ledgers[::2]:
                await client.delete_ledger(lid)
            return written

    written = asyncio.run(asyncio.wait_for(write(), 600))
    time.sleep(1.5)  # a checkpoint has moved everything from the journal into the engine's files
    ledger_dir = cluster.config_path(0).parent / "ledgers"
    before = du(ledger_dir)
    assert before >= written * 0.9, (before, written)
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "shell", "gc", "--http", f"127.0.0.1:{http}", "--major",
                          "--token-file", str(token_file), "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert sorted(report["deleted_ledgers"]) == sorted(ledgers[::2])
    after = du(ledger_dir)
    assert before - after >= 0.4 * written, f"reclaimed {(before - after) / 2**20:.0f} MiB of {written / 2**20:.0f} MiB"

    async def read_back() -> None:
        async with Client(metadata=cluster.metadata) as client:
            for lid in ledgers[1::2]:
                rh = await client.open_ledger(lid, password=b"pw")
                got = await rh.read(0, rh.last_add_confirmed)
                assert len(got) == 4 * PER_BATCH
                assert all(e.payload == seeded(lid, e.entry_id % PER_BATCH) for e in got)

    asyncio.run(asyncio.wait_for(read_back(), 300))


@pytest.fixture
def small_disk(tmpfs: Callable[[int], Path]) -> Path:
    """A 48 MiB filesystem of the test's own (tmpfs)."""
    return tmpfs(48)


def test_full_disk_turns_the_bookie_read_only_and_writers_move_on(small_disk: Path, cluster_factory) -> None:  # type: ignore[no-untyped-def]
    extra = ("disk_usage_threshold = 0.6\ndisk_usage_lwm = 0.3\ndisk_check_interval_ms = 200\n"
             "gc_wait_time_ms = 500\nflush_interval_ms = 300\n"
             "[bookie.journal]\nmax_file_size_mb = 2\nmax_backups = 0\n"
             # small entry logs, so that whole logs of a deleted ledger can be dropped
             "[bookie.storage_options]\nentry_log_size_limit = 2097152\n")
    cluster: LocalCluster = cluster_factory(4, extra_bookie_config=extra)
    cluster.write_configs()
    cfg = cluster.config_path(0)
    cfg.write_text(cfg.read_text().replace('journal_dir = "journal"', f'journal_dir = "{small_disk}/journal"')
                   .replace('ledger_dirs = ["ledgers"]', f'ledger_dirs = ["{small_disk}/ledgers"]'))
    cluster.start()
    full = cluster.bookie_id(0)

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=10) as client:
            others = [cluster.bookie_id(i) for i in (1, 2)]
            lh = await client.create_ledger(3, 3, 2, password=b"pw", bookies=[full, *others])
            payload = os.urandom(4096)
            acked: list[int] = []
            deadline = time.monotonic() + 120
            while full not in {b.bookie_id for b in await client.list_bookies(read_only=True)}:
                assert time.monotonic() < deadline, "the bookie never turned read-only"
                acked.extend(await asyncio.gather(*(lh.append_async(payload) for _ in range(200))))
            # writes go on: the writer replaces the read-only bookie
            for _ in range(10):
                acked.extend(await asyncio.gather(*(lh.append_async(payload) for _ in range(200))))
            md = await client.ledger_metadata(lh.ledger_id)
            assert full not in md.current_ensemble, md.ensembles
            # new ledgers avoid it
            for _ in range(5):
                other = await client.create_ledger(3, 3, 2)
                assert full not in other.md.current_ensemble
                await other.close()
                await client.delete_ledger(other.ledger_id)
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            got = await rh.read(0, acked[-1])
            assert acked == list(range(len(acked))) and all(e.payload == payload for e in got)
            # space comes back: the bookie turns writable again below the low-water mark
            await client.delete_ledger(lh.ledger_id)
            deadline = time.monotonic() + 120
            while full not in {b.bookie_id for b in await client.list_bookies(read_only=False)}:
                if time.monotonic() > deadline:
                    files = sorted((str(f.relative_to(small_disk)), f.stat().st_size)
                                   for f in small_disk.rglob("*") if f.is_file())
                    said = [line for line in cluster.log_path(0).read_text().splitlines() if " DEBUG " not in line]
                    raise AssertionError("the bookie never turned writable again; on its disk: "
                                         f"{files}; its log ends:\n" + "\n".join(said[-30:]))
                await asyncio.sleep(0.5)

    asyncio.run(asyncio.wait_for(main(), 400))
    log = cluster.log_path(0).read_text()
    assert "READ-ONLY" in log and "writable" in log
