"""Typed requests to bookies (BookKeeper's ``BookieClient``): each coroutine encodes its request,
sends it over the bookie's channel and maps a status other than OK to the matching exception
(:func:`ledgerstore.errors.error_for_status`), in this one place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ledgerstore.client.channel import ChannelPool, ResponseCallback
from ledgerstore.errors import BadRequestError, LedgerStoreError, ProtocolError, error_for_status
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Status

ReadItems = tuple[tuple[int, int, bytes], ...]
R = TypeVar("R", bound=codec.Response)


def status_error(bookie_id: str, what: str, status: int) -> LedgerStoreError:
    """The exception for a bookie's non-OK answer to ``what``, its message naming both."""
    name = Status(status).name if status in Status._value2member_map_ else str(status)
    return error_for_status(status, f"bookie {bookie_id} answered {name} to {what}")


class BookieClient:
    """Requests to any bookie, by bookie id, over a :class:`ChannelPool` (whose interceptor is
    the fault-injection seam). Timeouts come from the caller; an unanswered request raises
    :class:`~ledgerstore.errors.TimeoutError_`, a lost connection
    :class:`~ledgerstore.errors.BookieUnavailableError`."""

    def __init__(self, pool: ChannelPool) -> None:
        self.pool = pool

    async def _call(self, bookie_id: str, frame_of: Callable[[int], bytes], timeout: float, what: str,
                    kind: type[R]) -> R:
        resp = await self.pool.get(bookie_id).request(frame_of, timeout)
        if resp.status != Status.OK:
            raise status_error(bookie_id, what, resp.status)
        if not isinstance(resp, kind):
            raise ProtocolError(f"bookie {bookie_id} answered {what} with a {type(resp).__name__}, "
                                f"not a {kind.__name__}")
        return resp

    def add_batch(self, bookie_id: str, body: bytes, callback: ResponseCallback, timeout: float) -> None:
        """Send an ADD_BATCH ``body`` (see :func:`codec.add_batch_body_of_items`); ``callback``
        gets the raw answer, whose per-entry statuses the writer handles itself (the hot path:
        no coroutine per frame)."""
        ch = self.pool.get(bookie_id)
        rid = ch.next_rid()
        ch.send_parts(rid, (codec.add_batch_header(rid), body), callback, timeout)

    async def read(self, bookie_id: str, ledger_id: int, entry_id: int, timeout: float, *,
                   fence_key: bytes | None = None) -> bytes:
        """The signed bytes of one entry (not verified). With ``fence_key`` (the ledger's master
        key) the read also fences the ledger on that bookie."""
        key, flags = (b"", 0) if fence_key is None else (fence_key, FLAG_FENCE)
        resp = await self._call(bookie_id, lambda rid: codec.encode_read(rid, ledger_id, entry_id, key, flags),
                                timeout, f"a read of entry {entry_id} of ledger {ledger_id}", codec.ReadResponse)
        return resp.entry

    async def read_multi(self, bookie_id: str, ledger_id: int, entry_ids: Sequence[int], timeout: float) -> ReadItems:
        """``(entry id, status, signed bytes)`` for each of ``entry_ids`` (one request)."""
        ids = list(entry_ids)
        resp = await self._call(bookie_id, lambda rid: codec.encode_read_multi(rid, ledger_id, ids), timeout,
                                f"a read of {len(ids)} entries of ledger {ledger_id}", codec.ReadMultiResponse)
        return resp.items

    async def read_lac(self, bookie_id: str, ledger_id: int, timeout: float, *, fence_key: bytes | None = None) -> int:
        """The bookie's last-add-confirmed of the ledger; with ``fence_key`` it fences it too."""
        key, flags = (b"", 0) if fence_key is None else (fence_key, FLAG_FENCE)
        resp = await self._call(bookie_id, lambda rid: codec.encode_read_lac(rid, ledger_id, key, flags), timeout,
                                f"{'fencing' if flags else 'a LAC read of'} ledger {ledger_id}", codec.ReadLacResponse)
        return resp.lac

    async def long_poll_lac(self, bookie_id: str, ledger_id: int, known: int, wait_s: float, timeout: float) -> int:
        """The LAC as soon as it passes ``known`` on the bookie, or after ``wait_s`` seconds."""
        ms = int(wait_s * 1000)
        resp = await self._call(bookie_id, lambda rid: codec.encode_long_poll_lac(rid, ledger_id, known, ms),
                                timeout, f"a LAC long poll of ledger {ledger_id}", codec.LongPollLacResponse)
        return resp.lac

    async def list_ledgers(self, bookie_id: str, first: int, most: int, timeout: float) -> list[tuple[int, int]]:
        """``(ledger id, last entry stored)`` of up to ``most`` ledgers the bookie holds, from
        ledger ``first`` on, in id order."""
        resp = await self._call(bookie_id, lambda rid: codec.encode_list_ledgers(rid, first, most), timeout,
                                f"a listing of ledgers from {first}", codec.ListLedgersResponse)
        return list(resp.items)

    async def bookie_info(self, bookie_id: str, timeout: float) -> codec.BookieInfoResponse:
        """The bookie's disk space, ledger count, mode and process instance (BOOKIE_INFO with
        ``FLAG_INSTANCE``; an older bookie, which refuses the flag, is asked again without it and
        its answer's instance is 0)."""
        try:
            return await self._call(bookie_id, lambda rid: codec.encode_bookie_info(rid, codec.FLAG_INSTANCE),
                                    timeout, "a bookie-info request", codec.BookieInfoResponse)
        except BadRequestError:
            return await self._call(bookie_id, codec.encode_bookie_info, timeout, "a bookie-info request",
                                    codec.BookieInfoResponse)

    async def recovery_add(self, bookie_id: str, ledger_id: int, entry_id: int, master_key: bytes, data: bytes,
                           timeout: float) -> None:
        """Store signed ``data`` as entry ``entry_id`` with a recovery add (it passes the fence)."""
        await self._call(
            bookie_id, lambda rid: codec.encode_add(rid, ledger_id, entry_id, master_key, data, FLAG_RECOVERY_ADD),
            timeout, f"a recovery add of entry {entry_id} of ledger {ledger_id}", codec.AddResponse)


    async def recovery_add_batch(self, bookie_id: str, ledger_id: int, master_key: bytes,
                                 entries: Sequence[tuple[int, bytes]], timeout: float) -> None:
        """Store many signed ``(entry id, data)`` of one ledger with one recovery add (one
        ADD_BATCH frame with the recovery flag: it passes the fence); raises for the first entry
        the bookie did not store."""
        what = f"a recovery add of {len(entries)} entries of ledger {ledger_id}"
        resp = await self._call(
            bookie_id, lambda rid: codec.AddBatchRequest.frame(rid, ledger_id, master_key, entries, FLAG_RECOVERY_ADD),
            timeout, what, codec.AddBatchResponse)
        if resp.all_ok and resp.count == len(entries):
            return
        stored = {e for e, st in resp.items if st == Status.OK}
        for eid, st in resp.items:
            if st != Status.OK:
                raise status_error(bookie_id, f"{what} (entry {eid})", st)
        if len(stored) != len(entries):
            raise ProtocolError(f"bookie {bookie_id} answered {len(stored)} results to {what}")
