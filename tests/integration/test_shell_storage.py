"""The shell's offline storage readers through the real CLI: readlogmetadata, activeledgers and
ledger (index dump), against the storage real bookies wrote."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import ledgerstore
from ledgerstore.cluster import LocalCluster

from .test_cli import ls, shell

PAYLOADS = [b"x" * (10 * (i + 1)) for i in range(5)]


def write_ledgers(cluster: LocalCluster, n: int) -> list[int]:
    ids = []
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        for _ in range(n):
            lh = client.create_ledger(1, 1, 1, password=b"pw")
            for p in PAYLOADS:
                lh.append(p)
            lh.close()
            ids.append(int(lh.ledger_id))
    return ids


def with_a_deleted_ledger(cluster_factory: Callable[..., LocalCluster]) -> tuple[LocalCluster, list[int], str]:
    """A running one-bookie cluster holding two ledgers, the second deleted; and the bookie's config."""
    cluster = cluster_factory(1)
    cluster.start()
    ids = write_ledgers(cluster, 2)
    shell(cluster, "deleteledger", "-l", str(ids[1]), "-f")
    return cluster, ids, str(cluster.config_path(0))


def entry_logs(cluster: LocalCluster) -> list[Path]:
    return sorted((cluster.config_path(0).parent / "ledgers" / "current").glob("entrylog-*.log"))


@pytest.mark.parametrize("storage", ["entrylog", "rocksdb"])
def test_ledger_dumps_the_index_of_a_stopped_bookie_and_is_refused_while_it_runs(
        cluster_factory: Callable[..., LocalCluster], storage: str) -> None:
    cluster = cluster_factory(1, storage=storage)
    cluster.start()
    (lid,) = write_ledgers(cluster, 1)
    cfg = str(cluster.config_path(0))
    refused = ls("shell", "ledger", "--config", cfg, str(lid), check=False)
    assert refused.returncode == 1 and "ledger refused" in refused.stderr, refused.stderr  # names the lock holder
    cluster.kill(0, signal.SIGTERM)
    r = json.loads(ls("shell", "ledger", "--config", cfg, str(lid), "--json").stdout)
    assert r["engine"] == storage and r["has_master_key"] and not r["fenced"] and r["entries"] == len(PAYLOADS)
    assert [e["entry_id"] for e in r["index"]] == list(range(len(PAYLOADS)))
    sizes = [e["size"] for e in r["index"]]  # each stored entry is its payload plus the same header and digest
    assert [b - a for a, b in zip(sizes, sizes[1:], strict=False)] == [10] * (len(PAYLOADS) - 1)
    if storage == "entrylog":
        assert all(e["offset"] >= 16 for e in r["index"])  # past the entry log header
    meta = json.loads(ls("shell", "ledger", "--config", cfg, str(lid), "-m", "--json").stdout)
    assert "index" not in meta and meta["entries"] == len(PAYLOADS)
    assert "index entries" in ls("shell", "ledger", "--config", cfg, str(lid)).stdout
    assert ls("shell", "ledger", "--config", cfg, str(lid + 1000), check=False).returncode == 3


def test_readlogmetadata_lists_an_entry_logs_ledgers_and_remaining_size(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster, ids, cfg = with_a_deleted_ledger(cluster_factory)
    cluster.kill(0, signal.SIGTERM)  # the engine finishes its log: it gets its ledger map
    ls("shell", "gc", "--config", cfg)  # drops the deleted ledger's index; half the log is live: it stays
    log = entry_logs(cluster)[0]
    log_id = int(log.name[9:17], 16)
    r = json.loads(ls("shell", "readlogmetadata", "--config", cfg, "-logId", str(log_id), "--json").stdout)
    assert r["source"] == "ledger map" and r["log_id"] == log_id and not r["damaged"]
    sizes = {row["ledger_id"]: row["size"] for row in r["ledgers"]}
    assert set(sizes) == set(ids) and sizes[ids[0]] == sizes[ids[1]] > sum(map(len, PAYLOADS))
    assert r["total_size"] == sum(sizes.values())
    assert r["remaining_size"] == sizes[ids[0]]  # the deleted ledger's index is gone: its bytes are garbage
    by_file = json.loads(ls("shell", "readlogmetadata", "--config", cfg, "-logFilename", str(log), "--json").stdout)
    assert by_file == r
    # without its ledger map (a log that was active at a crash), the log is scanned: same facts
    log.with_suffix(".lmap").unlink()
    scanned = json.loads(ls("shell", "readlogmetadata", "--config", cfg, "-l", hex(log_id), "--json").stdout)
    assert scanned["source"] == "scan" and scanned["ledgers"] == r["ledgers"] and scanned["total_size"] == r["total_size"]
    assert "remaining size" in ls("shell", "readlogmetadata", "--config", cfg, "-logId", str(log_id)).stdout
    assert ls("shell", "readlogmetadata", "--config", cfg, "-logId", "999", check=False).returncode == 3


def test_readlogmetadata_reads_a_running_bookies_finished_log(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1)
    cluster.start()
    (lid,) = write_ledgers(cluster, 1)
    cluster.kill(0, signal.SIGTERM)
    cluster.restart(0)  # the old log stays finished; a new one takes new entries
    log = entry_logs(cluster)[0]
    r = json.loads(ls("shell", "readlogmetadata", "--config", str(cluster.config_path(0)), "-f", str(log),
                      "--json").stdout)
    assert [row["ledger_id"] for row in r["ledgers"]] == [lid]


def test_activeledgers_lists_ledgers_of_a_log_and_of_a_bookie_still_in_the_metadata(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster, ids, cfg = with_a_deleted_ledger(cluster_factory)
    on_bookie = json.loads(shell(cluster, "activeledgers", "-bookieid", cluster.bookie_id(0), "--json").stdout)
    assert [r["ledger_id"] for r in on_bookie] == [ids[0]]
    assert json.loads(shell(cluster, "activeledgers", "-bookieid", "nosuch:1", "--json").stdout) == []
    cluster.kill(0, signal.SIGTERM)
    log = entry_logs(cluster)[0]
    rows = json.loads(ls("shell", "activeledgers", "--config", cfg, "-logId", str(int(log.name[9:17], 16)),
                         "--json").stdout)
    assert [r["ledger_id"] for r in rows] == [ids[0]] and rows[0]["size"] > 0
    # the bookie's config alone: its own id
    mine = json.loads(ls("shell", "activeledgers", "--config", cfg, "--json").stdout)
    assert [r["ledger_id"] for r in mine] == [ids[0]]
