"""A bookie's data cannot vanish under it unnoticed: real bookie processes, real directories.

- a running bookie locks its directories: bookieformat (and every offline tool that writes)
  refuses while it runs, naming its PID, and works once it is stopped; a bookie killed with
  SIGKILL leaves no lock behind;
- a bookie whose directories are emptied, or whose cookie is rewritten, under it stops taking
  writes (read-only) and says why;
- a bookie formatted and restarted under its old id holds nothing of its old ledgers: the
  auditor marks them (it knows the incarnation changed), workers do not take the returning id
  for the old data, and the replicas check finds the gap even when no auditor saw the change.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.aio import Client
from ledgerstore.bookie.cookie import COOKIE_FILE
from ledgerstore.bookie.dirlock import LOCK_FILE
from ledgerstore.cluster import LocalCluster
from ledgerstore.errors import ProtocolError
from ledgerstore.meta.bookies import BookieRegistry, CookieManager
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.plugins import create_metadata_store
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import master_key
from ledgerstore.recovery.markers import GONE, NOT_HELD, REFORMATTED, UnderReplicationManager
from ledgerstore.recovery.replicas import needed_last_entry
from tests.conftest import ClusterConfig
from tests.integration.test_autorecovery import (
    BACKENDS,
    extra_config,
    rereplicated,
    verify_replicas,
    wait_until,
    write_ledgers,
)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 240))


def shell_local(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerstore", "shell", *args], capture_output=True, text=True,
                          timeout=120)


def bookie_dirs(cluster: LocalCluster, i: int) -> list[Path]:
    root = cluster.config_path(i).parent
    return [root / "journal", root / "ledgers"]


def format_bookie(cluster: LocalCluster, i: int) -> None:
    out = shell_local("bookieformat", "--config", str(cluster.config_path(i)), "-f", "--delete-cookie", "--json")
    assert out.returncode == 0, out.stdout + out.stderr


# --- the lock ---------------------------------------------------------------------------------------


def test_bookieformat_is_refused_while_the_bookie_runs_and_names_its_pid(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(1)
    cluster.start()
    cfg = str(cluster.config_path(0))
    pid = cluster.procs[0].pid

    out = shell_local("bookieformat", "--config", cfg, "-f")
    assert out.returncode != 0
    assert f"PID {pid}" in out.stderr + out.stdout, out.stderr + out.stdout
    assert "bookieformat refused" in out.stderr + out.stdout
    for d in bookie_dirs(cluster, 0):
        assert (d / COOKIE_FILE).exists(), f"{d} was touched by a refused bookieformat"
    gc = shell_local("gc", "--config", cfg, "--json")
    assert gc.returncode != 0 and f"PID {pid}" in gc.stderr + gc.stdout, gc.stderr + gc.stdout
    check = shell_local("localconsistencycheck", "--config", cfg, "--json")
    assert check.returncode != 0 and f"PID {pid}" in check.stderr + check.stdout

    # SIGKILL leaves the lock file behind but not the lock: the bookie starts again at once
    cluster.kill(0)
    cluster.restart(0)
    assert cluster.procs[0].pid != pid
    cluster.kill(0, signal.SIGTERM)

    out = shell_local("bookieformat", "--config", cfg, "-f", "--delete-cookie", "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    for d in bookie_dirs(cluster, 0):
        assert sorted(p.name for p in d.iterdir()) == [LOCK_FILE]
    cluster.restart(0)  # formatted, with its cookie deleted: it joins afresh


# --- a running bookie that loses its data ---------------------------------------------------------


def _rewrite_cookies(dirs: list[Path]) -> None:
    for d in dirs:
        c = json.loads((d / COOKIE_FILE).read_text())
        c["incarnation"] = "someone-else"
        (d / COOKIE_FILE).write_text(json.dumps(c))


def _remove_dirs(dirs: list[Path]) -> None:
    for d in dirs:
        shutil.rmtree(d)


@pytest.mark.parametrize("damage", [_remove_dirs, _rewrite_cookies], ids=["directories-removed", "cookie-rewritten"])
def test_a_bookie_whose_data_vanishes_under_it_stops_taking_writes(cluster_factory, damage) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = cluster_factory(3, extra_bookie_config="disk_check_interval_ms = 200\n")
    cluster.start()
    victim = 2
    vid = cluster.bookie_id(victim)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"pw")
            for i in range(10):
                await lh.append(b"e%d" % i)
            damage(bookie_dirs(cluster, victim))
            registry = BookieRegistry(client.store)  # type: ignore[arg-type]

            async def read_only() -> bool:
                return (vid in {b.bookie_id for b in await registry.read_only()}
                        and vid not in {b.bookie_id for b in await registry.writable()})

            await wait_until(read_only, 30, f"{vid} to register read-only")
            # an add straight to the bookie is refused: it no longer writes anything
            entry = b"x" * 8
            resp = await client.pool.get(vid).request(
                lambda rid: codec.encode_add(rid, lh.ledger_id, 10, master_key(b"pw"), entry), 10)
            assert resp.status == Status.READ_ONLY, Status(resp.status).name
            # it holds nothing it could vouch for, and asked the auditor for a replicas check
            listing = await client.pool.get(vid).request(lambda rid: codec.encode_list_ledgers(rid), 10)
            assert listing.status == Status.OK and listing.items == ()
            urm = UnderReplicationManager(client.store)  # type: ignore[arg-type]
            assert (await urm.audit_trigger()).get("replicas") is True
        log = cluster.log_path(victim).read_text()
        assert "no longer owns its data" in log, log[-3000:]

    run(main())


# --- a bookie formatted and back under its id --------------------------------------------------------


async def write_then_reformat(client: Client, cluster: LocalCluster, victim: int
                              ) -> tuple[dict[int, list[bytes]], dict[int, bytes]]:
    """Write closed ledgers (some on ``victim``), then stop, format and restart ``victim`` under
    its id: it comes back holding nothing."""
    payloads, passwords, _ = await write_ledgers(client, 12, 200, 64)
    gone = cluster.bookie_id(victim)
    assert [lid for lid in payloads if gone in (await client.ledger_metadata(lid)).bookies()]
    cluster.kill(victim, signal.SIGTERM)
    format_bookie(cluster, victim)
    cluster.restart(victim)
    return payloads, passwords


async def fully_replicated(client: Client, gone: str, payloads: dict[int, list[bytes]],
                           passwords: dict[int, bytes]) -> None:
    """Wait until no ledger names ``gone`` any more, then check every entry on every replica."""
    await wait_until(lambda: rereplicated(client, gone), 120, f"every ledger to move off {gone}")
    await verify_replicas(client, payloads, passwords, gone)


def _victim(cluster: LocalCluster, n: int) -> int:
    """A bookie other than the auditor (the smallest id wins the election)."""
    auditor = min(cluster.bookie_id(i) for i in range(n))
    return next(i for i in reversed(range(n)) if cluster.bookie_id(i) != auditor)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_formatted_bookie_back_under_its_id_gets_its_ledgers_rereplicated(cluster_factory, backend: str) -> None:  # type: ignore[no-untyped-def]
    # a long lost-bookie delay: the victim is back long before its absence alone would mark anything
    cluster: LocalCluster = cluster_factory(4, ClusterConfig(backend, "entrylog", "tcp"),
                                            extra_bookie_config=extra_config(lost_bookie_recovery_delay_s=120.0))
    cluster.start()
    victim = _victim(cluster, 4)
    gone = cluster.bookie_id(victim)

    async def main() -> None:
        async with Client(metadata=cluster.metadata) as client:
            payloads, passwords = await write_then_reformat(client, cluster, victim)
            urm = UnderReplicationManager(client.store)  # type: ignore[arg-type]
            await wait_until(lambda: _loss_is(urm, gone, REFORMATTED), 60, f"the auditor to see {gone} reformatted")
            await fully_replicated(client, gone, payloads, passwords)

    run(main())


async def _loss_is(urm: UnderReplicationManager, bookie: str, reason: str) -> bool:
    rec = await urm.loss(bookie)
    return rec is not None and rec.reason == reason


def test_the_replicas_check_finds_a_bookie_formatted_unseen_and_recovery_restores_every_replica(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    # no auto-recovery while the bookie is formatted and restarted: no auditor knew its old incarnation
    cluster: LocalCluster = cluster_factory(4)
    cluster.start()
    victim = 3
    gone = cluster.bookie_id(victim)
    proc: subprocess.Popen[bytes] | None = None

    async def main() -> None:
        nonlocal proc
        async with Client(metadata=cluster.metadata) as client:
            payloads, passwords = await write_then_reformat(client, cluster, victim)

            log_path = cluster.data_dir / "autorecovery.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ledgerstore", "autorecovery", "--metadata", cluster.metadata,
                     "--lost-bookie-recovery-delay", "120", "--open-ledger-grace", "3", "--lease", "4"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            await wait_until(lambda: _ready(log_path), 60, "the auto-recovery process to start")
            urm = UnderReplicationManager(client.store)  # type: ignore[arg-type]
            await wait_until(lambda: _is_auditor(urm), 60, "an auditor to be elected")
            assert not await urm.ledger_ids(), "marked before any replicas check"

            await urm.trigger_audit(replicas=True)
            await wait_until(lambda: _loss_is(urm, gone, NOT_HELD), 60, f"the replicas check to find {gone} short")
            await fully_replicated(client, gone, payloads, passwords)
            assert "replicas check:" in log_path.read_text()

    try:
        run(main())
    except AssertionError as exc:
        # what the auditor did is in its log, which goes with the cluster's directory
        log_path = cluster.data_dir / "autorecovery.log"
        tail = log_path.read_text(errors="replace")[-6000:] if log_path.exists() else "(no log)"
        raise AssertionError(f"{exc}\nthe auto-recovery process's log ends:\n{tail}") from exc
    finally:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)


async def _ready(path: Path) -> bool:
    return path.exists() and " ready" in path.read_text()


async def _is_auditor(urm: UnderReplicationManager) -> bool:
    return (await urm.auditor() or "").startswith("autorecovery-")


# --- the pieces, without processes -----------------------------------------------------------------


def test_list_ledgers_frames_round_trip_and_refuse_nonsense() -> None:
    req = codec.decode_request(codec.encode_list_ledgers(7, 42, 100))
    assert req == codec.ListLedgersRequest(7, 42, 100)
    resp = codec.decode_response(codec.encode_list_ledgers_response(7, Status.OK, [(42, 199), (43, -1)]))
    assert (resp.op, resp.status, resp.request_id, resp.items) == (codec.Op.LIST_LEDGERS, Status.OK, 7,
                                                                  ((42, 199), (43, -1)))
    refused = codec.decode_response(codec.encode_error_response(codec.Op.LIST_LEDGERS, 7, Status.BAD_REQUEST))
    assert refused.status == Status.BAD_REQUEST and refused.items == ()
    for bad in (codec.encode_list_ledgers(7, 0, 0), codec.encode_list_ledgers(7, 0, codec.MAX_LIST_LEDGERS + 1),
                codec.encode_list_ledgers(7, 0, 10)[:-1]):
        with pytest.raises(ProtocolError):
            codec.decode_request(bad)
    with pytest.raises(ProtocolError):
        codec.decode_response(codec.encode_list_ledgers_response(7, Status.OK, [(1, 2)])[:-1])


def test_a_bookie_must_hold_each_fragment_up_to_its_last_entry_in_its_write_sets() -> None:
    # E3 Qw2: entry e goes to indexes e%3 and (e+1)%3; two fragments, b3 replacing b1 at entry 10
    md = LedgerMetadata(1, 3, 2, 2, "crc32c", "", [(0, ["b0", "b1", "b2"]), (10, ["b0", "b3", "b2"])],
                        state=LedgerState.CLOSED, last_entry_id=20)
    assert needed_last_entry(md, "b1") == 9  # index 1 holds entries 0,1 mod 3: 9 is the last below 10
    assert needed_last_entry(md, "b3") == 19  # 20 % 3 == 2: entry 20 goes to indexes 2 and 0
    assert needed_last_entry(md, "b0") == 20
    assert needed_last_entry(md, "b9") is None
    empty = LedgerMetadata(2, 3, 2, 2, "crc32c", "", [(0, ["b0", "b1", "b2"])], state=LedgerState.CLOSED)
    assert needed_last_entry(empty, "b0") is None


def test_only_the_same_incarnation_coming_back_counts_as_back(tmp_path: Path) -> None:
    async def main() -> None:
        store = create_metadata_store(f"sqlite://{tmp_path / 'md.db'}")
        await store.start()
        try:
            urm, cookies = UnderReplicationManager(store), CookieManager(store)
            await cookies.put("b", {"incarnation": "one"})
            assert await urm.came_back("b")  # no record: an operator's marker, taken at its word
            await urm.note_loss("b", "one", GONE)
            assert await urm.came_back("b")
            await cookies.put("b", {"incarnation": "two"})  # formatted and back
            assert not await urm.came_back("b")
            await urm.note_loss("b", "one", REFORMATTED)
            await urm.note_loss("b", "one", GONE)  # never weakened back to "gone"
            assert (await urm.loss("b")).reason == REFORMATTED  # type: ignore[union-attr]
            await cookies.put("b", {"incarnation": "one"})
            assert not await urm.came_back("b")
        finally:
            await store.close()

    run(main())
