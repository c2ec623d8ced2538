"""Ledger handles and recovery against a narrow client context over in-process bookies (no
processes, no sockets): the writer's ordering, the reader's replica fallback and error types,
and recovery's fencing, read-ahead and stop at the first missing entry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.read import ReadHandle
from ledgerstore.client.recovery import READ_AHEAD, recover
from ledgerstore.errors import (
    BookieUnavailableError,
    DigestMismatchError,
    InvalidArgumentError,
    LedgerFencedError,
    NoSuchEntryError,
)
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.proto.codec import Op
from ledgerstore.proto.digest import password_check
from ledgerstore.testing.faults import FaultInjector
from tests.unit.memory_bookies import MemoryContext, run_in_memory

PW = b"pw"

#: the writer runs on the compiled pending adds and codec, and on the pure-Python ones
pytestmark = pytest.mark.usefixtures("hot_path")


async def new_ledger(ctx: MemoryContext, e: int = 3, qw: int = 3, qa: int = 2) -> LedgerHandle:
    lid = await ctx.ledgers.new_ledger_id()
    md = await ctx.ledgers.create(LedgerMetadata(
        ledger_id=lid, ensemble_size=e, write_quorum=qw, ack_quorum=qa, digest_type="crc32c",
        password_check=password_check(PW), ensembles=[(0, list(ctx.bookies)[:e])]))
    return LedgerHandle(ctx, md, PW)


def test_acks_reach_the_application_in_entry_order_while_one_bookie_is_held(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        faults = FaultInjector().install(ctx)
        held = faults.hold("b0", direction="response", ops={Op.ADD_BATCH})
        lh = await new_ledger(ctx)
        order: list[int] = []
        futs = [lh.append_async(b"e%d" % i) for i in range(50)]
        for f in futs:
            f.add_done_callback(lambda f: order.append(f.result()))
        assert await asyncio.gather(*futs) == list(range(50))  # b1 and b2 make the ack quorum
        assert order == list(range(50))
        held.release()
        await lh.close()
        rh = ReadHandle(ctx, await ctx.ledgers.read(lh.ledger_id), PW)
        assert [e.payload for e in await rh.read(0, 49)] == [b"e%d" % i for i in range(50)]

    run_in_memory(tmp_path, test)


def test_a_reader_skips_a_corrupt_copy_and_names_a_digest_mismatch_only_when_every_copy_is_bad(
        tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        lh = await new_ledger(ctx)
        await lh.append_many([b"a", b"b", b"c"])
        for bookie in ctx.bookies.values():
            bookie.entries[(lh.ledger_id, 1)] = bookie.entries[(lh.ledger_id, 1)][:-1] + b"X"
            if bookie.bookie_id == "b0":
                bookie.entries[(lh.ledger_id, 0)] = bookie.entries[(lh.ledger_id, 0)][:-1] + b"X"
        assert (await lh.read_entry(0)).payload == b"a"  # b0 is asked first; b1 has a good copy
        assert [e.payload for e in await lh.read(0, 0)] == [b"a"]
        with pytest.raises(DigestMismatchError):
            await lh.read_entry(1)

    run_in_memory(tmp_path, test)


def test_an_unreachable_ensemble_is_unavailable_whatever_its_bookies_are_called(tmp_path: Path) -> None:
    """The reader tells a bad copy from an unreachable bookie by the error's type: bookies
    whose ids contain "digest" once made every failed read a digest mismatch."""

    async def test(ctx: MemoryContext) -> None:
        lh = await new_ledger(ctx)
        await lh.append(b"a")
        for bookie in ctx.bookies.values():
            bookie.up = False
        with pytest.raises(BookieUnavailableError):
            await lh.read_entry(0)
        with pytest.raises(BookieUnavailableError):
            await lh.read_entry(0, fence=True)

    run_in_memory(tmp_path, test, names=("digest-a", "digest-b", "digest-c"), read_timeout_s=0.2,
        speculative_read_timeout_ms=0)


def test_a_readers_last_add_confirmed_only_rises_and_a_writers_is_moved_by_its_acks_alone(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        lh = await new_ledger(ctx)
        await lh.append_many([b"a", b"b", b"c"])
        rh = ReadHandle(ctx, await ctx.ledgers.read(lh.ledger_id), PW)
        assert rh.last_add_confirmed == -1
        assert rh.advance_lac(1) == 1
        assert rh.advance_lac(0) == 1  # an older answer never lowers it
        assert [e.payload for e in await rh.read(0)] == [b"a", b"b"]
        with pytest.raises(InvalidArgumentError, match="advances only with its acknowledged adds"):
            lh.advance_lac(10)
        assert lh.last_add_confirmed == 2
        await lh.close()

    run_in_memory(tmp_path, test)


def test_recovery_closes_at_the_last_entry_before_the_first_one_no_quorum_has(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        lh = await new_ledger(ctx)
        await lh.append_many([b"e%d" % i for i in range(5)])
        lid = lh.ledger_id
        stray = [lh.digest.sign(5, 4, b"e5"), lh.digest.sign(7, 4, b"e7")]
        # entry 5 reached one bookie, entry 6 none, entry 7 one (within the read-ahead window)
        await ctx.bookie_client.recovery_add("b0", lid, 5, lh.master_key, stray[0], 5)
        await ctx.bookie_client.recovery_add("b1", lid, 7, lh.master_key, stray[1], 5)
        md = await recover(ctx, await ctx.ledgers.read(lid), PW)
        assert md.is_closed and md.last_entry_id == 5
        assert md.length == sum(len(b"e%d" % i) for i in range(6))
        assert all((lid, 5) in b.entries for b in ctx.bookies.values())  # written back to its write set
        assert all(lid in b.fenced for b in ctx.bookies.values())
        with pytest.raises(LedgerFencedError):
            await lh.append(b"late")
        with pytest.raises(NoSuchEntryError):
            await ReadHandle(ctx, md, PW).read(6, 7)

    run_in_memory(tmp_path, test)


def test_recovery_has_several_fencing_reads_in_flight(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        lh = await new_ledger(ctx)
        await lh.append_many([b"e%d" % i for i in range(3)])
        faults = FaultInjector().install(ctx)
        held = faults.hold("b2", direction="response", ops={Op.READ})
        task = asyncio.ensure_future(recover(ctx, await ctx.ledgers.read(lh.ledger_id), PW))
        await held.wait_hits(READ_AHEAD)  # b2 was asked for READ_AHEAD entries before answering one
        held.release()
        md = await task
        assert md.last_entry_id == 2

    run_in_memory(tmp_path, test)
