"""A writer's ensemble change, one attempt (``ledgerstore.client.ensemble_change``), against a
narrow client context with in-process bookies and sqlite metadata: each outcome the writer acts
on, and the metadata each one leaves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ledgerstore.client.ensemble_change import Changed, EnsembleChange, LedgerGone, NoReplacement, Raced
from ledgerstore.errors import BookieUnavailableError
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.proto.digest import password_check
from tests.unit.memory_bookies import MemoryContext, run_in_memory

REASON = BookieUnavailableError("b1 lost")


async def open_ledger(ctx: MemoryContext) -> LedgerMetadata:
    lid = await ctx.ledgers.new_ledger_id()
    return await ctx.ledgers.create(LedgerMetadata(
        ledger_id=lid, ensemble_size=3, write_quorum=3, ack_quorum=2, digest_type="crc32c",
        password_check=password_check(b""), ensembles=[(0, ["b0", "b1", "b2"])]))


def test_a_change_writes_a_new_fragment_from_the_first_unacknowledged_entry_without_any_failed_bookie(
        tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        md = await open_ledger(ctx)
        outcome = await EnsembleChange(ctx, md, 5, ["b1"], {"b1", "b3"}, REASON).attempt()
        assert outcome == Changed(outcome.md, 5, ["b0", "b1", "b2"], ["b0", "b4", "b2"])  # b3 failed too
        assert (await ctx.ledgers.read(md.ledger_id)).ensembles == [(0, ["b0", "b1", "b2"]), (5, ["b0", "b4", "b2"])]

    run_in_memory(tmp_path, test, names=["b0", "b1", "b2", "b3", "b4"])


def test_no_bookie_left_to_replace_the_failed_one_changes_nothing(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        md = await open_ledger(ctx)
        outcome = await EnsembleChange(ctx, md, 0, ["b1"], {"b1"}, REASON).attempt()
        assert isinstance(outcome, NoReplacement) and outcome.failed == ["b1"]
        assert await ctx.ledgers.read(md.ledger_id) == md

    run_in_memory(tmp_path, test)


def test_metadata_changed_by_someone_else_on_an_open_ledger_is_handed_back_to_start_again(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        md = await open_ledger(ctx)
        moved = await ctx.ledgers.write(dataclasses.replace(md, custom={"by": "auto-recovery"}))
        outcome = await EnsembleChange(ctx, md, 0, ["b1"], {"b1"}, REASON).attempt()
        assert outcome == Raced(moved)

    run_in_memory(tmp_path, test, names=["b0", "b1", "b2", "b3"])


def test_a_ledger_recovered_by_another_client_meanwhile_fails_the_change_as_fenced(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        md = await open_ledger(ctx)
        await ctx.ledgers.write(dataclasses.replace(md, state=LedgerState.IN_RECOVERY))
        outcome = await EnsembleChange(ctx, md, 0, ["b1"], {"b1"}, REASON).attempt()
        assert isinstance(outcome, LedgerGone)
        assert "is in_recovery (recovered by another client)" in str(outcome.error).lower()

    run_in_memory(tmp_path, test, names=["b0", "b1", "b2", "b3"])
