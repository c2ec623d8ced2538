"""How a bookie finds at start that one of its directories lost data while the others did not.

Every checkpoint leaves the journal position the storage now holds everything up to in each
ledger directory (``lastMark``, as BookKeeper keeps it there) before the journal's own mark
moves, and the journal directory says once that the ledger directories carry such marks. So at
start a bookie can tell, before it serves:

- a ledger directory replaced by an empty disk (no cookie there: it is stamped back), or wiped
  keeping its cookie (its mark is gone), while the journal is intact;
- a ledger directory restored from an older copy (its mark is behind the journal's);
- a journal directory restored from an older copy (it ends before a ledger directory's mark);

and puts its ledgers in limbo: a read of what it lacks answers UNKNOWN, never NO_SUCH_ENTRY.
A bookie restarted on its own directories, or one whose directories predate the marks, does not.
The bookies are real (in this process, real TCP, a sqlite metadata file, each storage engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerstore.aio import Client
from ledgerstore.bookie.cookie import COOKIE_FILE
from ledgerstore.bookie.limbo import LEDGER_MARK_FILE, LEDGER_MARKS_FLAG
from ledgerstore.cluster import free_ports
from ledgerstore.config import AutoRecoveryConfig
from ledgerstore.errors import CookieMismatchError
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Status
from ledgerstore.proto.digest import master_key
from ledgerstore.recovery.admin import recover_bookie
from tests.integration.test_limbo import ENGINES, PW, Cluster, run, sign, status_of


@contextlib.asynccontextmanager
async def three_bookies(tmp_path: Path, storage: str) -> AsyncIterator[tuple[Cluster, Client]]:
    """Three running bookies and a client; every bookie stopped at the end."""
    cluster = Cluster(tmp_path, storage)
    try:
        for i in range(3):
            await cluster.start(i)
        async with Client(metadata=cluster.meta, metadata_options={"server": "never"}) as client:
            yield cluster, client
    finally:
        await cluster.close()


async def ledger(client: Client, n: int, *, close: bool = True) -> int:
    """A ledger on all three bookies with ``n`` entries."""
    lh = await client.create_ledger(3, 3, 2, password=PW)
    for e in range(n):
        await lh.append(f"entry {e}".encode())
    if close:
        await lh.close()
    return lh.ledger_id


def empty(d: Path, *, keep_cookie: bool) -> None:
    for p in d.iterdir():
        if keep_cookie and p.name == COOKIE_FILE:
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()


async def checkpoint(cluster: Cluster, i: int) -> None:
    b = cluster.bookies[i]
    assert b is not None
    await asyncio.to_thread(b.checkpoint)


@pytest.mark.parametrize("keep_cookie", [False, True], ids=["disk-replaced", "wiped-keeping-cookie"])
@pytest.mark.parametrize("storage", ENGINES)
def test_a_ledger_directory_lost_while_the_journal_stayed_puts_the_ledgers_in_limbo(
        tmp_path: Path, storage: str, keep_cookie: bool) -> None:
    async def main() -> None:
        async with three_bookies(tmp_path, storage) as (cluster, client):
            lid = await ledger(client, 5)
            await cluster.stop(0)  # a clean stop checkpoints: the marks are in place
            assert (tmp_path / "b0" / "ledgers" / LEDGER_MARK_FILE).exists()
            empty(tmp_path / "b0" / "ledgers", keep_cookie=keep_cookie)
            if not keep_cookie:  # without the check, the directories disagree and it refuses to start
                with pytest.raises(CookieMismatchError, match="disagree"):
                    await cluster.start(0, data_integrity_checking_enabled=False)
            b = await cluster.start(0)
            assert set(b.limbo.ledgers) == {lid}
            assert (tmp_path / "b0" / "ledgers" / COOKIE_FILE).exists()
            assert await status_of(client, cluster.bookie_id(0), lambda r: codec.encode_read(r, lid, 2)) \
                == Status.UNKNOWN

    run(main())


@pytest.mark.parametrize("storage", ENGINES)
def test_a_ledger_directory_restored_from_an_older_copy_puts_the_ledgers_in_limbo(
        tmp_path: Path, storage: str) -> None:
    async def main() -> None:
        async with three_bookies(tmp_path, storage) as (cluster, client):
            early = await ledger(client, 3)
            await checkpoint(cluster, 0)
            await cluster.stop(0)
            shutil.copytree(tmp_path / "b0" / "ledgers", tmp_path / "backup")  # the copy
            await cluster.start(0)
            late = await ledger(client, 4)
            await checkpoint(cluster, 0)  # the journal's mark moves past the late ledger
            await cluster.stop(0)
            shutil.rmtree(tmp_path / "b0" / "ledgers")
            shutil.copytree(tmp_path / "backup", tmp_path / "b0" / "ledgers")  # the restore
            b = await cluster.start(0)
            assert {early, late} <= set(b.limbo.ledgers)
            # the late ledger's entries are neither in the old copy nor replayed from the journal
            assert await status_of(client, cluster.bookie_id(0), lambda r: codec.encode_read(r, late, 1)) \
                == Status.UNKNOWN

    run(main())


def test_a_journal_restored_from_an_older_copy_puts_the_ledgers_in_limbo(tmp_path: Path) -> None:
    async def main() -> None:
        async with three_bookies(tmp_path, "entrylog") as (cluster, client):
            early = await ledger(client, 3)
            await cluster.stop(0)
            shutil.copytree(tmp_path / "b0" / "journal", tmp_path / "backup")
            await cluster.start(0)
            await ledger(client, 4)
            await cluster.stop(0)
            shutil.rmtree(tmp_path / "b0" / "journal")
            shutil.copytree(tmp_path / "backup", tmp_path / "b0" / "journal")
            b = await cluster.start(0)
            assert early in b.limbo.ledgers

    run(main())


@pytest.mark.parametrize("storage", ENGINES)
def test_a_bookie_restarted_on_its_own_directories_is_not_in_limbo(tmp_path: Path, storage: str) -> None:
    """Clean stops, a crash (abort: nothing checkpointed), and directories that predate the
    marks (neither the marks nor the flag): no limbo, and the entries are served."""
    async def main() -> None:
        async with three_bookies(tmp_path, storage) as (cluster, client):
            lid = await ledger(client, 5)
            for _ in range(2):
                await cluster.stop(0)
                assert len((await cluster.start(0)).limbo) == 0
            await checkpoint(cluster, 0)
            await ledger(client, 3)
            if storage == "entrylog":  # (an engine left open by the abort keeps its LOCK in this process)
                b = cluster.bookies[0]
                assert b is not None
                b.abort()
                cluster.bookies[0] = None
                assert len((await cluster.start(0)).limbo) == 0
            await cluster.stop(0)
            (tmp_path / "b0" / "ledgers" / LEDGER_MARK_FILE).unlink()
            (tmp_path / "b0" / "journal" / LEDGER_MARKS_FLAG).unlink()
            assert len((await cluster.start(0)).limbo) == 0
            assert await status_of(client, cluster.bookie_id(0), lambda r: codec.encode_read(r, lid, 4)) == Status.OK

    run(main())


def test_a_ledger_recovered_away_from_a_restored_bookie_stays_fenced_there(tmp_path: Path) -> None:
    """The copy a ledger directory is restored from holds a ledger's key but not the fence its
    recovery recorded since; and the auto-recovery moved the ledger's copies off the bookie while
    it was down, so the ledger no longer names it and is not put in limbo. A writer that never
    heard of the recovery must still find it fenced there (seed 1813 of the simulation)."""
    async def main() -> None:
        cluster = Cluster(tmp_path, "entrylog")
        cluster.ports, cluster.bookies = free_ports(4), [None] * 4
        try:
            for i in range(4):
                await cluster.start(i)
            async with Client(metadata=cluster.meta, metadata_options={"server": "never"}) as client:
                ids = [cluster.bookie_id(i) for i in range(3)]
                lh = await client.create_ledger(3, 3, 2, password=PW, bookies=ids)
                for e in range(5):
                    await lh.append(f"entry {e}".encode())
                await cluster.stop(0)
                shutil.copytree(tmp_path / "b0" / "ledgers", tmp_path / "backup")
                await cluster.start(0)
                recovered = await client.open_ledger(lh.ledger_id, password=PW)  # fences it on 0, 1 and 2
                assert recovered.md.is_closed
                await checkpoint(cluster, 0)
                await cluster.stop(0)
                await recover_bookie(client, ids[0], AutoRecoveryConfig(), timeout=60)
                assert ids[0] not in (await client.ledger_metadata(lh.ledger_id)).bookies()
                shutil.rmtree(tmp_path / "b0" / "ledgers")
                shutil.copytree(tmp_path / "backup", tmp_path / "b0" / "ledgers")
                b = await cluster.start(0)
                assert lh.ledger_id not in b.limbo.ledgers and lh.ledger_id in b.ledgers.fenced
                key = master_key(PW)
                assert await status_of(client, ids[0], lambda r: codec.encode_add(
                    r, lh.ledger_id, 5, key, sign(lh.ledger_id, 5, 4))) == Status.FENCED
        finally:
            await cluster.close()
            await cluster.stop(3)

    run(main())
