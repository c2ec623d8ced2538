"""BookieClient against in-process bookies and the fault-injecting transport: each typed request
maps a bookie's status to its exception type, and channel faults surface as the errors the
handles rely on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledgerstore.errors import (
    BookieUnavailableError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    TimeoutError_,
    UnauthorizedAccessError,
)
from ledgerstore.proto import codec
from ledgerstore.proto.codec import Op, Status
from ledgerstore.proto.digest import DigestManager
from ledgerstore.testing.faults import FaultInjector
from tests.unit.memory_bookies import MemoryBookie, MemoryContext, run_in_memory

KEY = b"k" * 20
LID = 7


def signed(eid: int, payload: bytes = b"x", lac: int = -1) -> bytes:
    return DigestManager(LID, "crc32c", b"").sign(eid, lac, payload)


def test_each_status_becomes_its_exception_type(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        bc = ctx.bookie_client
        await bc.recovery_add("b0", LID, 0, KEY, signed(0), 5)
        assert await bc.read("b0", LID, 0, 5) == signed(0)
        with pytest.raises(NoSuchEntryError):
            await bc.read("b0", LID, 1, 5)
        with pytest.raises(NoSuchLedgerError):
            await bc.read("b0", LID + 1, 0, 5)
        with pytest.raises(UnauthorizedAccessError):
            await bc.read_lac("b0", LID, 5, fence_key=b"other key")
        items = await bc.read_multi("b0", LID, [0, 1], 5)
        assert [(e, st) for e, st, _ in items] == [(0, Status.OK), (1, Status.NO_SUCH_ENTRY)]

    run_in_memory(tmp_path, test)


def test_a_fencing_read_makes_the_bookie_refuse_adds_but_not_recovery_adds(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        bc = ctx.bookie_client
        await bc.recovery_add("b1", LID, 0, KEY, signed(0, lac=-1), 5)
        await bc.recovery_add("b1", LID, 1, KEY, signed(1, lac=0), 5)
        assert await bc.read_lac("b1", LID, 5, fence_key=KEY) == 0
        assert LID in ctx.bookies["b1"].fenced
        await bc.recovery_add("b1", LID, 2, KEY, signed(2, lac=1), 5)  # recovery adds pass the fence
        answered: asyncio.Future[codec.Response | None] = ctx.loop.create_future()
        items = codec.add_batch_items(DigestManager(LID, "crc32c", b""), 3, 2, [b"x"])
        bc.add_batch("b1", codec.add_batch_body_of_items(LID, KEY, items),
                     lambda resp, exc: answered.set_result(resp), 5)
        resp = await answered
        assert resp is not None and resp.items[0][1] == Status.FENCED

    run_in_memory(tmp_path, test)


def test_a_dropped_request_times_out_and_a_lost_connection_fails_what_is_in_flight(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        bc = ctx.bookie_client
        faults = FaultInjector().install(ctx)
        await bc.recovery_add("b2", LID, 0, KEY, signed(0), 5)
        faults.drop("b2", ops={Op.READ}, times=1)
        with pytest.raises(TimeoutError_):
            await bc.read("b2", LID, 0, 0.2)
        assert await bc.read("b2", LID, 0, 5) == signed(0)  # the rule took one frame only
        held = faults.hold("b2", direction="response", ops={Op.READ_LAC})
        pending = asyncio.ensure_future(bc.read_lac("b2", LID, 5))
        await held.wait_hits(1)
        await ctx.pool.get("b2").close()
        with pytest.raises(BookieUnavailableError):
            await pending

    run_in_memory(tmp_path, test)


def test_a_channel_reconnects_after_a_lost_connection_and_fails_fast_for_an_unreachable_bookie(
        tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        bc = ctx.bookie_client
        await bc.recovery_add("b0", LID, 0, KEY, signed(0), 5)
        await ctx.pool.get("b0").close()
        assert await bc.read("b0", LID, 0, 5) == signed(0)  # through a new connection
        with pytest.raises(BookieUnavailableError, match="nobody"):
            await bc.read("nobody", LID, 0, 5)  # no waiting for the timeout

    run_in_memory(tmp_path, test)


class AnswersEverythingAsAnAdd(MemoryBookie):
    """A peer that answers every request, under its request id and with status OK, as if it were
    an ADD: well-formed frames of the wrong kind."""

    def answer(self, frame: bytes) -> bytes:
        rid = codec.peek_header(frame)[3]
        return codec.encode_add_response(rid, Status.OK, LID, 0)


def test_an_answer_of_another_operation_is_a_protocol_error_not_a_value(tmp_path: Path) -> None:
    async def test(ctx: MemoryContext) -> None:
        ctx.bookies["b0"] = AnswersEverythingAsAnAdd("b0")
        bc = ctx.bookie_client
        with pytest.raises(ProtocolError, match="AddResponse, not a ReadLacResponse"):
            await bc.read_lac("b0", LID, 5)  # not "LAC -1"
        with pytest.raises(ProtocolError, match="not a ReadResponse"):
            await bc.read("b0", LID, 0, 5)  # not an empty entry
        with pytest.raises(ProtocolError, match="not a ListLedgersResponse"):
            await bc.list_ledgers("b0", 0, 10, 5)  # not "holds no ledgers"
        await bc.recovery_add("b0", LID, 0, KEY, signed(0), 5)  # the kind it does answer

    run_in_memory(tmp_path, test)
