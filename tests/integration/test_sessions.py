"""Bookies and metadata sessions, on every metadata backend: registrations vanish with their
process, and a bookie whose session expired re-registers while writes carry on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ledgerstore.aio import Client
from ledgerstore.api import EventType, Notification
from ledgerstore.cluster import LocalCluster
from ledgerstore.meta import layout
from tests.conftest import ClusterConfig

BACKENDS = ["sqlite", "zk", "etcd"]
SESSION = 4  # seconds
EXTRA = f"[bookie.metadata_options]\nsession_timeout = {SESSION}\n"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_bookie_leaves_and_clients_are_told(cluster_factory, backend: str) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3, ClusterConfig(backend, "entrylog", "tcp"), extra_bookie_config=EXTRA)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            seen: list[Notification] = []
            sub = await client.store.watch(layout.AVAILABLE, seen.append)
            victim = cluster.bookie_id(2)
            t0 = time.monotonic()
            cluster.kill(2)
            while victim in {b.bookie_id for b in await client.list_bookies()}:
                assert time.monotonic() - t0 < SESSION * 3 + 10, "registration outlived the session"
                await asyncio.sleep(0.2)
            deadline = time.monotonic() + 10
            while not any(n.type is EventType.DELETED and n.key.endswith(victim) for n in seen):
                assert time.monotonic() < deadline, f"no DELETED notification for {victim}: {seen}"
                await asyncio.sleep(0.1)
            sub.cancel()

    run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_bookie_with_an_expired_session_re_registers_and_writes_go_on(cluster_factory, backend: str) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(4, ClusterConfig(backend, "entrylog", "tcp"), extra_bookie_config=EXTRA)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=2) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            frozen_id = lh.md.ensembles[0][1][0]
            frozen = next(i for i in range(4) if cluster.bookie_id(i) == frozen_id)
            pid = cluster.procs[frozen].pid
            acked: list[int] = []
            gone = back = False
            os.kill(pid, signal.SIGSTOP)  # the bookie stops heart-beating: its session expires
            t0 = time.monotonic()
            try:
                i = 0
                while time.monotonic() - t0 < 60:
                    futs = [lh.append_async(b"p%d" % (i + k)) for k in range(100)]
                    i += 100
                    acked.extend(await asyncio.gather(*futs))
                    ids = {b.bookie_id for b in await client.list_bookies()}
                    if not gone and frozen_id not in ids:
                        gone = True
                        os.kill(pid, signal.SIGCONT)
                    elif gone and frozen_id in ids:
                        back = True
                        break
                    await asyncio.sleep(0.05)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert gone, "the frozen bookie's registration never expired"
            assert back, "the bookie did not re-register after its session expired"
            for _ in range(20):  # and the workload carries on
                acked.extend(await asyncio.gather(*(lh.append_async(b"p%d" % (i + k)) for k in range(100))))
                i += 100
            assert acked == list(range(len(acked)))
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, acked[-1])] == [b"p%d" % e for e in acked]
            assert cluster.procs[frozen].poll() is None, "the bookie process died"
        log = cluster.log_path(frozen).read_text()
        assert "session lost" in log and "re-registering" in log

    run(main())


def test_cluster_admin_commands(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(1)
    cluster.start()
    cluster.stop()

    def shell(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerstore", "shell", "--metadata", cluster.metadata, *args],
                              capture_output=True, text=True, timeout=60)

    iid = json.loads(shell("whatisinstanceid", "--json").stdout)["instance_id"]
    assert shell("initnewcluster").returncode == 1  # one exists already
    assert shell("nukeexistingcluster", "-i", "not-it").returncode == 1
    assert json.loads(shell("nukeexistingcluster", "-i", iid, "--json").stdout)["nuked_instance_id"] == iid
    assert json.loads(shell("whatisinstanceid", "--json").stdout)["instance_id"] is None
    new = json.loads(shell("initnewcluster", "--json").stdout)["instance_id"]
    assert new != iid
    # the bookie's disks belong to the old instance: it refuses to join the new one
    cfg = cluster.config_path(0)
    cfg.write_text(cfg.read_text().replace("auto_init_cluster", "# auto_init_cluster"))
    cluster.start_metadata_server()  # a sqlite bookie reaches its database through the metadata server
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "bookie", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "instance" in out.stderr.lower()
