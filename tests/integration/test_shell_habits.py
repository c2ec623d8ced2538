"""BookKeeper shell habits through the real CLI: single-dash long flags, its command names and flags."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import ledgerstore
from ledgerstore.cli.shell import normalize_bookkeeper_flags
from ledgerstore.cluster import LocalCluster
from ledgerstore.proto.digest import DigestManager, normalize_digest_type

from .test_cli import shell


@pytest.fixture(scope="module")
def closed_ledger(shared_cluster: LocalCluster) -> int:
    import ledgerstore

    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        lh = client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(3):
            lh.append(b"e%d" % i)
        lh.close()
    return int(lh.ledger_id)


def test_single_dash_long_flags_are_rewritten_and_others_kept() -> None:
    assert normalize_bookkeeper_flags(["-ledgerid", "4", "-deleteCookie", "-l", "5", "-bookieid=b:1", "x"]) == [
        "--ledgerid", "4", "--delete-cookie", "-l", "5", "--bookieid=b:1", "x"]


def test_bookkeeper_single_dash_flags_work_beside_ours(shared_cluster: LocalCluster, closed_ledger: int) -> None:
    bk = json.loads(shell(shared_cluster, "ledgermetadata", "-ledgerid", str(closed_ledger), "--json").stdout)
    ours = json.loads(shell(shared_cluster, "ledgermetadata", "--ledgerid", str(closed_ledger), "--json").stdout)
    assert bk == ours and bk["state"] == "CLOSED"


def test_unknown_flag_fails_with_a_message_naming_it(shared_cluster: LocalCluster) -> None:
    out = shell(shared_cluster, "listbookies", "-nosuchflag", check=False)
    assert out.returncode == 2 and "-nosuchflag" in out.stderr


def test_readledger_past_the_end_stops_at_the_last_entry(shared_cluster: LocalCluster, closed_ledger: int) -> None:
    rows = json.loads(shell(shared_cluster, "readledger", "-ledgerid", str(closed_ledger), "-p", "pw",
                            "-firstentryid", "1", "-lastentryid", "100", "--json").stdout)
    assert [r["entry_id"] for r in rows] == [1, 2]


def test_listledgers_bookieid_lists_only_ledgers_on_that_bookie(shared_cluster: LocalCluster,
                                                               closed_ledger: int) -> None:
    md = json.loads(shell(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), "--json").stdout)
    on = md["ensembles"][0][1][0]
    rows = json.loads(shell(shared_cluster, "listledgers", "-bookieid", on, "--json").stdout)
    assert closed_ledger in [r["ledger_id"] for r in rows]
    assert json.loads(shell(shared_cluster, "listledgers", "-bookieid", "nosuch:1", "--json").stdout) == []


def test_listbookies_all_and_hostnames(shared_cluster: LocalCluster) -> None:
    rows = json.loads(shell(shared_cluster, "listbookies", "-a", "-h", "--json").stdout)
    assert {r["bookie_id"] for r in rows} == {shared_cluster.bookie_id(i) for i in range(3)}
    assert all(r["hostname"] for r in rows)


def test_bookieinfo_reports_each_bookie_and_the_total(shared_cluster: LocalCluster) -> None:
    rows = json.loads(shell(shared_cluster, "bookieinfo", "--json").stdout)
    assert {r["bookie_id"] for r in rows} == {shared_cluster.bookie_id(i) for i in range(3)}
    assert all(r["total_bytes"] >= r["free_bytes"] >= 0 for r in rows)
    assert "total free space" in shell(shared_cluster, "bookieinfo").stdout


def test_queryautorecoverystatus_with_nothing_under_replicated(shared_cluster: LocalCluster) -> None:
    assert json.loads(shell(shared_cluster, "queryautorecoverystatus", "--json").stdout) == []
    assert "no ledgers under replication" in shell(shared_cluster, "queryautorecoverystatus", "-v").stdout


def test_forceauditchecks_writes_a_replicas_trigger(shared_cluster: LocalCluster) -> None:
    import asyncio

    from ledgerstore.aio import Client
    from ledgerstore.recovery.markers import UnderReplicationManager

    async def last_trigger() -> dict[str, object]:
        async with Client(metadata=shared_cluster.metadata) as client:
            return await UnderReplicationManager(client.store).audit_trigger()  # type: ignore[no-any-return]

    out = json.loads(shell(shared_cluster, "forceauditchecks", "-rc", "--json").stdout)
    assert out["triggered"] and out["replicas"]
    assert asyncio.run(last_trigger())["replicas"] is True
    shell(shared_cluster, "forceauditchecks")
    assert asyncio.run(last_trigger())["replicas"] is False
    assert json.loads(shell(shared_cluster, "triggeraudit", "--replicas", "--json").stdout)["replicas"] is True


@pytest.mark.parametrize(("bk", "ours"), [("CRC32", "crc32"), ("CRC32C", "crc32c"), ("MAC", "hmac-sha256"),
                                          ("DUMMY", "none"), ("crc32c", "crc32c"), ("hmac-sha256", "hmac-sha256")])
def test_bookkeeper_digest_names_mean_ours(bk: str, ours: str) -> None:
    assert normalize_digest_type(bk) == ours
    assert DigestManager(1, bk, b"pw").digest_type == ours


def test_shell_config_takes_the_metadata_uri_from_a_bookie_config(shared_cluster: LocalCluster) -> None:
    from .test_cli import ls

    rows = json.loads(ls("shell", "--config", str(shared_cluster.config_path(0)), "listbookies", "--json").stdout)
    assert {r["bookie_id"] for r in rows} == {shared_cluster.bookie_id(i) for i in range(3)}


def test_recover_query_and_dryrun_list_ledgers_and_copy_nothing(shared_cluster: LocalCluster,
                                                                closed_ledger: int) -> None:
    md = json.loads(shell(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), "--json").stdout)
    bookie = md["ensembles"][0][1][0]
    for flag in ("-q", "-dr"):
        rows = json.loads(shell(shared_cluster, "recover", bookie, flag, "--json").stdout)
        assert {"ledger_id": closed_ledger, "state": "CLOSED", "fragments": 1} in rows
    after = json.loads(shell(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), "--json").stdout)
    assert after["ensembles"] == md["ensembles"]


def test_metaformat_refuses_an_existing_cluster_unless_forced(cluster_factory: Callable[..., LocalCluster]) -> None:
    from .test_cli import ls

    cluster = cluster_factory(1)
    cluster.start()
    old = json.loads(shell(cluster, "whatisinstanceid", "--json").stdout)["instance_id"]
    assert json.loads(shell(cluster, "listbookies", "--json").stdout)  # registered bookies are existing data
    refused = shell(cluster, "metaformat", "-nonInteractive", check=False)
    assert refused.returncode == 1 and "-f" in refused.stdout + refused.stderr
    declined = ls("shell", "--metadata", cluster.metadata, "metaformat", check=False, input="n\n")
    assert declined.returncode == 1
    assert json.loads(shell(cluster, "whatisinstanceid", "--json").stdout)["instance_id"] == old
    new = json.loads(shell(cluster, "metaformat", "-n", "-f", "--json").stdout)
    assert new["erased_instance_id"] == old and new["instance_id"] not in (None, old)
    assert json.loads(shell(cluster, "whatisinstanceid", "--json").stdout)["instance_id"] == new["instance_id"]


def test_initbookie_refuses_a_running_or_used_bookie_and_prepares_a_new_one(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    import signal

    from .test_cli import ls

    cluster = cluster_factory(1)
    cluster.start()
    out = ls("shell", "initbookie", "--config", str(cluster.config_path(0)), check=False)
    assert out.returncode == 1 and "initbookie refused" in out.stdout + out.stderr  # the bookie holds its dirs
    cluster.kill(0, signal.SIGTERM)
    out = ls("shell", "initbookie", "--config", str(cluster.config_path(0)), check=False)
    assert out.returncode == 1 and "not empty" in out.stdout + out.stderr
    i = cluster.add_bookie()
    r = json.loads(ls("shell", "initbookie", "--config", str(cluster.config_path(i)), "--json").stdout)
    assert r["bookie_id"] == cluster.bookie_id(i) and all(Path(d).is_dir() for d in r["initialised"])


def test_listbookies_ledger_counts_follow_new_ledgers(cluster_factory: Callable[..., LocalCluster]) -> None:
    import ledgerstore

    cluster = cluster_factory(3)
    cluster.start()

    def counts() -> dict[str, int]:
        return {r["bookie_id"]: r["ledger_count"] for r in json.loads(shell(cluster, "listbookies", "--json").stdout)}

    before = counts()
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        for _ in range(2):
            client.create_ledger(3, 3, 3, password=b"pw").close()
    assert counts() == {b: n + 2 for b, n in before.items()}
    info = {r["bookie_id"]: r["ledger_count"] for r in json.loads(shell(cluster, "bookieinfo", "--json").stdout)}
    assert info == counts()


def test_endpointinfo_names_a_bookies_endpoint_and_exits_3_for_an_unknown_one(shared_cluster: LocalCluster) -> None:
    b = shared_cluster.bookie_id(0)
    r = json.loads(shell(shared_cluster, "endpointinfo", "-bookieid", b, "--json").stdout)
    assert r["registered"] and r["endpoint"] and r["state"] == "writable"
    assert shell(shared_cluster, "endpointinfo", "-b", "nosuch:1", check=False).returncode == 3


def test_updatecookie_expands_storage_of_a_stopped_bookie_and_refuses_a_running_one(
        cluster_factory: Callable[..., LocalCluster]) -> None:
    import signal

    from .test_cli import ls

    cluster = cluster_factory(1)
    cluster.start()
    cfg = cluster.config_path(0)
    out = ls("shell", "updatecookie", "--config", str(cfg), "-expandstorage", check=False)
    assert out.returncode == 1 and "updatecookie refused" in out.stdout + out.stderr  # the bookie holds its dirs
    cluster.kill(0, signal.SIGTERM)
    cfg.write_text(cfg.read_text().replace('ledger_dirs = ["ledgers"]', 'ledger_dirs = ["ledgers", "ledgers2"]'))
    generated = json.loads(ls("shell", "generatecookie", "--config", str(cfg), "--json").stdout)
    assert len(generated["ledger_dirs"]) == 2
    r = json.loads(ls("shell", "updatecookie", "--config", str(cfg), "-e", "--json").stdout)
    assert r["added"] == [str(cfg.parent / "ledgers2")] and len(r["ledger_dirs"]) == 2
    listed = json.loads(ls("shell", "updatecookie", "--config", str(cfg), "--list", "--json").stdout)
    assert listed["local"]["ledger_dirs"] == listed["registered"]["ledger_dirs"] == generated["ledger_dirs"]
    cluster.start_bookie(0)
    cluster.wait_registered([0])  # the bookie accepts its expanded storage


def test_a_ledger_created_with_a_bookkeeper_digest_name_uses_our_digest(shared_cluster: LocalCluster) -> None:
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        lh = client.create_ledger(3, 2, 2, digest="MAC", password=b"pw")
        lh.append(b"signed")
        lh.close()
        assert lh.metadata.digest_type == "hmac-sha256"
        rh = client.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.payload for e in rh.read(0, 0)] == [b"signed"]


def test_the_shell_refuses_a_metadata_uri_holding_no_cluster_and_creates_nothing(tmp_path: Path) -> None:
    from .test_cli import ls

    typo = tmp_path / "metdata.db"
    out = ls("shell", "--metadata", f"sqlite://{typo}", "listbookies", check=False)
    assert out.returncode != 0
    assert "no cluster" in out.stderr.lower() or "does not exist" in out.stderr.lower(), out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not typo.exists()
    # initnewcluster is the command that creates one, and then the shell works there
    fresh = f"sqlite://{tmp_path / 'new.db'}"
    ls("shell", "--metadata", fresh, "initnewcluster")
    assert json.loads(ls("shell", "--metadata", fresh, "listbookies", "--json").stdout) == []
