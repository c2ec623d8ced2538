"""Crash safety of the bookie on every storage engine: SIGKILL a bookie under load at random
moments (checkpoints every 300 ms, GC and compaction running) 20 times in all; after each restart
every entry each bookie acknowledged is readable from that bookie with a valid digest, and at the
end ``localconsistencycheck`` is clean."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DigestManager
from tests.conftest import ClusterConfig

KILLS_PER_ENGINE = 7  # x 2 engines = 14 kills
#: entries of one ledger read back from one bookie per READ_MULTI request (at most 400 bytes each)
VERIFY_CHUNK = 500
EXTRA = {
    "entrylog": (
        "gc_wait_time_ms = 700\nminor_compaction_interval_s = 1\nmajor_compaction_interval_s = 2\n"
        "flush_interval_ms = 300\n"
        "[bookie.storage_options]\nentry_log_size_limit = 262144\nwrite_buffer_size = 16384\n"
        "page_size = 512\npage_limit_bytes = 8192\n"
    ),
    "rocksdb": "gc_wait_time_ms = 700\nflush_interval_ms = 300\n",
}


@pytest.mark.parametrize("engine", ["entrylog", "rocksdb"])
def test_kill_9_under_load_loses_no_acknowledged_entry(cluster_factory, engine: str) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3, ClusterConfig("sqlite", engine, "tcp"), extra_bookie_config=EXTRA[engine])
    cluster.start()  # checkpoints every 300 ms (EXTRA), so kills land in checkpoints
    rnd = random.Random(int(os.environ.get("LEDGERSTORE_CRASH_SEED", "20261123")))

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=10) as client:
            acks: dict[tuple[int, int], set[str]] = {}
            live: list[int] = []
            for _ in range(KILLS_PER_ENGINE):
                lh = await client.create_ledger(3, 3, 2, password=b"pw")
                lh.ack_observer = lambda e, b, lid=lh.ledger_id: acks.setdefault((lid, e), set()).add(b)
                victim = rnd.randrange(3)
                kill_after = rnd.uniform(0.1, 1.5)
                t0 = time.monotonic()
                killed = False
                while True:  # write until the victim has been killed and 0.3 s more have passed
                    futs = [lh.append_async(os.urandom(rnd.randint(10, 400))) for _ in range(100)]
                    await asyncio.gather(*futs)
                    if not killed and time.monotonic() - t0 > kill_after:
                        cluster.kill(victim)
                        killed = True
                        kill_after = time.monotonic()
                    if killed and time.monotonic() - kill_after > 0.3:
                        break
                await lh.close()
                live.append(lh.ledger_id)
                cluster.restart(victim)
                # garbage for GC and compaction: delete an older ledger now and then
                if len(live) > 3 and rnd.random() < 0.5:
                    gone = live.pop(rnd.randrange(len(live) - 1))
                    await client.delete_ledger(gone)
                    for k in [k for k in acks if k[0] == gone]:
                        del acks[k]
                await verify(client, acks, live)

    async def verify(client: Client, acks: dict[tuple[int, int], set[str]], live: list[int]) -> None:
        dms = {lid: DigestManager(lid, "crc32c", b"pw") for lid in live}
        wanted: dict[tuple[str, int], list[int]] = {}  # (bookie, ledger) -> the entries it acknowledged
        for (lid, eid), bs in acks.items():
            if lid in dms:
                for b in bs:
                    wanted.setdefault((b, lid), []).append(eid)

        async def check(bid: str, lid: int, eids: list[int]) -> None:
            # the entries a bookie acknowledged, VERIFY_CHUNK to a READ_MULTI request
            for at in range(0, len(eids), VERIFY_CHUNK):
                chunk = eids[at:at + VERIFY_CHUNK]
                items = await client.bookie_client.read_multi(bid, lid, chunk, 30)
                assert [eid for eid, _, _ in items] == chunk
                for eid, status, entry in items:
                    assert status == Status.OK, f"bookie {bid} acknowledged ledger {lid} entry {eid} but lost it"
                    dms[lid].verify(entry, eid)

        await asyncio.gather(*(check(bid, lid, sorted(eids)) for (bid, lid), eids in wanted.items()))

    asyncio.run(asyncio.wait_for(main(), 600))
    cluster.stop()
    for i in range(3):
        out = subprocess.run([sys.executable, "-m", "ledgerstore", "shell", "localconsistencycheck", "--config",
                              str(cluster.config_path(i)), "--json"], capture_output=True, text=True, timeout=300)
        result = json.loads(out.stdout)
        assert out.returncode == 0 and result["ok"], result["problems"][:10]
        assert result["entries_checked"] > 0
