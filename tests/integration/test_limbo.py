"""Limbo ledgers: a bookie that comes back under its old identity without the data it held never
answers "no such entry" for it.

Three bookies in this process (real TCP, one sqlite metadata file, each storage engine) hold an
open and a closed ledger. One is stopped, its journal and ledger directories are emptied (the
cookie files kept, or lost too) and it is started again. With ``data_integrity_checking_enabled``
(the default) it finds the loss before it serves, lists the ledgers whose fragments name it and
puts them in limbo: a read of an entry it lacks and a LAC read answer UNKNOWN, both ledgers are
fenced (a writer's adds are refused FENCED, recovery adds land and are then served), and all of
it survives another restart. With the option off it answers NO_SUCH_ENTRY, the lie limbo exists
to prevent. Left to repair itself, the bookie recovers the open ledger, copies its share of both
from the other two and takes them out of limbo; the shell's ``limbo`` command shows what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.aio import Client
from ledgerstore.bookie.cookie import COOKIE_FILE
from ledgerstore.bookie.limbo import LIMBO_FILE
from ledgerstore.bookie.server import Bookie
from ledgerstore.cluster import free_ports
from ledgerstore.config import BookieConfig
from ledgerstore.errors import LedgerStoreError
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Status
from ledgerstore.proto.digest import DigestManager, master_key

PW = b"limbo"
ENGINES = ["entrylog", "rocksdb"]


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 120))


async def held_back() -> Client:
    """A repair client that never comes: the repair waits (and is cancelled with its bookie)."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


class Cluster:
    """Three in-process bookies on one sqlite file; bookies stop, lose their disks and start."""

    def __init__(self, tmp_path: Path, storage: str, **settings: Any) -> None:
        self.tmp = tmp_path
        self.meta = f"sqlite://{tmp_path / 'meta.db'}"
        self.ports = free_ports(3)
        self.storage = storage
        self.settings = settings
        self.bookies: list[Bookie | None] = [None, None, None]

    def config(self, i: int, **settings: Any) -> BookieConfig:
        root = self.tmp / f"b{i}"
        return BookieConfig(metadata=self.meta, listen=f"tcp://127.0.0.1:{self.ports[i]}",
                            metadata_options={"server": "never"}, auto_init_cluster=True, storage=self.storage,
                            journal_dir=str(root / "journal"), ledger_dirs=[str(root / "ledgers")],
                            **{**self.settings, **settings})

    def bookie_id(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    async def start(self, i: int, *, repair: bool = False, **settings: Any) -> Bookie:
        """Start bookie ``i``; unless ``repair``, its limbo repair is held back (it waits forever
        for its client), so that the limbo answers can be examined."""
        b = Bookie(self.config(i, **settings), repair_client=None if repair else held_back)
        try:
            await b.start()
        except BaseException:
            await b.stop()  # a start that failed half-way leaves the engine (and its threads) to stop()
            raise
        self.bookies[i] = b
        return b

    async def stop(self, i: int) -> None:
        b, self.bookies[i] = self.bookies[i], None
        if b is not None:
            await b.stop()

    def wipe(self, i: int, *, keep_cookie: bool = True) -> None:
        """Empty bookie ``i``'s journal and ledger directories (it is stopped)."""
        for d in (self.tmp / f"b{i}" / "journal", self.tmp / f"b{i}" / "ledgers"):
            for p in d.iterdir():
                if keep_cookie and p.name == COOKIE_FILE:
                    continue
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    async def close(self) -> None:
        for i in range(3):
            await self.stop(i)


async def status_of(client: Client, bookie: str, build: Callable[[int], bytes]) -> int:
    resp = await client.pool.get(bookie).request(build, 10)
    return int(resp.status)


def sign(lid: int, eid: int, lac: int = -1) -> bytes:
    return DigestManager(lid, "crc32c").sign(eid, lac, f"entry {eid}".encode())


async def two_ledgers(cluster: Cluster, client: Client) -> tuple[int, int]:
    """A closed ledger and an open one, five entries each, on all three bookies."""
    closed = await client.create_ledger(3, 3, 2, password=PW)
    for e in range(5):
        await closed.append(f"entry {e}".encode())
    await closed.close()
    opened = await client.create_ledger(3, 3, 2, password=PW)
    for e in range(5):
        await opened.append(f"entry {e}".encode())
    return closed.ledger_id, opened.ledger_id


@contextlib.asynccontextmanager
async def one_bookie_emptied(tmp_path: Path, storage: str = "entrylog", *, keep_cookie: bool = True,
                             **settings: Any) -> AsyncIterator[tuple[Cluster, Client, int, int]]:
    """Three bookies holding a closed and an open ledger; bookie 0 stopped and its directories
    emptied (not restarted). Yields the cluster, a client and the two ledger ids."""
    cluster = Cluster(tmp_path, storage, **settings)
    try:
        for i in range(3):
            assert len((await cluster.start(i)).limbo) == 0  # a new bookie has nothing to lose
        async with Client(metadata=cluster.meta, metadata_options={"server": "never"}) as client:
            closed, opened = await two_ledgers(cluster, client)
            await cluster.stop(0)
            cluster.wipe(0, keep_cookie=keep_cookie)
            yield cluster, client, closed, opened
    finally:
        await cluster.close()


@pytest.mark.parametrize("storage", ENGINES)
def test_a_bookie_restarted_on_emptied_directories_answers_unknown_for_its_ledgers(
        tmp_path: Path, storage: str) -> None:
    async def main() -> None:
        async with one_bookie_emptied(tmp_path, storage) as (cluster, client, closed, opened):
            b = await cluster.start(0)
            bid = cluster.bookie_id(0)
            assert set(b.limbo.ledgers) == {closed, opened}
            assert b.limbo.fenced == {closed, opened}  # a stale writer of either finds it fenced
            for lid in (closed, opened):
                assert await status_of(client, bid, lambda r, lid=lid: codec.encode_read(r, lid, 0)) == Status.UNKNOWN
                assert await status_of(client, bid, lambda r, lid=lid: codec.encode_read_lac(r, lid)) == Status.UNKNOWN
            # the writer's next add is refused here; a recovery add lands and is then served
            key = master_key(PW)
            assert await status_of(client, bid, lambda r: codec.encode_add(r, opened, 5, key, sign(opened, 5, 4))) \
                == Status.FENCED
            assert await status_of(client, bid, lambda r: codec.encode_add(
                r, opened, 0, key, sign(opened, 0), FLAG_RECOVERY_ADD)) == Status.OK
            assert await status_of(client, bid, lambda r: codec.encode_read(r, opened, 0)) == Status.OK
            # a fencing read is recorded, and the entry it lacks is still unknown
            assert await status_of(client, bid, lambda r: codec.encode_read(r, closed, 3, key, FLAG_FENCE)) \
                == Status.UNKNOWN
            # the limbo and the fences survive a restart
            await cluster.stop(0)
            b = await cluster.start(0)
            assert set(b.limbo.ledgers) == {closed, opened}
            assert {closed, opened} <= b.ledgers.fenced
            assert await status_of(client, bid, lambda r: codec.encode_read(r, opened, 1)) == Status.UNKNOWN
            assert await status_of(client, bid, lambda r: codec.encode_read(r, opened, 0)) == Status.OK
            assert await status_of(client, bid, lambda r: codec.encode_add(r, opened, 5, key, sign(opened, 5, 4))) \
                == Status.FENCED

    run(main())


def test_with_data_integrity_checking_off_an_emptied_bookie_says_no_such_entry(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_bookie_emptied(tmp_path, data_integrity_checking_enabled=False) as (cluster, client, _, opened):
            b = await cluster.start(0)
            bid = cluster.bookie_id(0)
            assert len(b.limbo) == 0
            assert await status_of(client, bid, lambda r: codec.encode_read(r, opened, 0)) in (
                Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY)
            assert await status_of(client, bid, lambda r: codec.encode_read_lac(r, opened)) == Status.NO_SUCH_LEDGER

    run(main())


def test_a_bookie_whose_directories_lost_their_cookie_too_is_stamped_again_in_limbo(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_bookie_emptied(tmp_path, keep_cookie=False) as (cluster, client, closed, opened):
            # without the check it refuses to start, as before
            with pytest.raises(LedgerStoreError, match="disks were wiped or replaced"):
                await cluster.start(0, data_integrity_checking_enabled=False)
            b = await cluster.start(0)
            assert b.cookie_outcome is not None and b.cookie_outcome.restamped
            assert (tmp_path / "b0" / "journal" / COOKIE_FILE).exists()
            assert set(b.limbo.ledgers) == {closed, opened}
            assert await status_of(client, cluster.bookie_id(0), lambda r: codec.encode_read(r, closed, 2)) \
                == Status.UNKNOWN

    run(main())


def test_a_lac_long_poll_on_a_limbo_ledger_is_answered_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_bookie_emptied(tmp_path) as (cluster, client, _, opened):
            await cluster.start(0)
            resp = await client.pool.get(cluster.bookie_id(0)).request(
                lambda r: codec.encode_long_poll_lac(r, opened, 10, 30_000), 5)
            assert resp.status == Status.UNKNOWN

    run(main())


def test_an_unreadable_limbo_file_stops_the_start_in_one_line(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, "entrylog")
        try:
            await cluster.start(0)
            await cluster.stop(0)
            (tmp_path / "b0" / "journal" / LIMBO_FILE).write_text("{not json")
            with pytest.raises(LedgerStoreError, match="unreadable limbo file"):
                await cluster.start(0)
        finally:
            await cluster.close()

    run(main())


@pytest.mark.parametrize("storage", ENGINES)
def test_a_bookie_repairs_its_limbo_ledgers_from_the_other_replicas_and_leaves_limbo(
        tmp_path: Path, storage: str) -> None:
    async def main() -> None:
        async with one_bookie_emptied(tmp_path, storage) as (cluster, client, closed, opened):
            b = await cluster.start(0, repair=True)
            deadline = time.monotonic() + 60
            while len(b.limbo):
                assert time.monotonic() < deadline, f"still in limbo: {sorted(b.limbo.ledgers)}"
                await asyncio.sleep(0.1)
            assert b.limbo.repaired_total == 2 and b.repair.entries_copied == 10
            assert not (tmp_path / "b0" / "journal" / LIMBO_FILE).exists()
            md = await client.ledger_metadata(opened)
            assert md.is_closed and md.last_entry_id == 4  # recovered by the repair
            bid = cluster.bookie_id(0)
            for lid in (closed, opened):
                for e in range(5):
                    assert await status_of(client, bid, lambda r, lid=lid, e=e: codec.encode_read(r, lid, e)) \
                        == Status.OK
                assert await status_of(client, bid, lambda r, lid=lid: codec.encode_read(r, lid, 5)) \
                    == Status.NO_SUCH_ENTRY  # out of limbo: its "no" is a vote again
            assert b.status().ledgers_in_limbo == 0

    run(main())


def test_the_shell_shows_the_ledgers_left_in_limbo(tmp_path: Path) -> None:
    async def main() -> None:
        async with one_bookie_emptied(tmp_path) as (cluster, _, closed, opened):
            await cluster.start(0)
            toml = tmp_path / "bookie0.toml"
            cfg = cluster.config(0)
            toml.write_text(f'[bookie]\nmetadata = "{cfg.metadata}"\nlisten = "{cfg.listen}"\n'
                            f'journal_dir = "{cfg.journal_dir}"\nledger_dirs = ["{cfg.ledger_dirs[0]}"]\n')
            out = subprocess.run([sys.executable, "-m", "ledgerstore", "shell", "limbo", "--config", str(toml),
                                  "--json"], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout) == {"ledgers_in_limbo": 2, "listing_pending": False,
                                              "ledgers": sorted([closed, opened]), "fenced": sorted([closed, opened])}

    run(main())


def test_a_closed_ledger_new_to_a_bookie_takes_recovery_adds_only(tmp_path: Path) -> None:
    """A stale writer's add of a closed ledger, sent to a bookie that does not hold it (one
    re-replication swapped in, or one that lost the fence it had recorded), is refused FENCED:
    the metadata look-up that allows the ledger's first key shows it closed, and fences it."""
    async def main() -> None:
        cluster = Cluster(tmp_path, "entrylog")
        try:
            for i in range(3):
                await cluster.start(i)
            async with Client(metadata=cluster.meta, metadata_options={"server": "never"}) as client:
                lh = await client.create_ledger(2, 2, 2, password=PW, bookies=[cluster.bookie_id(1), cluster.bookie_id(2)])
                await lh.append(b"entry 0")
                await lh.close()
                lid, key, bid = lh.ledger_id, master_key(PW), cluster.bookie_id(0)
                assert await status_of(client, bid, lambda r: codec.encode_add(r, lid, 1, key, sign(lid, 1, 0))) \
                    == Status.FENCED
                assert await status_of(client, bid, lambda r: codec.encode_add(
                    r, lid, 0, key, sign(lid, 0), FLAG_RECOVERY_ADD)) == Status.OK
                await cluster.stop(0)
                await cluster.start(0)  # the fence is in the journal with the key
                assert await status_of(client, bid, lambda r: codec.encode_add(r, lid, 1, key, sign(lid, 1, 0))) \
                    == Status.FENCED
        finally:
            await cluster.close()

    run(main())
