"""Every shell command against a real cluster, in table and JSON form, with meaningful exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.cluster import LocalCluster


def ls(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "ledgerstore", *args], capture_output=True, text=True, timeout=120,
                         input=input)
    if check and out.returncode != 0:
        raise AssertionError(f"ledgerstore {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def shell(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return ls("shell", "--metadata", cluster.metadata, *args, check=check)


def test_simpletest(shared_cluster: LocalCluster) -> None:
    out = shell(shared_cluster, "simpletest", "--entries", "200")
    assert "simpletest ok" in out.stdout
    data = json.loads(shell(shared_cluster, "simpletest", "-e", "3", "-w", "3", "-a", "2", "--json").stdout)
    assert data["result"] == "ok" and len(data["ensemble"]) == 3


def test_listbookies(shared_cluster: LocalCluster) -> None:
    rows = json.loads(shell(shared_cluster, "listbookies", "--json").stdout)
    assert {r["bookie_id"] for r in rows} == {shared_cluster.bookie_id(i) for i in range(3)}
    assert all(r["state"] == "writable" for r in rows)
    assert json.loads(shell(shared_cluster, "listbookies", "-ro", "--json").stdout) == []
    assert shared_cluster.bookie_id(0) in shell(shared_cluster, "listbookies").stdout


def test_ledger_commands(shared_cluster: LocalCluster) -> None:
    import ledgerstore

    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        lh = client.create_ledger(3, 2, 2, password=b"secret")
        for i in range(5):
            lh.append(b"hello %d" % i)
        lh.close()
    lid = lh.ledger_id
    rows = json.loads(shell(shared_cluster, "listledgers", "-m", "--json").stdout)
    assert any(r["ledger_id"] == lid and r["state"] == "CLOSED" and r["last_entry_id"] == 4 for r in rows)
    md = json.loads(shell(shared_cluster, "ledgermetadata", "-l", str(lid), "--json").stdout)
    assert md["state"] == "CLOSED" and md["ensemble_size"] == 3 and md["last_entry_id"] == 4
    assert "CLOSED" in shell(shared_cluster, "ledgermetadata", "-l", str(lid)).stdout
    entries = json.loads(shell(shared_cluster, "readledger", "-l", str(lid), "-p", "secret", "--json").stdout)
    assert [e["payload"] for e in entries] == [f"hello {i}" for i in range(5)]
    hexed = json.loads(shell(shared_cluster, "readledger", "-l", str(lid), "-p", "secret", "-fe", "1", "-le", "1",
                             "--format", "hex", "--json").stdout)
    assert hexed == [{"entry_id": 1, "lac": hexed[0]["lac"], "size": 7, "payload": b"hello 1".hex()}]
    wrong = shell(shared_cluster, "readledger", "-l", str(lid), "-p", "nope", check=False)
    assert wrong.returncode == 1 and "UnauthorizedAccessError" in wrong.stderr
    assert json.loads(shell(shared_cluster, "deleteledger", "-l", str(lid), "-f", "--json").stdout)["deleted"]
    missing = shell(shared_cluster, "ledgermetadata", "-l", str(lid), check=False)
    assert missing.returncode == 3 and "does not exist" in missing.stderr


def test_deleteledger_asks_unless_forced(shared_cluster: LocalCluster) -> None:
    import ledgerstore

    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        lid = client.create_ledger(3, 2, 2).ledger_id
    out = ls("shell", "--metadata", shared_cluster.metadata, "deleteledger", "-l", str(lid), check=False, input="n\n")
    assert out.returncode != 0
    assert any(r["ledger_id"] == lid for r in json.loads(shell(shared_cluster, "listledgers", "--json").stdout))


def test_whatisinstanceid(shared_cluster: LocalCluster) -> None:
    iid = json.loads(shell(shared_cluster, "whatisinstanceid", "--json").stdout)["instance_id"]
    assert len(iid) == 36


def test_missing_metadata_is_a_usage_error() -> None:
    out = ls("shell", "listbookies", check=False)
    assert out.returncode == 2 and "--metadata" in out.stderr


def test_config_check(tmp_path: Path) -> None:
    good = tmp_path / "bookie.toml"
    good.write_text('[bookie]\nmetadata = "sqlite:///x.db"\nstorage = "rocksdb"\n')
    out = ls("config", "check", str(good))
    assert 'storage = "rocksdb"' in out.stdout and "journal_dir" in out.stdout
    assert json.loads(ls("config", "check", str(good), "--json").stdout)["storage"] == "rocksdb"
    bad = tmp_path / "bad.toml"
    bad.write_text('[bookie]\nmetadata = "sqlite:///x.db"\nflush_interval_ms = "soon"\n')
    out = ls("config", "check", str(bad), check=False)
    assert out.returncode == 2 and "flush_interval_ms" in out.stderr and str(bad) in out.stderr


@pytest.mark.parametrize("cmd", [[], ["shell"], ["standalone"], ["bookie"], ["plugins"], ["config", "check"],
                                 ["shell", "simpletest"], ["shell", "readledger"]])
def test_help_everywhere(cmd: list[str]) -> None:
    assert "Usage:" in ls(*cmd, "--help").stdout


def test_bookiesanity(shared_cluster: LocalCluster) -> None:
    r = json.loads(shell(shared_cluster, "bookiesanity", "-b", shared_cluster.bookie_id(1), "--json").stdout)
    assert r == {"bookie": shared_cluster.bookie_id(1), "entries": 10, "result": "ok"}
    out = ls("shell", "bookiesanity", "--bookie-config", str(shared_cluster.config_path(2)))
    assert "succeeded" in out.stdout


def test_storage_tools_on_a_stopped_bookie(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    import ledgerstore

    cluster: LocalCluster = cluster_factory(3)
    cluster.start()
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        keep = client.create_ledger(3, 3, 3, password=b"pw")
        for i in range(50):
            keep.append(b"keep %d" % i)
        keep.close()
        drop = client.create_ledger(3, 3, 3, password=b"pw")
        for _ in range(50):
            drop.append(b"x" * 1000)
        drop.close()
        client.delete_ledger(drop.ledger_id)
    cluster.stop()
    cfg = str(cluster.config_path(0))
    mark = json.loads(ls("shell", "lastmark", "--config", cfg, "--json").stdout)
    assert mark["journal_file_id"] >= 1 and mark["offset"] > 0
    files = json.loads(ls("shell", "listfilesondisc", "--config", cfg, "--json").stdout)
    kinds = {f["kind"] for f in files}
    assert kinds == {"journal", "ledgers"} and any(f["path"].endswith(".log") for f in files)
    records = json.loads(ls("shell", "readjournal", "--config", cfg, "--json").stdout)
    assert any(r["type"] == "MASTER_KEY" for r in records)  # the journal since the last mark
    check = json.loads(ls("shell", "localconsistencycheck", "--config", cfg, "--json").stdout)
    assert check["ok"] and check["entries_checked"] >= 50
    logs = [f["path"] for f in files if f["path"].endswith(".log") and "entrylog-" in f["path"]]
    scan = json.loads(ls("shell", "readlog", logs[0], "-l", str(keep.ledger_id), "--json").stdout)
    assert scan["clean"] and len(scan["records"]) == 50
    gc = json.loads(ls("shell", "gc", "--config", cfg, "--major", "--json").stdout)
    assert drop.ledger_id in gc["deleted_ledgers"]
    check = json.loads(ls("shell", "localconsistencycheck", "--config", cfg, "--json").stdout)
    assert check["ok"]
    out = ls("shell", "bookieformat", "--config", cfg, "--delete-cookie", "-f", "--json")
    assert json.loads(out.stdout)["cookie_deleted"]
    cluster.start_bookie(0)  # a formatted bookie joins afresh
    cluster.wait_registered([0])


def test_autorecovery_admin_commands(shared_cluster: LocalCluster) -> None:
    assert json.loads(shell(shared_cluster, "autorecovery", "--disable", "--json").stdout) == {"enabled": False}
    assert "disabled" in shell(shared_cluster, "autorecovery").stdout
    assert json.loads(shell(shared_cluster, "autorecovery", "--enable", "--json").stdout) == {"enabled": True}
    delay = json.loads(shell(shared_cluster, "lostbookierecoverydelay", "--set", "7.5", "--json").stdout)
    assert delay == {"lost_bookie_recovery_delay_s": 7.5}
    assert "7.5s" in shell(shared_cluster, "lostbookierecoverydelay").stdout
    cleared = json.loads(shell(shared_cluster, "lostbookierecoverydelay", "--clear", "--json").stdout)
    assert cleared == {"lost_bookie_recovery_delay_s": None}
    bad = shell(shared_cluster, "lostbookierecoverydelay", "--set", "-1", check=False)
    assert bad.returncode == 2
    trig = json.loads(shell(shared_cluster, "triggeraudit", "--json").stdout)
    assert trig["triggered"] is True and trig["auditor"] is None  # these bookies run no auto-recovery
    assert json.loads(shell(shared_cluster, "listunderreplicated", "--json").stdout) == []
