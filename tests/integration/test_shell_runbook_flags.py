"""BookKeeper runbook flags through the real CLI, one test per flag, as BookKeeper's shell spells
them (single-dash long names) and in their short forms; and payloads printed as data."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerstore
from ledgerstore.cluster import LocalCluster

from .test_cli import ls, shell

HOSTILE = [b"[/x]", b"[bold]loud[/bold]", b"\x1b[31mred\x1b[0m\x1b]0;title\x07", b"\xff\xfe\x00", b"two\nlines\r",
           "caf\u00e9 \u202eevil".encode()]


def _write_ledger(cluster: LocalCluster, payloads: list[bytes]) -> int:
    """A closed ledger (password ``pw``) holding ``payloads``."""
    with ledgerstore.Client(metadata=cluster.metadata) as client:
        lh = client.create_ledger(3, 2, 2, password=b"pw")
        for p in payloads:
            lh.append(p)
        lh.close()
    return int(lh.ledger_id)


@pytest.fixture(scope="module")
def closed_ledger(shared_cluster: LocalCluster) -> int:
    return _write_ledger(shared_cluster, [b"e0", b"e1", b"e2"])


@pytest.fixture(scope="module")
def hostile_ledger(shared_cluster: LocalCluster) -> int:
    return _write_ledger(shared_cluster, HOSTILE)


def _json(cluster: LocalCluster, *args: str) -> object:
    return json.loads(shell(cluster, *args, "--json").stdout)


# --- simpletest ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "value", "field"), [("-ensemble", "2", "ensemble"), ("-numEntries", "7", "entries")])
def test_simpletest_long_flags_set_ensemble_and_entries(shared_cluster: LocalCluster, flag: str, value: str,
                                                        field: str) -> None:
    r = _json(shared_cluster, "simpletest", flag, value, "-writeQuorum", "2", "-ackQuorum", "1")
    assert isinstance(r, dict) and r["result"] == "ok"
    assert (len(r["ensemble"]) if field == "ensemble" else r["entries"]) == int(value)


def test_simpletest_write_quorum_larger_than_ensemble_is_refused(shared_cluster: LocalCluster) -> None:
    out = shell(shared_cluster, "simpletest", "-ensemble", "2", "-writeQuorum", "3", "-numEntries", "1", check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr


def test_simpletest_ack_quorum_is_used(shared_cluster: LocalCluster) -> None:
    bad = shell(shared_cluster, "simpletest", "-e", "2", "-w", "2", "-ackQuorum", "3", check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "simpletest ok" in shell(shared_cluster, "simpletest", "-e", "3", "-w", "3", "-ackQuorum", "3").stdout


# --- ledgermetadata -dumptofile / -restorefromfile [-update] --------------------------------------


def test_ledgermetadata_dumptofile_and_restorefromfile(shared_cluster: LocalCluster, closed_ledger: int,
                                                       tmp_path: Path) -> None:
    dump = tmp_path / "md.bin"
    shown = _json(shared_cluster, "ledgermetadata", "-ledgerid", str(closed_ledger), "-dumptofile", str(dump))
    assert isinstance(shown, dict) and shown["ledger_id"] == closed_ledger
    assert stat.S_IMODE(os.stat(dump).st_mode) == 0o600
    # the metadata is lost (the bookies keep the entries: their GC runs every 15 minutes) ...
    from ledgerstore.aio import Client

    async def lose() -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            await client.ledgers.delete(closed_ledger)

    asyncio.run(lose())
    assert shell(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), check=False).returncode == 3
    # ... and restored from the dump: the ledger reads back as before
    restored = _json(shared_cluster, "ledgermetadata", "-ledgerid", str(closed_ledger), "-restorefromfile", str(dump))
    assert isinstance(restored, dict)
    assert {k: v for k, v in restored.items() if k != "version"} == {k: v for k, v in shown.items() if k != "version"}
    rows = _json(shared_cluster, "readledger", "-l", str(closed_ledger), "-p", "pw")
    assert [r["payload"] for r in rows] == ["e0", "e1", "e2"]  # type: ignore[index]
    again = shell(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), "-restorefromfile", str(dump), check=False)
    assert again.returncode == 1 and "-update" in again.stderr
    updated = _json(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), "-restorefromfile", str(dump), "-update")
    assert isinstance(updated, dict) and updated["version"] != restored["version"]


def test_ledgermetadata_restorefromfile_refuses_a_file_that_is_not_a_dump(shared_cluster: LocalCluster,
                                                                         tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"[bold]not metadata")
    out = shell(shared_cluster, "ledgermetadata", "-l", "424242", "-restorefromfile", str(junk), check=False)
    assert out.returncode == 2 and str(junk) in out.stderr and len(out.stderr.strip().splitlines()) == 1
    both = shell(shared_cluster, "ledgermetadata", "-l", "1", "-dumptofile", str(junk), "-restorefromfile", str(junk),
                 check=False)
    assert both.returncode == 2


# --- readledger -msg, -force-recovery, and payloads as data ---------------------------------------


def test_readledger_msg_prints_payloads_as_escaped_text(shared_cluster: LocalCluster, hostile_ledger: int) -> None:
    out = shell(shared_cluster, "readledger", "-ledgerid", str(hostile_ledger), "-p", "pw", "-msg")
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\u202e" not in out.stdout
    for shown in ("[/x]", "[bold]loud[/bold]", "\\x1b[31mred\\x1b[0m\\x1b]0;title\\x07", "\\xff\\xfe\\x00",
                  "two\\nlines\\r", "café \\u202eevil"):
        assert shown in out.stdout
    assert "Traceback" not in out.stderr


def test_readledger_json_payloads_are_the_same_escaped_text(shared_cluster: LocalCluster, hostile_ledger: int) -> None:
    rows = _json(shared_cluster, "readledger", "-l", str(hostile_ledger), "-p", "pw", "-m")
    assert [r["payload"] for r in rows] == [  # type: ignore[index]
        "[/x]", "[bold]loud[/bold]", "\\x1b[31mred\\x1b[0m\\x1b]0;title\\x07", "\\xff\\xfe\\x00", "two\\nlines\\r",
        "café \\u202eevil"]


@pytest.mark.parametrize("fmt", ["hex", "base64"])
def test_readledger_hex_and_base64_give_the_exact_bytes(shared_cluster: LocalCluster, hostile_ledger: int,
                                                        fmt: str) -> None:
    import base64

    rows = _json(shared_cluster, "readledger", "-l", str(hostile_ledger), "-p", "pw", "--format", fmt)
    decode = bytes.fromhex if fmt == "hex" else base64.b64decode
    assert [decode(r["payload"]) for r in rows] == HOSTILE  # type: ignore[index]
    table = shell(shared_cluster, "readledger", "-l", str(hostile_ledger), "-p", "pw", "--format", fmt).stdout
    assert "\x1b" not in table


def test_readledger_msg_does_not_go_with_hex(shared_cluster: LocalCluster, hostile_ledger: int) -> None:
    out = shell(shared_cluster, "readledger", "-l", str(hostile_ledger), "-p", "pw", "-msg", "--format", "hex",
                check=False)
    assert out.returncode == 2 and "-msg" in out.stderr


def test_readledger_force_recovery_closes_an_open_ledger(shared_cluster: LocalCluster) -> None:
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        lh = client.create_ledger(3, 2, 2, password=b"pw")
        lh.append(b"only")
        rows = _json(shared_cluster, "readledger", "-l", str(lh.ledger_id), "-p", "pw", "-force-recovery")
        assert [r["payload"] for r in rows] == ["only"]  # type: ignore[index]
        md = _json(shared_cluster, "ledgermetadata", "-l", str(lh.ledger_id))
        assert isinstance(md, dict) and md["state"] == "CLOSED"


def test_readledger_bookie_reads_only_that_bookies_copy(shared_cluster: LocalCluster, closed_ledger: int,
                                                        tmp_path: Path) -> None:
    md = _json(shared_cluster, "ledgermetadata", "-l", str(closed_ledger))
    ensemble = md["ensembles"][0][1]  # type: ignore[index]
    for i, bookie in enumerate(ensemble):
        # E=3, W=2: entry e is on ensemble[e % 3] and ensemble[(e + 1) % 3]
        held = [e for e in range(3) if i in (e % 3, (e + 1) % 3)]
        rows = _json(shared_cluster, "readledger", "-l", str(closed_ledger), "-p", "pw", "-bookie", bookie)
        assert [(r["entry_id"], r["status"], r["payload"]) for r in rows] == [  # type: ignore[index]
            (e, "ok", f"e{e}") for e in held]
        short = _json(shared_cluster, "readledger", "-l", str(closed_ledger), "-p", "pw", "-b", bookie)
        assert [r["entry_id"] for r in short] == held  # type: ignore[index, union-attr]
    outsider = shell(shared_cluster, "readledger", "-l", str(closed_ledger), "-p", "pw", "-b", "nosuch:1", check=False)
    assert outsider.returncode == 1 and "holds no fragment" in outsider.stderr
    # metadata naming the bookie for a ledger it never stored: every entry it should hold is missing
    dump = tmp_path / "md"
    shell(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), "-dumptofile", str(dump))
    ghost = closed_ledger + 3_000_000
    shell(shared_cluster, "ledgermetadata", "-l", str(ghost), "-restorefromfile", str(dump))
    try:
        rows = _json(shared_cluster, "readledger", "-l", str(ghost), "-p", "pw", "-b", ensemble[0])
        assert [r["status"] for r in rows] == ["missing", "missing"]  # type: ignore[index]
        table = shell(shared_cluster, "readledger", "-l", str(ghost), "-p", "pw", "-b", ensemble[0]).stdout
        assert table.count("│ missing ") == 2 and "None" not in table
    finally:
        shell(shared_cluster, "deleteledger", "-l", str(ghost), "-f")


def test_ledger_custom_metadata_is_shown_as_data(shared_cluster: LocalCluster, tmp_path: Path,
                                                 closed_ledger: int) -> None:
    dump = tmp_path / "md.json"
    shell(shared_cluster, "ledgermetadata", "-l", str(closed_ledger), "-dumptofile", str(dump))
    doc = json.loads(dump.read_bytes())
    doc["custom"] = {"[/x]": "\x1b[2J[bold]gone"}
    dump.write_text(json.dumps(doc))
    target = closed_ledger + 2_000_000
    out = shell(shared_cluster, "ledgermetadata", "-l", str(target), "-restorefromfile", str(dump))
    assert "\x1b" not in out.stdout and "[/x]" in out.stdout and "\\u001b[2J[bold]gone" in out.stdout
    shell(shared_cluster, "deleteledger", "-l", str(target), "-f")


# --- listunderreplicated ------------------------------------------------------------------------


@pytest.fixture
def markers(shared_cluster: LocalCluster) -> Iterator[tuple[int, int]]:
    from ledgerstore.aio import Client
    from ledgerstore.recovery.markers import UnderReplicationManager

    async def go(fn: str) -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            urm = UnderReplicationManager(client.store)
            if fn == "mark":
                await urm.mark(900001, ["lost-a:1"])
                await urm.mark(900002, ["lost-b:1", "lost-a:1"])
                claimed, _ = await urm.claim(900002, "worker-7", 600)
                assert claimed is not None
            else:
                await urm.remove(900001)
                await urm.remove(900002)

    asyncio.run(go("mark"))
    yield 900001, 900002
    asyncio.run(go("remove"))


def _ids(rows: object) -> list[int]:
    assert isinstance(rows, list)
    return [r["ledger_id"] for r in rows]


def test_listunderreplicated_missingreplica(shared_cluster: LocalCluster, markers: tuple[int, int]) -> None:
    assert _ids(_json(shared_cluster, "listunderreplicated", "-missingreplica", "lost-b:1")) == [900002]
    assert _ids(_json(shared_cluster, "listunderreplicated", "-mr", "lost-a:1")) == [900001, 900002]


def test_listunderreplicated_excludingmissingreplica(shared_cluster: LocalCluster, markers: tuple[int, int]) -> None:
    assert _ids(_json(shared_cluster, "listunderreplicated", "-excludingmissingreplica", "lost-b:1")) == [900001]
    assert _ids(_json(shared_cluster, "listunderreplicated", "-emr", "lost-a:1")) == []


def test_listunderreplicated_printmissingreplica(shared_cluster: LocalCluster, markers: tuple[int, int]) -> None:
    assert "lost-b:1" not in shell(shared_cluster, "listunderreplicated").stdout
    assert "lost-a:1,lost-b:1" in shell(shared_cluster, "listunderreplicated", "-printmissingreplica").stdout
    assert "lost-a:1,lost-b:1" in shell(shared_cluster, "listunderreplicated", "-pmr").stdout


def test_listunderreplicated_printreplicationworkerid(shared_cluster: LocalCluster, markers: tuple[int, int]) -> None:
    assert "worker-7" not in shell(shared_cluster, "listunderreplicated").stdout
    assert "worker-7" in shell(shared_cluster, "listunderreplicated", "-printreplicationworkerid").stdout
    assert "worker-7" in shell(shared_cluster, "listunderreplicated", "-prw").stdout


def test_listunderreplicated_onlydisplayledgercount(shared_cluster: LocalCluster, markers: tuple[int, int]) -> None:
    assert _json(shared_cluster, "listunderreplicated", "-onlydisplayledgercount") == {"count": 2}
    assert "2 under-replicated ledgers" in shell(shared_cluster, "listunderreplicated", "-c").stdout


# --- bookiesanity -entries / -timeout ------------------------------------------------------------


def test_bookiesanity_entries(shared_cluster: LocalCluster) -> None:
    r = _json(shared_cluster, "bookiesanity", "-b", shared_cluster.bookie_id(0), "-entries", "25")
    assert r == {"bookie": shared_cluster.bookie_id(0), "entries": 25, "result": "ok"}
    assert _json(shared_cluster, "bookiesanity", "-b", shared_cluster.bookie_id(0), "-e", "3")["entries"] == 3  # type: ignore[index]


def test_bookiesanity_timeout(shared_cluster: LocalCluster) -> None:
    ok = _json(shared_cluster, "bookiesanity", "-b", shared_cluster.bookie_id(1), "-timeout", "30")
    assert isinstance(ok, dict) and ok["result"] == "ok"
    late = shell(shared_cluster, "bookiesanity", "-b", shared_cluster.bookie_id(1), "-e", "2000", "-t", "0.000001",
                 check=False)
    assert late.returncode == 1 and "did not complete the writes within 1e-06s" in late.stderr
    assert len(late.stderr.strip().splitlines()) == 1


# --- lostbookierecoverydelay -get / -set ---------------------------------------------------------


def test_lostbookierecoverydelay_set_and_get(shared_cluster: LocalCluster) -> None:
    assert _json(shared_cluster, "lostbookierecoverydelay", "-set", "12") == {"lost_bookie_recovery_delay_s": 12.0}
    assert _json(shared_cluster, "lostbookierecoverydelay", "-get") == {"lost_bookie_recovery_delay_s": 12.0}
    assert "3s" in shell(shared_cluster, "lostbookierecoverydelay", "-s", "3").stdout
    assert "3s" in shell(shared_cluster, "lostbookierecoverydelay", "-g").stdout
    both = shell(shared_cluster, "lostbookierecoverydelay", "-get", "-set", "4", check=False)
    assert both.returncode == 2
    shell(shared_cluster, "lostbookierecoverydelay", "--clear")


# --- bookieformat -nonInteractive, decommissionbookie -bookieid (private clusters) ----------------


def test_bookieformat_noninteractive_refuses_data_without_force(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3)
    cluster.start()
    cluster.kill(2, 15)
    cfg = str(cluster.config_path(2))
    refused = ls("shell", "bookieformat", "--config", cfg, "-nonInteractive", check=False)
    assert refused.returncode == 1 and "hold data; pass -f" in refused.stderr
    assert any(Path(cluster.config_path(2)).parent.rglob("*.log")) or refused.returncode == 1
    done = json.loads(ls("shell", "bookieformat", "--config", cfg, "-n", "-f", "-deleteCookie", "--json").stdout)
    assert done["cookie_deleted"] is True
    empty = ls("shell", "bookieformat", "--config", cfg, "-nonInteractive", "--json")  # nothing to erase: no question
    assert json.loads(empty.stdout)["cookie_deleted"] is False


def test_decommissionbookie_bookieid_and_the_bookie_config(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(4)
    cluster.start()
    for i in (2, 3):
        cluster.kill(i, 15)
    out = json.loads(shell(cluster, "decommissionbookie", "-bookieid", cluster.bookie_id(3), "--local-worker",
                           "--timeout", "60", "--json").stdout)
    assert out["ledgers"] == 0
    by_config = ls("shell", "--config", str(cluster.config_path(2)), "decommissionbookie", "--local-worker",
                   "--timeout", "60", "--json")
    assert json.loads(by_config.stdout)["ledgers"] == 0
    from ledgerstore.aio import Client
    from ledgerstore.meta.bookies import CookieManager

    async def cookies() -> list[object]:
        async with Client(metadata=cluster.metadata) as client:
            return [await CookieManager(client.store).get(cluster.bookie_id(i)) for i in (2, 3)]

    assert asyncio.run(cookies()) == [None, None]
    unnamed = shell(cluster, "decommissionbookie", check=False)
    assert unnamed.returncode == 2 and "-bookieid" in unnamed.stderr


# --- the rest of BookKeeper's shell: clusterinfo, cookie_get/cookie_delete, recover -f, forceauditchecks -calc,
# autorecovery -e/-d, listfilesondisc -txn/-log/-idx ------------------------------------------------------


@pytest.fixture
def ghost_cookie(shared_cluster: LocalCluster) -> Iterator[str]:
    """A cookie of a bookie that is not running (unavailable, in BookKeeper's count)."""
    from ledgerstore.aio import Client
    from ledgerstore.meta.bookies import CookieManager

    async def put(delete: bool) -> None:
        async with Client(metadata=shared_cluster.metadata) as client:
            cookies = CookieManager(client.store)
            await (cookies.delete("ghost:1") if delete else cookies.put("ghost:1", {"bookie_id": "ghost:1"}))

    asyncio.run(put(False))
    yield "ghost:1"
    asyncio.run(put(True))


def test_clusterinfo_counts_bookies_as_bookkeeper_does(shared_cluster: LocalCluster, ghost_cookie: str,
                                                       markers: tuple[int, int]) -> None:
    assert _json(shared_cluster, "clusterinfo") == {
        "auditorElected": False, "auditorId": "", "clusterUnderReplicated": True, "ledgerReplicationEnabled": True,
        "totalBookiesCount": 4, "writableBookiesCount": 3, "readonlyBookiesCount": 0, "unavailableBookiesCount": 1}
    assert "unavailableBookiesCount" in shell(shared_cluster, "clusterinfo").stdout


def test_cookie_get_and_cookie_delete(shared_cluster: LocalCluster, ghost_cookie: str) -> None:
    assert _json(shared_cluster, "cookie_get", ghost_cookie) == {"bookie_id": ghost_cookie}
    running = shell(shared_cluster, "cookie_delete", "-f", shared_cluster.bookie_id(0), check=False)
    assert running.returncode == 1 and "registered" in running.stderr
    assert _json(shared_cluster, "cookie_get", shared_cluster.bookie_id(0))["bookie_id"] == shared_cluster.bookie_id(0)  # type: ignore[index]
    assert _json(shared_cluster, "cookie_delete", "-f", ghost_cookie) == {"bookie_id": ghost_cookie, "cookie_deleted": True}
    assert shell(shared_cluster, "cookie_get", ghost_cookie, check=False).returncode == 3
    assert shell(shared_cluster, "cookie_delete", "-f", ghost_cookie, check=False).returncode == 3


def test_recover_accepts_bookkeepers_force(shared_cluster: LocalCluster, closed_ledger: int) -> None:
    md = _json(shared_cluster, "ledgermetadata", "-l", str(closed_ledger))
    bookie = md["ensembles"][0][1][0]  # type: ignore[index]
    rows = _json(shared_cluster, "recover", "-f", "-q", bookie)
    assert closed_ledger in _ids(rows)


def test_forceauditchecks_checkallledgerscheck(shared_cluster: LocalCluster) -> None:
    assert _json(shared_cluster, "forceauditchecks", "-calc")["triggered"] is True  # type: ignore[index]
    assert _json(shared_cluster, "forceauditchecks", "-checkallledgerscheck")["replicas"] is False  # type: ignore[index]


def test_autorecovery_short_enable_and_disable(shared_cluster: LocalCluster) -> None:
    assert _json(shared_cluster, "autorecovery", "-d") == {"enabled": False}
    assert _json(shared_cluster, "autorecovery", "-e") == {"enabled": True}


@pytest.mark.parametrize(("flag", "kind"), [("-txn", "journal"), ("-log", "entrylog"), ("-idx", "index")])
def test_listfilesondisc_by_kind(shared_cluster: LocalCluster, closed_ledger: int, flag: str, kind: str) -> None:
    rows = json.loads(ls("shell", "listfilesondisc", "--config", str(shared_cluster.config_path(0)), flag,
                         "--json").stdout)
    assert rows and {r["type"] for r in rows} == {kind}
    everything = json.loads(ls("shell", "listfilesondisc", "--config", str(shared_cluster.config_path(0)),
                               "--json").stdout)
    assert {r["type"] for r in everything} >= {"journal", "entrylog"}


def test_every_single_dash_flag_is_documented() -> None:
    from ledgerstore.cli.shell import BOOKKEEPER_LONG_FLAGS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "shell.md").read_text().lower()
    assert [f for f in BOOKKEEPER_LONG_FLAGS if f"`-{f}`" not in doc] == []
