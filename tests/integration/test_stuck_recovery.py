"""A ledger that cannot be re-replicated speaks up once, and an operator is told at once.

Three real bookie processes run auto-recovery; an E=3 ledger loses one of its bookies to kill -9,
so placement has no replacement outside its ensemble. The workers back off from it and warn once;
the stuck gauge and ``listunderreplicated`` say why; ``decommissionbookie`` refuses within
seconds naming the ledger; a fourth bookie unsticks it (one more line) and the ledger is
re-replicated onto it."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster, free_ports
from ledgerstore.recovery.markers import Marker, UnderReplicationManager
from ledgerstore.recovery.stuck import NOT_ENOUGH_BOOKIES, REASONS

TOKEN = "stuck-recovery-admin-token"
AUTORECOVERY = ("[bookie.metadata_options]\nsession_timeout = 4\n"
                "[bookie.autorecovery]\nenabled = true\nlost_bookie_recovery_delay_s = 1.0\nlease_s = 4.0\n"
                "audit_interval_s = 30.0\n")


async def until(check: Callable[[], Awaitable[object]], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.2)


def stuck_gauge(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        text = resp.read().decode()
        assert resp.status == 200, text
    finally:
        conn.close()
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "ledgerstore_replication_stuck_ledgers" for s in f.samples}


def log_lines(cluster: LocalCluster, which: list[int], pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [line for i in which for line in cluster.log_path(i).read_text(errors="replace").splitlines()
            if rx.search(line)]


async def shell(cluster: LocalCluster, *args: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ledgerstore", "shell", "--metadata", cluster.metadata, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ, "COLUMNS": "400"})
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(), time.monotonic() - t0


def test_a_ledger_without_a_replacement_warns_once_and_a_fourth_bookie_unsticks_it(
        cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    cluster = cluster_factory(3)
    http_ports = free_ports(3)
    cluster.data_dir.mkdir(parents=True, exist_ok=True)
    cluster.write_configs()
    for i, port in enumerate(http_ports):
        with open(cluster.config_path(i), "a") as fh:
            fh.write(f'http_port = {port}\n[bookie.http]\ntoken_file = "{token_file}"\n' + AUTORECOVERY)
    cluster.start()
    ids = sorted(range(3), key=cluster.bookie_id)
    victim = ids[-1]  # never the first auditor (the smallest id)
    survivors = ids[:-1]
    gone = cluster.bookie_id(victim)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            data = [os.urandom(200) for _ in range(60)]
            await asyncio.gather(*(lh.append_async(p) for p in data))
            await lh.close()
            lid = lh.ledger_id
            urm = UnderReplicationManager(client.store)  # type: ignore[arg-type]

            cluster.kill(victim)

            async def marker() -> Marker | None:
                return await urm.get(lid)

            async def stuck_for(failures: int) -> Marker | None:
                m = await marker()
                return m if m is not None and m.stuck_reason and m.failures >= failures else None

            m = await until(lambda: stuck_for(1), 60, "a worker to find the ledger stuck")
            assert isinstance(m, Marker) and m.stuck_reason == NOT_ENOUGH_BOOKIES, m
            assert "not enough bookies" in m.last_error and gone in m.last_error, m.last_error
            # the window: three more failed tries by either worker (backoff 2 s, 4 s, 8 s, or
            # at once when a registration changes) and still one line
            await until(lambda: stuck_for(4), 90, "three more attempts on the stuck ledger")
            stuck_lines = log_lines(cluster, survivors, rf"ledger {lid} is stuck")
            assert len(stuck_lines) == 1, stuck_lines
            assert "not enough bookies" in stuck_lines[0], stuck_lines
            assert not log_lines(cluster, survivors, rf"re-replication of ledger {lid} failed"), "one line per failure"

            gauges = [stuck_gauge(http_ports[i]) for i in survivors]
            assert all(set(g) == set(REASONS) for g in gauges), gauges
            assert max(g[NOT_ENOUGH_BOOKIES] for g in gauges) == 1, gauges

            code, out, _ = await shell(cluster, "listunderreplicated")
            assert code == 0 and NOT_ENOUGH_BOOKIES in out and "not enough bookies" in out, out
            code, out, _ = await shell(cluster, "listunderreplicated", "--json")
            rows = json.loads(out)
            assert [(r["ledger_id"], r["stuck_reason"]) for r in rows] == [(lid, NOT_ENOUGH_BOOKIES)], rows

            # the operator is told within seconds, with the ledger named, and nothing changes
            code, out, took = await shell(cluster, "decommissionbookie", gone, "--timeout", "3600")
            assert code != 0, out
            assert f"({lid})" in out and "not enough bookies" in out and "Traceback" not in out, out
            assert took < 30, f"decommissionbookie took {took:.1f}s to refuse"
            assert not await urm.decommissioning()

            new = cluster.add_bookie()
            with open(cluster.config_path(new), "a") as fh:
                fh.write(AUTORECOVERY)
            cluster.start_bookie(new)

            async def moved() -> bool:
                md = await client.ledger_metadata(lid)
                return await marker() is None and gone not in md.bookies()

            await until(moved, 90, "the ledger to be re-replicated onto the fourth bookie")
            md = await client.ledger_metadata(lid)
            assert cluster.bookie_id(new) in md.bookies(), md.ensembles
            unstuck = log_lines(cluster, [*survivors, new], rf"ledger {lid} is no longer stuck")
            assert len(unstuck) == 1, unstuck
            assert len(log_lines(cluster, [*survivors, new], rf"ledger {lid} is stuck")) == 1

            rh = await client.open_ledger(lid, b"pw", recovery=False)
            assert [e.payload for e in await rh.read(0, len(data) - 1)] == data

            async def gauges_cleared() -> bool:
                return all(stuck_gauge(http_ports[i])[NOT_ENOUGH_BOOKIES] == 0 for i in survivors)

            await until(gauges_cleared, 30, "the stuck gauge to go back to 0")

    asyncio.run(asyncio.wait_for(main(), 400))
