"""Whole-cluster tests: bookies are real processes; writers are killed with SIGKILL.

Every test runs once per backend combination (metadata x storage x transport, see conftest.MATRIX)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import LedgerFencedError, NoSuchLedgerError, UnauthorizedAccessError
from ledgerstore.meta.ledgers import LedgerState
from ledgerstore.ports import consecutive_free_ports
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import DIGEST_TYPES, DigestManager, master_key
from tests.integration.writer_proc import run_and_kill


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 300))


async def read_from_bookie(client: Client, bookie_id: str, ledger_id: int, entry_id: int) -> codec.Response:
    """Ask one bookie directly for one entry (bypassing replica fallback)."""
    ch = client.pool.get(bookie_id)
    return await ch.request(lambda rid: codec.encode_read(rid, ledger_id, entry_id), 10)


@pytest.mark.parametrize("digest", DIGEST_TYPES)
def test_write_10000_entries_and_read_back_byte_equal(matrix_cluster: LocalCluster, digest: str) -> None:
    async def main() -> None:
        async with Client(metadata=matrix_cluster.metadata) as client:
            lh = await client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, digest=digest, password=b"pw")
            payloads = [os.urandom(1 + i % 300) for i in range(10_000)]
            ids = await asyncio.gather(*(lh.append_async(p) for p in payloads))
            assert ids == list(range(10_000)), "acks must complete in entry order with consecutive ids"
            assert lh.last_add_confirmed == 9_999
            await lh.close()
            md = await client.ledger_metadata(lh.ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 9_999
            assert md.length == sum(map(len, payloads))
            rh = await client.open_ledger(lh.ledger_id, password=b"pw")
            got = await rh.read(0, 9_999)
            assert [e.payload for e in got] == payloads
            # striping: entry e lives on the Qw bookies starting at e mod E, and nowhere else
            ensemble = md.ensembles[0][1]
            for e in (0, 1, 2, 3, 4999):
                for idx, bid in enumerate(ensemble):
                    resp = await read_from_bookie(client, bid, lh.ledger_id, e)
                    expected = idx in md.write_set(e)
                    assert (resp.status == Status.OK) == expected, (e, idx, resp.status)
                    if expected:
                        dm = DigestManager(lh.ledger_id, digest, b"pw")
                        assert dm.verify(resp.entry, e).payload == payloads[e]

    run(main())


def test_sync_api(matrix_cluster: LocalCluster) -> None:
    import ledgerstore

    with ledgerstore.Client(metadata=matrix_cluster.metadata) as client:
        lh = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, digest="crc32c", password=b"pw")
        assert lh.append(b"first") == 0
        futs = [lh.append_async(b"e%d" % i) for i in range(1, 100)]
        assert [f.result(30) for f in futs] == list(range(1, 100))
        assert lh.last_add_confirmed == 99
        lh.close()
        rh = client.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
        assert [e.payload for e in rh.read(0, 2)] == [b"first", b"e1", b"e2"]
        assert len(list(rh)) == 100
        assert lh.ledger_id in client.list_ledgers()
        client.delete_ledger(lh.ledger_id)
        assert lh.ledger_id not in client.list_ledgers()
        with pytest.raises(NoSuchLedgerError):
            client.open_ledger(lh.ledger_id, password=b"pw")


def test_wrong_password_is_refused_and_the_ledger_untouched(matrix_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=matrix_cluster.metadata) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"right")
            for i in range(10):
                await lh.append(b"x%d" % i)
            before = await client.ledger_metadata(lh.ledger_id)
            with pytest.raises(UnauthorizedAccessError):
                await client.open_ledger(lh.ledger_id, password=b"wrong", recovery=True)
            after = await client.ledger_metadata(lh.ledger_id)
            assert after.version == before.version and after.state is LedgerState.OPEN
            # a bookie refuses an add carrying another master key, and a fence with it
            bid = before.ensembles[0][1][0]
            ch = client.pool.get(bid)
            bad_key = master_key(b"wrong")
            entry = DigestManager(lh.ledger_id, "crc32c").sign(10, 9, b"intruder")
            resp = await ch.request(lambda rid: codec.encode_add(rid, lh.ledger_id, 10, bad_key, entry), 10)
            assert resp.status == Status.UNAUTHORIZED
            resp = await ch.request(lambda rid: codec.encode_read_lac(rid, lh.ledger_id, bad_key, codec.FLAG_FENCE), 10)
            assert resp.status == Status.UNAUTHORIZED
            # the writer is unaffected
            assert await lh.append(b"after") == 10
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, password=b"right")
            assert [e.payload for e in await rh.read(0, 10)][-1] == b"after"

    run(main())


def test_old_writer_gets_fenced_after_recovery(matrix_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=matrix_cluster.metadata) as writer, Client(metadata=matrix_cluster.metadata) as reader:
            lh = await writer.create_ledger(3, 2, 2, password=b"pw")
            for i in range(20):
                await lh.append(b"e%d" % i)
            rh = await reader.open_ledger(lh.ledger_id, password=b"pw", recovery=True)
            assert rh.is_closed and rh.last_add_confirmed >= 19
            with pytest.raises(LedgerFencedError):
                await lh.append(b"too late")
            # the seeds' close rule: recovery closed it at the entry this writer acknowledged last,
            # so the writer's close completes (and changes nothing)
            await lh.close()
            md = await writer.ledger_metadata(lh.ledger_id)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 19

    run(main())


def test_non_recovery_reader_tails_with_long_poll(matrix_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(metadata=matrix_cluster.metadata) as writer, Client(metadata=matrix_cluster.metadata) as reader:
            lh = await writer.create_ledger(3, 3, 2, password=b"pw")
            for i in range(5):
                await lh.append(b"e%d" % i)
            rh = await reader.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
            assert not rh.is_closed
            known = rh.last_add_confirmed
            assert 3 <= known <= 4  # the LAC rides on later entries
            waiter = asyncio.create_task(rh.wait_for_lac(known, timeout=10))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            await lh.append(b"e5")
            await lh.append(b"e6")
            new = await asyncio.wait_for(waiter, 10)
            assert new > known
            assert [e.payload for e in await rh.read(0, new)][:5] == [b"e%d" % i for i in range(5)]
            md = await writer.ledger_metadata(lh.ledger_id)
            assert md.state is LedgerState.OPEN, "a non-recovery open must not change the ledger"
            await lh.close()

    run(main())


def test_recovery_of_a_killed_writer_process(matrix_cluster: LocalCluster) -> None:
    ledger_id, last_ack = run_and_kill(matrix_cluster.metadata, until_ack=3000)

    async def main() -> None:
        async with Client(metadata=matrix_cluster.metadata) as client:
            rh = await client.open_ledger(ledger_id, password=b"pw", recovery=True)
            md = await client.ledger_metadata(ledger_id)
            assert md.state is LedgerState.CLOSED
            assert md.last_entry_id >= last_ack, (md.last_entry_id, last_ack)
            got = await rh.read(0, md.last_entry_id)
            assert [e.payload for e in got] == [b"entry-%08d" % i for i in range(md.last_entry_id + 1)]
            # a second recovery agrees
            again = await client.open_ledger(ledger_id, password=b"pw", recovery=True)
            assert again.last_add_confirmed == md.last_entry_id

    run(main())


def test_acknowledged_entries_survive_kill_9_of_a_bookie(matrix_cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = matrix_cluster_factory(3)
    cluster.start()

    async def main() -> None:
        async with Client(metadata=cluster.metadata, add_timeout_s=5) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            acked: list[int] = []
            victim = 1
            killed = False
            i = 0
            while True:
                futs = [lh.append_async(b"payload-%d" % (i + k)) for k in range(100)]
                i += 100
                results = await asyncio.gather(*futs, return_exceptions=True)
                acked.extend(r for r in results if isinstance(r, int))
                if any(isinstance(r, Exception) for r in results):
                    break
                if not killed and len(acked) >= 2000:
                    cluster.kill(victim)  # SIGKILL while adds are in flight
                    killed = True
                if i > 200_000:
                    pytest.fail("writes never failed after a bookie of a full ensemble died")
            assert killed and len(acked) >= 2000
            assert acked == list(range(len(acked)))
            cluster.restart(victim)
            md = await client.ledger_metadata(lh.ledger_id)
            dm = DigestManager(lh.ledger_id, md.digest_type, b"pw")
            for e in acked:
                _, ensemble = md.ensemble_for(e)
                for idx in md.write_set(e):
                    resp = await read_from_bookie(client, ensemble[idx], lh.ledger_id, e)
                    assert resp.status == Status.OK, (e, ensemble[idx], resp.status)
                    assert dm.verify(resp.entry, e).payload == b"payload-%d" % e

    run(main())


def test_restart_after_kill_9_of_every_bookie_keeps_every_ledger(matrix_cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = matrix_cluster_factory(3)
    cluster.start()

    async def write() -> tuple[int, int]:
        async with Client(metadata=cluster.metadata) as client:
            closed = await client.create_ledger(3, 3, 2, password=b"pw")
            await asyncio.gather(*(closed.append_async(b"c%d" % i) for i in range(3000)))
            await closed.close()
            open_ = await client.create_ledger(3, 2, 2, password=b"pw")
            await asyncio.gather(*(open_.append_async(b"o%d" % i) for i in range(3000)))
            return closed.ledger_id, open_.ledger_id

    closed_id, open_id = run(write())
    for i in range(3):
        cluster.kill(i)  # nothing was checkpointed: everything must come back from the journal
    cluster.start()

    async def check() -> None:
        async with Client(metadata=cluster.metadata) as client:
            rh = await client.open_ledger(closed_id, password=b"pw")
            assert [e.payload for e in await rh.read(0, 2999)] == [b"c%d" % i for i in range(3000)]
            rh2 = await client.open_ledger(open_id, password=b"pw", recovery=True)
            assert rh2.last_add_confirmed == 2999
            assert [e.payload for e in await rh2.read(0, 2999)] == [b"o%d" % i for i in range(3000)]

    run(check())


def test_bookie_refuses_to_start_on_cookie_mismatch(matrix_cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = matrix_cluster_factory(1)
    cluster.start()
    cluster.stop()
    cfg = cluster.config_path(0)
    cfg.write_text(cfg.read_text().replace('ledger_dirs = ["ledgers"]', 'ledger_dirs = ["ledgers", "more-ledgers"]'))
    if cluster.metadata_server:  # a sqlite bookie reaches its database through the metadata server
        cluster.start_metadata_server()
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "bookie", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "cookie" in out.stderr.lower() and "more-ledgers" in out.stderr


def test_standalone_restart_on_same_data_dir_keeps_ledgers(tmp_path: Path) -> None:
    port = consecutive_free_ports(3)  # --port-base: the 3 bookies listen on port, port + 1, port + 2
    cmd = [sys.executable, "-m", "ledgerstore", "standalone", "--bookies", "3", "--data-dir", str(tmp_path),
           "--port-base", str(port)]
    out = subprocess.run([*cmd, "--demo", "--demo-entries", "500"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo ok" in out.stdout and "metadata URI" in out.stdout
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # type: ignore[union-attr]
            if "serving" in line or time.monotonic() > deadline:
                break
        metadata = f"sqlite://{tmp_path.resolve() / 'metadata.db'}"

        async def check() -> None:
            async with Client(metadata=metadata) as client:
                ids = await client.list_ledgers()
                assert ids, "the demo's ledger is gone after a restart"
                rh = await client.open_ledger(ids[0], password=b"demo")
                assert len(await rh.read(0, rh.last_add_confirmed)) == 500

        run(check())
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C stops it cleanly
        assert proc.wait(60) == 0
