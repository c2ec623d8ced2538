"""Moving and saving a cluster's metadata (``shell metadata-copy``, ``metadata-export``,
``metadata-import``) on real servers: sqlite -> ZooKeeper -> etcd -> sqlite, then the bookies start
on the new store and every entry reads back."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

import ledgerstore
from ledgerstore.aio import Client
from ledgerstore.cluster import LocalCluster
from ledgerstore.plugins import create_metadata_store
from ledgerstore.recovery.markers import UnderReplicationManager
from ledgerstore.testing.servers import EtcdServer, ZooKeeperServer

from .test_cli import ls

PW = b"pw"


async def _next_ids(uri: str, counter: str, n: int) -> list[int]:
    store = create_metadata_store(uri)
    await store.start()
    try:
        return [await store.next_id(counter) for _ in range(n)]
    finally:
        await store.close()


def _write(cluster: LocalCluster) -> dict[int, list[bytes]]:
    """Ledgers of several shapes (closed, one left open), a log, a marker and a cluster setting."""
    written: dict[int, list[bytes]] = {}
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        for n, (e, w, a) in enumerate([(3, 3, 2), (3, 2, 2), (2, 2, 1), (1, 1, 1)]):
            lh = client.create_ledger(e, w, a, password=PW)
            written[lh.ledger_id] = [b"ledger %d entry %d" % (n, i) for i in range(20 + n)]
            for p in written[lh.ledger_id]:
                lh.append(p)
            lh.close()
        open_lh = client.create_ledger(3, 2, 2, password=PW)
        written[open_lh.ledger_id] = [b"open %d" % i for i in range(5)]
        for p in written[open_lh.ledger_id]:
            open_lh.append(p)

    async def extras() -> None:
        async with Client(metadata=cluster.metadata) as client:
            log = await client.open_log("events", password=PW)
            for i in range(7):
                await log.append(b"event %d" % i)
            await log.close()
            urm = UnderReplicationManager(client.store)
            await urm.mark(min(written), ["gone-bookie:1"])
            await urm.set_lost_bookie_delay(42)

    asyncio.run(extras())
    return written


def _read_all(metadata: str, ledger_ids: list[int]) -> dict[int, list[bytes]]:
    with ledgerstore.Client(metadata=metadata) as client:
        out = {}
        for lid in ledger_ids:
            rh = client.open_ledger(lid, PW)  # recovery closes the ledger left open
            out[lid] = [e.payload for e in rh.read(0, rh.last_add_confirmed)] if rh.last_add_confirmed >= 0 else []
        return out


def _point_bookies_at(cluster_dir: Path, bookies: int, metadata: str) -> LocalCluster:
    """As an operator does after moving the metadata: each bookie's config names the new store."""
    moved = LocalCluster(cluster_dir, bookies=bookies, port_base=None, metadata=metadata)
    for i in range(bookies):
        cfg = moved.config_path(i)
        lines = cfg.read_text().splitlines()
        cfg.write_text("\n".join(f'metadata = "{metadata}"' if ln.startswith("metadata =") else ln for ln in lines))
    return moved


def _copy(src: str, dst: str, check: bool = True) -> dict[str, object]:
    out = ls("shell", "metadata-copy", "--from", src, "--to", dst, "--json", check=check)
    return json.loads(out.stdout) if out.returncode == 0 else {"rc": out.returncode, "stderr": out.stderr}


def test_metadata_moves_sqlite_zookeeper_etcd_sqlite_and_every_entry_reads_back(
        tmp_path: Path, zookeeper_server: ZooKeeperServer, etcd_server: EtcdServer) -> None:
    data_dir = tmp_path / "cluster"
    cluster = LocalCluster(data_dir, bookies=3, port_base=None)
    try:
        cluster.start()
        written = _write(cluster)
        running = ls("shell", "metadata-copy", "--from", cluster.metadata, "--to", f"sqlite://{tmp_path}/x.db",
                     check=False)
        assert running.returncode == 1 and "registered" in running.stderr and "Traceback" not in running.stderr
        assert not (tmp_path / "x.db").exists()  # refused before the target was opened
    finally:
        cluster.stop()
    tag = uuid.uuid4().hex[:10]
    zk, etcd = zookeeper_server.uri(f"/move-{tag}"), etcd_server.uri(f"/move-{tag}")
    final = f"sqlite://{tmp_path}/final.db"
    hops = [_copy(cluster.metadata, zk), _copy(zk, etcd), _copy(etcd, final)]
    counts = [h["counts"] for h in hops]
    assert counts[0] == counts[1] == counts[2]
    assert counts[0]["ledgers"] == len(written) + 1  # type: ignore[index] # the log's ledger too
    assert counts[0]["cookies"] == 3 and counts[0]["logs"] == 1  # type: ignore[index]
    assert counts[0]["under-replication markers"] == 1  # type: ignore[index]
    assert len({h["instance_id"] for h in hops}) == 1
    # a target holding anything is refused
    again = _copy(cluster.metadata, zk, check=False)
    assert again["rc"] == 1 and "not empty" in str(again["stderr"])

    moved = _point_bookies_at(data_dir, 3, final)
    try:
        moved.start()  # the bookies' cookies match: the instance id and cookies came along
        assert _read_all(final, sorted(written)) == written

        async def rest() -> tuple[list[bytes], float | None, list[int], int]:
            async with Client(metadata=final) as client:
                reader = await client.open_log_reader("events", password=PW)
                events = [p for _, p in await reader.read_batch(100)]
                urm = UnderReplicationManager(client.store)
                new = await client.create_ledger(3, 2, 2, password=PW)
                await new.close()
                return events, await urm.lost_bookie_delay(), await urm.ledger_ids(), new.ledger_id

        events, delay, marked, new_id = asyncio.run(rest())
        assert events == [b"event %d" % i for i in range(7)]
        assert delay == 42 and marked == [min(written)]
        assert new_id > max(written)  # the ledger id counter came along: no id is handed out twice
    finally:
        moved.stop()


def test_metadata_export_and_import_through_a_file(tmp_path: Path, zookeeper_server: ZooKeeperServer) -> None:
    cluster = LocalCluster(tmp_path / "c", bookies=3, port_base=None)
    cluster.start()
    try:
        written = _write(cluster)
        refused = ls("shell", "--metadata", cluster.metadata, "metadata-export", "--to", str(tmp_path / "f.json"),
                     check=False)
        assert refused.returncode == 1 and "registered" in refused.stderr
    finally:
        cluster.stop()
    # five Kafka producer ids handed out before the move: none may be handed out again after it
    handed = asyncio.run(_next_ids(cluster.metadata, "kafka_producer_id", 5))
    backup = tmp_path / "backup.json"
    out = ls("shell", "--metadata", cluster.metadata, "metadata-export", "--to", str(backup))
    assert out.stdout.startswith("exported cluster ") and len(out.stdout.strip().splitlines()) == 1
    assert backup.stat().st_mode & 0o077 == 0
    target = zookeeper_server.uri(f"/import-{uuid.uuid4().hex[:10]}")
    imported = json.loads(ls("shell", "--metadata", target, "metadata-import", "--from", str(backup), "--json").stdout)
    assert imported["imported"] is True and imported["counts"]["ledgers"] == len(written) + 1
    assert asyncio.run(_next_ids(target, "kafka_producer_id", 1))[0] > max(handed)
    twice = ls("shell", "--metadata", target, "metadata-import", "--from", str(backup), check=False)
    assert twice.returncode == 1 and "not empty" in twice.stderr
    moved = _point_bookies_at(tmp_path / "c", 3, target)
    moved.start()
    try:
        assert _read_all(target, sorted(written)) == written
    finally:
        moved.stop()


@pytest.mark.parametrize("damage", ["flip", "truncate", "not-json", "other-version"])
def test_metadata_import_refuses_a_damaged_file_in_one_line(tmp_path: Path, damage: str) -> None:
    src = f"sqlite://{tmp_path}/src.db"
    ls("shell", "--metadata", src, "initnewcluster")
    backup = tmp_path / "b.json"
    ls("shell", "--metadata", src, "metadata-export", "--to", str(backup))
    text = backup.read_text()
    if damage == "flip":
        doc = json.loads(text)
        doc["keys"]["/LAYOUT"] = "Nw=="  # "7": differs from what any cluster holds
        text = json.dumps(doc)
    elif damage == "truncate":
        text = text[: len(text) // 2]
    elif damage == "not-json":
        text = "[bold]\x1b[31m"
    else:
        text = text.replace('"version": 1', '"version": 99')
    backup.write_text(text)
    out = ls("shell", "--metadata", f"sqlite://{tmp_path}/dst.db", "metadata-import", "--from", str(backup),
             check=False)
    assert out.returncode == 2 and str(backup) in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dst.db").exists()


def test_metadata_copy_of_a_store_without_a_cluster_is_refused(tmp_path: Path) -> None:
    missing = ls("shell", "metadata-copy", "--from", f"sqlite://{tmp_path}/none.db", "--to",
                 f"sqlite://{tmp_path}/t.db", check=False)
    assert missing.returncode == 1 and "no cluster" in missing.stderr
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "t.db").exists()
    same = ls("shell", "metadata-copy", "--from", f"sqlite://{tmp_path}/a.db", "--to", f"sqlite://{tmp_path}/a.db",
              check=False)
    assert same.returncode == 2


def test_metadata_import_into_a_running_cluster_is_refused(shared_cluster: LocalCluster, tmp_path: Path) -> None:
    src = f"sqlite://{tmp_path}/src.db"
    ls("shell", "--metadata", src, "initnewcluster")
    backup = tmp_path / "b.json"
    ls("shell", "--metadata", src, "metadata-export", "--to", str(backup))
    out = ls("shell", "--metadata", shared_cluster.metadata, "metadata-import", "--from", str(backup), check=False)
    assert out.returncode == 1 and "registered" in out.stderr and shared_cluster.bookie_id(0) in out.stderr


def test_metadata_copy_takes_each_store_from_a_config(tmp_path: Path) -> None:
    src, dst = f"sqlite://{tmp_path}/src.db", f"sqlite://{tmp_path}/dst.db"
    iid = json.loads(ls("shell", "--metadata", src, "initnewcluster", "--json").stdout)["instance_id"]
    client_toml = tmp_path / "client.toml"
    client_toml.write_text(f'[client]\nmetadata = "{src}"\n')
    bookie_toml = tmp_path / "bookie.toml"
    bookie_toml.write_text(f'[bookie]\nmetadata = "{dst}"\nlisten = "tcp://127.0.0.1:3181"\njournal_dir = "j"\n'
                           'ledger_dirs = ["l"]\n')
    out = json.loads(ls("shell", "metadata-copy", "--from-config", str(client_toml), "--to-config", str(bookie_toml),
                        "--json").stdout)
    assert out["copied"] is True and out["instance_id"] == iid and out["target"] == dst
    assert json.loads(ls("shell", "--metadata", dst, "whatisinstanceid", "--json").stdout)["instance_id"] == iid
    neither = ls("shell", "metadata-copy", "--to", f"sqlite://{tmp_path}/x.db", check=False)
    assert neither.returncode == 2 and "--from-config" in neither.stderr
