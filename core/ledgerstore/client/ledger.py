"""Ledger handles: the writer (pipelined striped adds, in-order acks, ensemble change, close)
and the reader (reads with replica fallback, LAC, long-poll tailing), and recovery."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from time import perf_counter
from typing import TYPE_CHECKING

from ledgerstore.client.metrics import CLIENT_METRICS
from ledgerstore.errors import (
    AddFailedError,
    BadVersionError,
    BookieUnavailableError,
    DigestMismatchError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerRecoveryError,
    LedgerStoreError,
    NoSuchEntryError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
    error_for_status,
)
from ledgerstore.meta.ledgers import LedgerMetadata, LedgerState
from ledgerstore.plugins import notify
from ledgerstore.proto import codec
from ledgerstore.proto.codec import FLAG_FENCE, FLAG_RECOVERY_ADD, Status
from ledgerstore.proto.digest import DigestManager, Entry, master_key

if TYPE_CHECKING:
    from ledgerstore.client.client import Client

log = logging.getLogger(__name__)

#: wait before resending adds a bookie refused with TOO_MANY_REQUESTS
_THROTTLE_BACKOFF_S = 0.02
#: most entries in one ADD_BATCH frame
_BATCH_ENTRIES = 4096
#: entries read per round of READ_MULTI requests, and per request
_READ_WINDOW = 20_000
_READ_MULTI_ENTRIES = 2_000
#: bytes a frame adds around one payload: frame and batch headers, the entry header, the
#: largest digest (HMAC-SHA256), with room to spare
_FRAME_OVERHEAD = 256
_BOOKIE_FAILURES = frozenset({Status.IO_ERROR, Status.READ_ONLY, Status.TOO_MANY_REQUESTS, Status.BAD_REQUEST})


class _Group:
    """Entries first sent together: one ADD_BATCH frame to each bookie of their write sets.

    Bit ``i`` of ``acked`` is set once ensemble index ``i`` stored every entry of the group sent
    to it (a compact all-OK answer), so a whole frame is acknowledged without per-entry work.
    ``stale`` marks indexes whose bookie an ensemble change replaced: answers the old bookie
    gives for them no longer count (the new bookie's count per entry, in ``_PendingAdd.acked``).
    """

    __slots__ = ("acked", "stale", "ensemble")

    def __init__(self, ensemble: list[str]) -> None:
        self.acked = 0
        self.stale = 0
        self.ensemble = ensemble


class _PendingAdd:
    """One add until it is acknowledged. ``item`` is the signed entry as an ADD_BATCH item
    (entry id and length first), ready for any frame. ``acked`` and ``failed`` are bit sets of
    ensemble indexes (per-entry answers; group-wide ones are in ``group.acked``); ``ensemble`` is
    the bookie list the entry was last sent to (None: not sent yet)."""

    __slots__ = ("entry_id", "item", "future", "group", "wsmask", "acked", "failed", "ensemble", "done", "started")

    def __init__(self, entry_id: int, item: bytes, future: asyncio.Future[int] | None, wsmask: int) -> None:
        self.entry_id = entry_id
        self.item = item
        self.future = future
        self.group: _Group | None = None
        self.wsmask = wsmask
        self.acked = 0
        self.failed = 0
        self.ensemble: list[str] | None = None
        self.done = False
        #: perf_counter() of the append whose future this add carries (0: none; add latency metric)
        self.started = 0.0


class ReadHandle:
    """Reads a ledger. Obtained from ``Client.open_ledger``; also the base of the writer."""

    def __init__(self, client: Client, md: LedgerMetadata, password: bytes) -> None:
        self.client = client
        self.md = md
        self.ledger_id = md.ledger_id
        self.digest = DigestManager(md.ledger_id, md.digest_type, password)
        self.master_key = master_key(password)
        self._lac = md.last_entry_id if md.is_closed else -1

    @property
    def last_add_confirmed(self) -> int:
        """Last entry known to be acknowledged (the ledger's last entry once closed)."""
        return self._lac

    @property
    def is_closed(self) -> bool:
        return self.md.is_closed

    @property
    def metadata(self) -> LedgerMetadata:
        return self.md

    @property
    def length(self) -> int:
        return self.md.length

    # --- reading --------------------------------------------------------------------------------

    async def read(self, first: int, last: int | None = None, *, allow_beyond_lac: bool = False) -> list[Entry]:
        """Entries ``first..last`` inclusive (``last`` defaults to the LAC), verified."""
        if last is None:
            last = self._lac
        if first < 0 or last < first:
            if last == first - 1:
                return []
            raise InvalidArgumentError(f"bad entry range {first}..{last} for ledger {self.ledger_id}")
        if last > self._lac and not allow_beyond_lac:
            if self.md.is_closed:
                raise NoSuchEntryError(
                    f"ledger {self.ledger_id} is closed at entry {self.md.last_entry_id}; asked for up to {last}")
            raise NoSuchEntryError(
                f"entry {last} of ledger {self.ledger_id} is beyond the last add confirmed ({self._lac}); "
                "call read_last_add_confirmed() or pass allow_beyond_lac=True")
        out: list[Entry] = []
        eid = first
        while eid <= last:
            hi = min(last, eid + _READ_WINDOW - 1)
            out.extend(await self._read_range(eid, hi))
            eid = hi + 1
        return out

    async def _read_range(self, first: int, last: int) -> list[Entry]:
        """Ask each entry's preferred replica, many entries per READ_MULTI request; anything not
        answered with a valid copy goes through :meth:`read_entry` (fallback, speculation)."""
        started = perf_counter()
        md = self.md
        plan: dict[str, list[int]] = {}
        e_size = md.ensemble_size
        fragments = md.ensembles
        for i, (frag_first, ensemble) in enumerate(fragments):
            frag_last = fragments[i + 1][0] - 1 if i + 1 < len(fragments) else last
            lo, hi = max(first, frag_first), min(last, frag_last)
            if lo > hi:
                continue
            # entries with the same id modulo E share a write set: one preferred replica each
            for r in range(e_size):
                start = lo + (r - lo) % e_size
                if start > hi:
                    continue
                order = self.client._read_order(ensemble, md.write_set(start))
                ids = range(start, hi + 1, e_size)
                plan.setdefault(ensemble[order[0]], []).extend(ids)
        timeout = self.client.config.read_timeout_s
        lid = self.ledger_id
        futs = []
        for bid, ids in plan.items():
            ids.sort()
            ch = self.client.pool.get(bid)
            for i in range(0, len(ids), _READ_MULTI_ENTRIES):
                chunk = ids[i : i + _READ_MULTI_ENTRIES]
                futs.append(ch.request(lambda rid, chunk=chunk: codec.encode_read_multi(rid, lid, chunk), timeout))
        got: dict[int, Entry] = {}
        verify_into = self.digest.verify_into
        for r in await asyncio.gather(*futs, return_exceptions=True):
            if isinstance(r, codec.Response) and r.status == Status.OK:
                verify_into(r.items, got)  # invalid copies are left out: the fallback asks other replicas
        if len(got) != last - first + 1:
            missing = [e for e in range(first, last + 1) if e not in got]
            for e, entry in zip(missing, await asyncio.gather(*(self.read_entry(e) for e in missing)), strict=True):
                got[e] = entry
        CLIENT_METRICS.read_seconds.observe(perf_counter() - started)
        return [got[e] for e in range(first, last + 1)]

    async def iter_entries(self, first: int = 0, last: int | None = None, batch: int = 1000,
                           read_ahead: int = 1) -> AsyncIterator[Entry]:
        """Iterate entries in batches (bounded memory: ``read_ahead`` more batches are read while
        the caller consumes one, so the bookies work while the caller does)."""
        end = self._lac if last is None else last
        ranges = ((lo, min(end, lo + batch - 1)) for lo in range(first, end + 1, batch))
        ahead: collections.deque[asyncio.Task[list[Entry]]] = collections.deque()
        try:
            for lo, hi in ranges:
                ahead.append(asyncio.ensure_future(self.read(lo, hi)))
                if len(ahead) > read_ahead:
                    for e in await ahead.popleft():
                        yield e
            while ahead:
                for e in await ahead.popleft():
                    yield e
        finally:
            for t in ahead:
                t.cancel()

    async def read_entry(self, entry_id: int, *, fence: bool = False) -> Entry:
        """One entry, from the first replica of its write set that has it with a valid digest;
        a speculative request goes to the next replica if one is slow."""
        md = self.md
        _, ensemble = md.ensemble_for(entry_id)
        order = self.client._read_order(ensemble, md.write_set(entry_id))
        timeout = self.client.config.read_timeout_s
        spec = self.client.config.speculative_read_timeout_ms / 1000.0
        flags = FLAG_FENCE if fence else 0
        key = self.master_key if fence else b""
        statuses: list[str] = []
        missing = 0
        pending: set[asyncio.Future[codec.Response]] = set()
        owner: dict[asyncio.Future[codec.Response], str] = {}
        next_i = 0

        def launch() -> None:
            nonlocal next_i
            bid = ensemble[order[next_i]]
            next_i += 1
            ch = self.client.pool.get(bid)
            fut = ch.request(lambda rid: codec.encode_read(rid, self.ledger_id, entry_id, key, flags), timeout)
            pending.add(fut)
            owner[fut] = bid

        launch()
        while pending:
            wait_for = spec if (spec > 0 and next_i < len(order)) else None
            done, _ = await asyncio.wait(pending, timeout=wait_for, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # speculative: ask the next replica too
                launch()
                continue
            for fut in done:
                pending.discard(fut)
                bid = owner.pop(fut)
                exc = fut.exception()
                if exc is not None:
                    statuses.append(f"{bid}: {exc}")
                else:
                    resp = fut.result()
                    if resp.status == Status.OK:
                        try:
                            entry = self.digest.verify(resp.entry, entry_id)
                        except DigestMismatchError as dexc:
                            statuses.append(f"{bid}: {dexc}")
                        else:
                            for other in pending:
                                other.cancel()
                            return entry
                    elif resp.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
                        missing += 1
                        statuses.append(f"{bid}: {Status(resp.status).name}")
                    elif resp.status == Status.UNAUTHORIZED:
                        raise UnauthorizedAccessError(f"bookie {bid} refused the password for ledger {self.ledger_id}")
                    else:
                        statuses.append(f"{bid}: {Status(resp.status).name}")
            if not pending and next_i < len(order):
                launch()
        if missing == len(order):
            raise NoSuchEntryError(f"no replica of ledger {self.ledger_id} has entry {entry_id} ({'; '.join(statuses)})")
        if missing and all("DigestMismatch" not in s and "digest" not in s for s in statuses) and fence:
            raise NoSuchEntryError(f"entry {entry_id} of ledger {self.ledger_id}: {'; '.join(statuses)}")
        if any("digest" in s for s in statuses):
            raise DigestMismatchError(f"entry {entry_id} of ledger {self.ledger_id}: no replica has a valid copy ({'; '.join(statuses)})")
        raise BookieUnavailableError(f"cannot read entry {entry_id} of ledger {self.ledger_id}: {'; '.join(statuses)}")

    async def read_last_add_confirmed(self) -> int:
        """Ask the last fragment's bookies for the LAC (for readers of an open ledger)."""
        if self.md.is_closed:
            return self._lac
        ensemble = self.md.current_ensemble
        timeout = self.client.config.read_timeout_s
        futs = [self.client.pool.get(b).request(lambda rid: codec.encode_read_lac(rid, self.ledger_id), timeout)
                for b in ensemble]
        best = self._lac
        ok = 0
        for r in await asyncio.gather(*futs, return_exceptions=True):
            if isinstance(r, codec.Response) and r.status == Status.OK:
                ok += 1
                best = max(best, r.lac)
        if ok == 0:
            await self._refresh_metadata()
            if self.md.is_closed:
                return self._lac
        self._lac = max(self._lac, best)
        return self._lac

    async def wait_for_lac(self, known: int, timeout: float = 10.0) -> int:
        """Long-poll: return as soon as the LAC passes ``known`` (or ``timeout`` elapses)."""
        if self._lac > known:
            return self._lac
        if not self.md.is_closed:
            ensemble = self.md.current_ensemble
            ms = int(timeout * 1000)
            futs = [
                self.client.pool.get(b).request(
                    lambda rid: codec.encode_long_poll_lac(rid, self.ledger_id, known, ms),
                    timeout + self.client.config.read_timeout_s,
                )
                for b in ensemble
            ]
            pending = set(futs)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for f in done:
                    if not f.exception() and f.result().status == Status.OK:
                        self._lac = max(self._lac, f.result().lac)
                if self._lac > known:
                    break
            for f in pending:
                f.cancel()
        if self._lac <= known:
            await self._refresh_metadata()
        return self._lac

    async def _refresh_metadata(self) -> None:
        md = await self.client.ledgers.read(self.ledger_id)
        self.md = md
        if md.is_closed:
            self._lac = md.last_entry_id

    async def close(self) -> None:
        """Release the handle (a reader has nothing to persist)."""


class LedgerHandle(ReadHandle):
    """The single writer of a ledger."""

    def __init__(self, client: Client, md: LedgerMetadata, password: bytes) -> None:
        super().__init__(client, md, password)
        self._next_entry_id = 0
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._error: LedgerStoreError | None = None
        self._closing = False
        self._changing = False
        self._failed_bookies: set[str] = set()
        self._length = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._space = asyncio.Event()
        self._space.set()
        self._ensemble_task: asyncio.Task[None] | None = None
        #: new adds not sent yet (they leave together at the end of the loop iteration)
        self._unsent: list[_PendingAdd] = []
        #: resends of single entries to single bookies: (bookie, ensemble index) -> adds
        self._resends: dict[tuple[str, int], list[_PendingAdd]] = {}
        self._flush_scheduled = False
        self._ws_md: LedgerMetadata | None = None
        self._ws_masks: list[int] = []
        #: optional ``(entry_id, bookie_id)`` callback for every bookie acknowledgement (tests, tools)
        self.ack_observer: Callable[[int, str], None] | None = None

    # --- adding --------------------------------------------------------------------------------

    def _refusal(self) -> LedgerStoreError | None:
        if self._error is not None:
            return self._error
        if self._closing or self.md.is_closed:
            return LedgerClosedError(f"ledger {self.ledger_id} is closed")
        return None

    def _max_payload(self) -> int:
        """Largest payload that fits one frame with its headers and digest."""
        return self.client.config.max_frame_size - _FRAME_OVERHEAD - len(self.master_key)

    def _too_large(self, size: int) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"payload of {size} bytes does not fit a frame of max_frame_size={self.client.config.max_frame_size} "
            f"bytes (at most {self._max_payload()} bytes of payload); nothing was sent and the ledger "
            "handle stays usable")

    def _masks(self) -> list[int]:
        """Write-set bit masks by ``entry_id % ensemble_size`` (recomputed when metadata changes)."""
        md = self.md
        if self._ws_md is not md:
            self._ws_masks = [sum(1 << i for i in md.write_set(e)) for e in range(md.ensemble_size)]
            self._ws_md = md
        return self._ws_masks

    def append_async(self, payload: bytes) -> asyncio.Future[int]:
        """Queue an add; the future resolves to the entry id once Qa bookies acknowledged it and
        every earlier entry was acknowledged. Must be called on the client's event loop."""
        fut: asyncio.Future[int] = self.client.loop.create_future()
        refusal = self._refusal()
        if refusal is not None:
            fut.set_exception(refusal)
            return fut
        if not isinstance(payload, bytes | bytearray | memoryview):
            fut.set_exception(InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}"))
            return fut
        if len(payload) > self._max_payload():
            fut.set_exception(self._too_large(len(payload)))
            return fut
        eid = self._next_entry_id
        self._next_entry_id = eid + 1
        masks = self._masks()
        pa = _PendingAdd(eid, codec.add_batch_items(self.digest, eid, self._lac, (bytes(payload),))[0], fut,
                         masks[eid % len(masks)])
        pa.started = perf_counter()
        self._pending.append(pa)
        self._unsent.append(pa)
        self._length += len(payload)
        self._queued()
        return fut

    def append_many_async(self, payloads: Sequence[bytes]) -> asyncio.Future[int]:
        """Queue many adds at once; the future resolves to the entry id of the last one once all
        of them are acknowledged (in order, as with :meth:`append_async`). Their entry ids are
        consecutive, ending at the result. Much cheaper per entry than one future per add: use it
        when the caller only needs to know that a whole batch is stored. Must be called on the
        client's event loop."""
        fut: asyncio.Future[int] = self.client.loop.create_future()
        refusal = self._refusal()
        if refusal is not None:
            fut.set_exception(refusal)
            return fut
        if not payloads:
            fut.set_exception(InvalidArgumentError("append_many needs at least one payload"))
            return fut
        try:
            biggest = max(map(len, payloads))
        except TypeError:
            biggest = 0  # not bytes: reported below
        if biggest > self._max_payload():
            fut.set_exception(self._too_large(biggest))
            return fut
        try:
            items = codec.add_batch_items(self.digest, self._next_entry_id, self._lac, payloads)
        except TypeError:  # checked only on failure: a per-entry isinstance costs the hot loop
            bad = next(p for p in payloads if not isinstance(p, bytes | bytearray | memoryview))
            fut.set_exception(InvalidArgumentError(f"payloads must be bytes, not {type(bad).__name__}"))
            return fut
        self._queue_adds(items, sum(map(len, payloads)), fut)
        return fut

    def _queue_adds(self, items: list[bytes], length: int, fut: asyncio.Future[int]) -> None:
        """Queue signed ``items`` (of ``length`` payload bytes) as the next entries; ``fut`` goes
        with the last one."""
        eid = self._next_entry_id
        masks = self._masks()
        e_size = len(masks)
        pas = [_PendingAdd(e, d, None, masks[e % e_size]) for e, d in enumerate(items, eid)]
        pas[-1].future = fut
        pas[-1].started = perf_counter()
        self._pending.extend(pas)
        self._unsent.extend(pas)
        self._next_entry_id = eid + len(pas)
        self._length += length
        self._queued()

    def _queued(self) -> None:
        """Bookkeeping after adds joined the pending queue: not drained, maybe full, flush soon."""
        self._drained.clear()
        if len(self._pending) >= self.client.config.max_outstanding_adds > 0:
            self._space.clear()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.client.loop.call_soon(self._flush)

    async def append(self, payload: bytes) -> int:
        """Add one entry and wait for its acknowledgement; returns its entry id."""
        if not self._space.is_set():
            await self._space.wait()
        return await self.append_async(payload)

    async def append_many(self, payloads: Sequence[bytes]) -> int:
        """Add many entries and wait until all are acknowledged; returns the last one's entry id."""
        if not self._space.is_set():
            await self._space.wait()
        return await self.append_many_async(payloads)

    def _send(self, pa: _PendingAdd, only: set[int] | None = None) -> None:
        """Queue ``pa`` again for (some of) its write set's bookies in its fragment's ensemble;
        such resends leave as per-bookie batches at the end of the loop iteration."""
        md = self.md
        _, ensemble = md.ensemble_for(pa.entry_id)
        pa.ensemble = ensemble
        resends = self._resends
        for idx in md.write_set(pa.entry_id):
            if only is not None and idx not in only:
                continue
            key = (ensemble[idx], idx)
            b = resends.get(key)
            if b is None:
                resends[key] = [pa]
            else:
                b.append(pa)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.client.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send what this loop iteration queued: new adds as groups (each group's entries in one
        frame per bookie, encoded once when every bookie gets all of them), then resends."""
        self._flush_scheduled = False
        unsent, self._unsent = self._unsent, []
        if unsent and not self._changing and self._error is None:
            # while the ensemble changes, unsent adds wait: the change sends every pending add
            # that has no ensemble yet
            for chunk in self._chunks(unsent):
                self._send_group(chunk)
        if self._resends:
            resends, self._resends = self._resends, {}
            for (bid, idx), pas in resends.items():
                for chunk in self._chunks(pas):
                    body = codec.add_batch_body_of_items(self.ledger_id, self.master_key, [pa.item for pa in chunk])
                    self._send_frame(bid, idx, chunk, None, body)

    def _chunks(self, pas: list[_PendingAdd]) -> Iterator[list[_PendingAdd]]:
        """Consecutive slices of ``pas`` that fit one frame (entries and bytes)."""
        limit = self.client.config.max_frame_size // 2
        start = 0
        while start < len(pas):
            size = 0
            end = start
            stop = min(len(pas), start + _BATCH_ENTRIES)
            while end < stop and (size < limit or end == start):
                size += len(pas[end].item)
                end += 1
            yield pas[start:end]
            start = end

    def _send_group(self, pas: list[_PendingAdd]) -> None:
        md = self.md
        ensemble = md.current_ensemble
        group = _Group(ensemble)
        for pa in pas:
            pa.group = group
            pa.ensemble = ensemble
        e_size, wq = md.ensemble_size, md.write_quorum
        lid, key = self.ledger_id, self.master_key
        if e_size == wq:  # every bookie gets every entry: encode the frame once
            body = codec.add_batch_body_of_items(lid, key, [pa.item for pa in pas])
            for idx, bid in enumerate(ensemble):
                self._send_frame(bid, idx, pas, group, body)
            return
        per_idx: list[list[_PendingAdd]] = [[] for _ in range(e_size)]
        for pa in pas:
            for idx in md.write_set(pa.entry_id):
                per_idx[idx].append(pa)
        for idx, bid in enumerate(ensemble):
            if per_idx[idx]:
                body = codec.add_batch_body_of_items(lid, key, [pa.item for pa in per_idx[idx]])
                self._send_frame(bid, idx, per_idx[idx], group, body)

    def _send_frame(self, bid: str, idx: int, pas: list[_PendingAdd], group: _Group | None, body: bytes) -> None:
        ch = self.client.pool.get(bid)
        rid = ch.next_rid()
        ch.send(rid, codec.add_batch_header(rid) + body,
                lambda resp, exc: self._on_batch_response(pas, idx, bid, group, resp, exc),
                self.client.config.add_timeout_s)

    def _on_batch_response(self, pas: list[_PendingAdd], idx: int, bid: str, group: _Group | None,
                           resp: codec.Response | None, exc: BaseException | None) -> None:
        observer = self.ack_observer
        if resp is not None and resp.status == Status.OK and resp.count == len(pas):
            bit = 1 << idx
            if resp.all_ok:
                if group is not None:
                    if group.stale & bit:
                        return  # from a bookie replaced since (see _change_ensemble)
                    group.acked |= bit
                    if observer is not None:
                        for pa in pas:
                            if not pa.done:
                                observer(pa.entry_id, bid)
                else:
                    for pa in pas:
                        if not pa.done and pa.ensemble is not None and pa.ensemble[idx] == bid:
                            pa.acked |= bit
                            if observer is not None:
                                observer(pa.entry_id, bid)
                self._complete()
                return
            throttled: list[_PendingAdd] = []
            for pa, item in zip(pas, resp.items, strict=True):
                if pa.done or pa.ensemble is None or pa.ensemble[idx] != bid:
                    continue  # late answer for an acknowledged entry, or from a replaced bookie
                if item[1] == Status.OK:
                    pa.acked |= bit
                    if observer is not None:
                        observer(pa.entry_id, bid)
                elif item[1] == Status.TOO_MANY_REQUESTS:
                    throttled.append(pa)
                else:
                    self._add_failed(pa, idx, bid, int(item[1]), None)
                    if self._error is not None:
                        return
            self._complete()
            if throttled:  # the bookie is at its in-flight limit for us: back off, then resend
                self.client.loop.call_later(_THROTTLE_BACKOFF_S, self._resend_throttled, throttled, idx, bid)
            return
        status = resp.status if resp is not None else None
        if resp is not None and status == Status.OK:  # answered, but not for these entries
            status = Status.BAD_REQUEST
        for pa in pas:
            if not pa.done and pa.ensemble is not None and pa.ensemble[idx] == bid:
                self._add_failed(pa, idx, bid, status, exc)
                if self._error is not None:
                    return

    def _resend_throttled(self, pas: list[_PendingAdd], idx: int, bid: str) -> None:
        if self._error is not None:
            return
        for pa in pas:
            if not pa.done and pa.ensemble is not None and pa.ensemble[idx] == bid:
                self._send(pa, only={idx})

    def _add_failed(self, pa: _PendingAdd, idx: int, bid: str, status: int | None, exc: BaseException | None) -> None:
        if status == Status.FENCED:
            self._fail_all(LedgerFencedError(
                f"ledger {self.ledger_id} was fenced (recovery by another client); entries from "
                f"{self._lac + 1} on may or may not be written"))
            return
        if status == Status.UNAUTHORIZED:
            self._fail_all(UnauthorizedAccessError(f"bookie {bid} refused the master key of ledger {self.ledger_id}"))
            return
        if exc is not None:
            reason: BaseException = exc
        else:
            name = Status(status).name if status in Status._value2member_map_ else str(status)
            reason = error_for_status(status or 0, f"bookie {bid} answered {name}")
        pa.failed |= 1 << idx
        self._bookie_failed(bid, reason)

    def _complete(self) -> None:
        """Acknowledge, in entry order, every leading entry that has its ack quorum. Not while
        the ensemble changes: the new fragment starts after the last acknowledged entry, and an
        entry acknowledged meanwhile by the old bookies would never reach the replacement (as
        BookKeeper, completions wait for the change)."""
        if self._changing:
            return
        q = self._pending
        aq = self.md.ack_quorum
        popleft = q.popleft
        while q:
            pa = q[0]
            g = pa.group
            if ((pa.acked | g.acked) & pa.wsmask if g is not None else pa.acked).bit_count() < aq:
                break
            popleft()
            pa.done = True
            self._lac = pa.entry_id
            fut = pa.future
            if fut is not None and not fut.done():
                fut.set_result(pa.entry_id)
                CLIENT_METRICS.add_seconds.observe(perf_counter() - pa.started)
        if not q:
            self._drained.set()
        if not self._space.is_set() and len(q) < self.client.config.max_outstanding_adds:
            self._space.set()

    def _fail_all(self, error: LedgerStoreError) -> None:
        if self._error is None:
            self._error = error
        while self._pending:
            pa = self._pending.popleft()
            pa.done = True
            if pa.future is not None and not pa.future.done():
                pa.future.set_exception(error)
        self._unsent.clear()
        self._drained.set()
        self._space.set()

    def _bookie_failed(self, bid: str, reason: BaseException) -> None:
        if self._error is not None:
            return
        self._failed_bookies.add(bid)
        if self._ensemble_task is None and bid in self.md.current_ensemble:
            if self.client.config.ensemble_change:
                self._changing = True
                self._ensemble_task = self.client.loop.create_task(self._change_ensemble(reason))
            else:
                self._check_quorum_possible(reason)
        elif bid not in self.md.current_ensemble:
            self._check_quorum_possible(reason)

    def _check_quorum_possible(self, reason: BaseException) -> None:
        """Fail the handle if some pending entry can no longer reach its ack quorum."""
        wq, aq = self.md.write_quorum, self.md.ack_quorum
        for pa in self._pending:
            if wq - pa.failed.bit_count() < aq:
                self._fail_all(AddFailedError(
                    f"entry {pa.entry_id} of ledger {self.ledger_id} cannot reach its ack quorum of {aq}: {reason}"))
                return

    async def _change_ensemble(self, reason: BaseException) -> None:
        """Replace failed bookies of the current ensemble with a new fragment, by CAS."""
        try:
            while True:
                failed = [b for b in self.md.current_ensemble if b in self._failed_bookies]
                if not failed or self._error is not None:
                    break
                first = self._lac + 1
                old = list(self.md.current_ensemble)
                new = list(old)
                try:
                    bookies = await self.client.bookie_infos()
                    exclude = frozenset(self._failed_bookies)
                    for b in failed:
                        idx = new.index(b)
                        new[idx] = self.client.placement.replace_bookie(
                            new, self.md.write_quorum, self.md.ack_quorum, idx, bookies, exclude=exclude)
                except NotEnoughBookiesError as exc:
                    log.warning("ledger %d: no replacement for %s (%s); continuing with the remaining bookies",
                                self.ledger_id, failed, exc)
                    self._changing = False
                    self._resend_unsent()
                    self._check_quorum_possible(reason)
                    if self._error is None:
                        self._complete()
                    return
                md = self.md
                ensembles = [e for e in md.ensembles if e[0] < first] + [(first, new)]
                candidate = LedgerMetadata(**{**md.__dict__, "ensembles": ensembles})
                try:
                    self.md = await self.client.ledgers.write(candidate)
                except BadVersionError:
                    fresh = await self.client.ledgers.read(self.ledger_id)
                    if fresh.state is not LedgerState.OPEN:
                        self._fail_all(LedgerFencedError(
                            f"ledger {self.ledger_id} is {fresh.state.value} (recovered by another client) "
                            "while replacing a failed bookie"))
                        return
                    # someone else (auto-recovery) swapped bookies in earlier fragments: start again
                    # from their metadata, which holds our current fragment too
                    self.md = fresh
                    continue
                log.info("ledger %d: ensemble change at entry %d: %s -> %s (%s)", self.ledger_id, first, old, new, reason)
                CLIENT_METRICS.ensemble_changes += 1
                notify("ledgerstore_ensemble_changed", ledger_id=self.ledger_id, first_entry_id=first, old=old, new=new)
                # resend what the replaced bookies held of pending entries; a group's answers
                # from replaced bookies stop counting, those of the bookies that stay still count
                for pa in list(self._pending):
                    if pa.entry_id < first:
                        continue
                    ws = self.md.write_set(pa.entry_id)
                    sent = pa.ensemble
                    g = pa.group
                    if g is not None:
                        replaced = sum(1 << i for i, b in enumerate(g.ensemble) if b != new[i])
                        g.stale |= replaced
                        g.acked &= ~replaced
                    redo = set(ws) if sent is None else {i for i in ws if sent[i] != new[i]}
                    for i in redo:
                        pa.acked &= ~(1 << i)
                        pa.failed &= ~(1 << i)
                    self._send(pa, only=redo)
        except LedgerStoreError as exc:
            self._fail_all(exc)
        finally:
            self._ensemble_task = None
            self._changing = False
        # a bookie of the new ensemble may have failed meanwhile: go round again (not when this
        # task was cancelled or its loop is shutting down: those leave through the finally above)
        if self._error is None and any(b in self._failed_bookies for b in self.md.current_ensemble):
            self._bookie_failed(next(b for b in self.md.current_ensemble if b in self._failed_bookies), reason)
        if self._error is None:
            self._complete()  # what was acknowledged during the change (held back until now)

    def _resend_unsent(self) -> None:
        for pa in self._pending:
            if pa.ensemble is None:
                self._send(pa)

    # --- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for outstanding adds, then close the ledger in metadata at the last acknowledged
        entry (the seeds' writer-close rules)."""
        if self.md.is_closed:
            return
        self._closing = True
        await self._drained.wait()
        if self._ensemble_task is not None:
            await asyncio.shield(self._ensemble_task)
        last = self._lac
        md = self.md
        while True:
            candidate = LedgerMetadata(**{**md.__dict__, "state": LedgerState.CLOSED, "last_entry_id": last,
                                          "length": self._length if self._error is None else md.length})
            try:
                self.md = await self.client.ledgers.write(candidate)
                notify("ledgerstore_ledger_closed", ledger_id=self.ledger_id, last_entry_id=last, recovered=False)
                return
            except BadVersionError:
                md = await self.client.ledgers.read(self.ledger_id)
                if md.state is LedgerState.OPEN:
                    continue
                if md.state is LedgerState.IN_RECOVERY:
                    self.md = md
                    raise LedgerFencedError(
                        f"ledger {self.ledger_id} is being recovered by another client; not closed by this writer"
                    ) from None
                self.md = md
                if md.last_entry_id != last:
                    raise LedgerFencedError(
                        f"ledger {self.ledger_id} was closed by recovery at entry {md.last_entry_id}, "
                        f"but this writer had acknowledged up to {last}") from None
                return


class _MetadataMoved(Exception):
    """The ledger's metadata changed under a recovery in a way it cannot merge: start again."""


async def recover(client: Client, md: LedgerMetadata, password: bytes, *,
                  exclude: Collection[str] = ()) -> LedgerMetadata:
    """Fence the ledger, find its last entry, re-replicate the tail and close it (the seeds'
    "closing a ledger as a reader", BookKeeper's LedgerRecoveryOp). Concurrent recoverers converge
    on one last entry.

    The ensemble recovered is the one the metadata names, failed bookies included (they just do
    not answer). A bookie that fails a write-back is replaced through the placement policy (never
    by one of ``exclude``), in this recovery's memory only: the new fragment is written together
    with the close, by compare-and-set. Metadata changed by someone else meanwhile (other than a
    close by a concurrent recoverer, which stands) makes the recovery start again.
    """
    mgr = client.ledgers
    while True:
        while md.state is LedgerState.OPEN:
            try:
                md = await mgr.write(LedgerMetadata(**{**md.__dict__, "state": LedgerState.IN_RECOVERY}))
            except BadVersionError:
                md = await mgr.read(md.ledger_id)
        if md.is_closed:
            return md
        try:
            return await _LedgerRecovery(client, md, password, frozenset(exclude)).run()
        except _MetadataMoved:
            md = await mgr.read(md.ledger_id)


class _LedgerRecovery:
    """One attempt at recovering an IN_RECOVERY ledger: fence, read forward, write back, close."""

    def __init__(self, client: Client, md: LedgerMetadata, password: bytes, exclude: frozenset[str]) -> None:
        self.client = client
        self.md = md
        self.handle = ReadHandle(client, md, password)
        self.key = self.handle.master_key
        self.need = md.write_quorum - md.ack_quorum + 1
        self.exclude = exclude
        #: the fragments as this recovery will close the ledger with them (changed in memory only)
        self.ensembles: list[tuple[int, list[str]]] = [(f, list(b)) for f, b in md.ensembles]
        self.failed: set[str] = set()

    async def run(self) -> LedgerMetadata:
        md = self.md
        lac = await self._fence()
        # Everything before the last fragment was acknowledged before the ensemble change that
        # started it, so reading starts in the current fragment even when the bookies' LACs lag
        # behind it (BookKeeper #2615): recovery never rewrites an earlier fragment.
        start = max(lac + 1, md.ensembles[-1][0], 0)
        eid = start
        tail_length = 0
        while True:
            entry = await self._read(eid)
            if entry is None:
                break
            await self._write_back(eid, entry[0])
            tail_length += len(entry[1])
            eid += 1
        last = eid - 1
        length = await self._prefix_length(start) + tail_length
        return await self._close(last, length)

    async def _fence(self) -> int:
        """Fence every bookie of the last fragment as the metadata names it; wait for
        Qw−Qa+1 answers in every write quorum. Returns the highest LAC they reported."""
        md, client = self.md, self.client
        ensemble = md.ensembles[-1][1]
        e_size, qw = md.ensemble_size, md.write_quorum
        timeout = client.config.read_timeout_s
        key = self.key
        futs = [client.pool.get(b).request(
            lambda rid: codec.encode_read_lac(rid, md.ledger_id, key, FLAG_FENCE), timeout) for b in ensemble]
        results = await asyncio.gather(*futs, return_exceptions=True)
        ok = [False] * e_size
        lac = -1
        for i, r in enumerate(results):
            if isinstance(r, codec.Response):
                if r.status == Status.OK:
                    ok[i] = True
                    lac = max(lac, r.lac)
                elif r.status == Status.NO_SUCH_LEDGER:
                    ok[i] = True
                elif r.status == Status.UNAUTHORIZED:
                    raise UnauthorizedAccessError(
                        f"bookie {ensemble[i]} refused the password while fencing ledger {md.ledger_id}")
        for start in range(e_size):
            quorum = [(start + j) % e_size for j in range(qw)]
            if sum(ok[i] for i in quorum) < self.need:
                errs = [f"{ensemble[i]}: {results[i]}" for i in quorum if not ok[i]]
                raise LedgerRecoveryError(
                    f"cannot fence ledger {md.ledger_id}: write quorum {[ensemble[i] for i in quorum]} gave fewer "
                    f"than {self.need} answers ({'; '.join(errs)})")
        return lac

    async def _read(self, eid: int) -> tuple[bytes, bytes] | None:
        """Read ``eid`` from its write set (as the writer wrote it) with the fence flag, so every
        bookie that answers is fenced by then (BookKeeper #2614). Returns the signed bytes and
        the payload, or None once ``need`` replicas said they lack it (then it cannot have been
        acknowledged)."""
        md, client = self.md, self.client
        _, ensemble = md.ensemble_for(eid)
        ws = md.write_set(eid)
        timeout = client.config.read_timeout_s
        key = self.key
        owner = {client.pool.get(ensemble[i]).request(
            lambda rid: codec.encode_read(rid, md.ledger_id, eid, key, FLAG_FENCE), timeout): ensemble[i] for i in ws}
        pending: set[asyncio.Future[codec.Response]] = set(owner)
        missing = 0
        errors: list[str] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for f in done:
                    bid = owner[f]
                    exc = f.exception()
                    r = None if exc is not None else f.result()
                    if r is not None and r.status == Status.OK:
                        try:
                            entry = self.handle.digest.verify(r.entry, eid)
                        except DigestMismatchError as dexc:
                            errors.append(f"{bid}: {dexc}")
                            continue
                        return r.entry, entry.payload
                    if r is not None and r.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
                        missing += 1
                    elif r is not None and r.status == Status.UNAUTHORIZED:
                        raise UnauthorizedAccessError(
                            f"bookie {bid} refused the password while recovering ledger {md.ledger_id}")
                    else:
                        errors.append(f"{bid}: {exc if r is None else Status(r.status).name}")
                if missing >= self.need:
                    return None
        finally:
            for f in pending:
                f.cancel()
        raise LedgerRecoveryError(
            f"recovery of ledger {md.ledger_id} cannot tell whether entry {eid} exists: {missing} replicas lack it "
            f"(need {self.need} to be sure), errors: {'; '.join(errors)}")

    async def _write_back(self, eid: int, data: bytes) -> None:
        """Write a found entry to its whole write set with recovery adds (they pass the fence).
        A bookie that fails is replaced (in this recovery's memory) and the entry sent to its
        replacement, so the entry ends on Qw bookies; with no replacement to be had, Qa acks do."""
        md, client = self.md, self.client
        timeout = client.config.add_timeout_s
        key = self.key
        ws = md.write_set(eid)
        acked: set[int] = set()
        while True:
            ensemble = self.ensembles[self._fragment_of(eid)][1]
            targets = [i for i in ws if i not in acked]
            futs = [client.pool.get(ensemble[i]).request(
                lambda rid: codec.encode_add(rid, md.ledger_id, eid, key, data, FLAG_RECOVERY_ADD), timeout)
                for i in targets]
            failed: list[int] = []
            reasons: list[str] = []
            for i, r in zip(targets, await asyncio.gather(*futs, return_exceptions=True), strict=True):
                if isinstance(r, codec.Response) and r.status == Status.OK:
                    acked.add(i)
                    continue
                if isinstance(r, codec.Response) and r.status == Status.UNAUTHORIZED:
                    raise UnauthorizedAccessError(
                        f"bookie {ensemble[i]} refused the master key while recovering ledger {md.ledger_id}")
                failed.append(i)
                reasons.append(f"{ensemble[i]}: {r if not isinstance(r, codec.Response) else Status(r.status).name}")
            if not failed:
                return
            try:
                await self._replace(eid, failed)
            except NotEnoughBookiesError as exc:
                if len(acked) >= md.ack_quorum:
                    log.warning("recovery of ledger %d: entry %d is on %d of %d bookies (%s) and no replacement "
                                "is available (%s)", md.ledger_id, eid, len(acked), len(ws), "; ".join(reasons), exc)
                    return
                raise LedgerRecoveryError(
                    f"recovery of ledger {md.ledger_id}: entry {eid} re-replicated to {len(acked)} bookies, fewer "
                    f"than the ack quorum {md.ack_quorum} ({'; '.join(reasons)}), and no replacement: {exc}") from exc

    def _fragment_of(self, eid: int) -> int:
        """Index in :attr:`ensembles` of the fragment holding ``eid``."""
        return max(k for k, (first, _) in enumerate(self.ensembles) if first <= eid or k == 0)

    async def _replace(self, eid: int, idxs: list[int]) -> None:
        """Replace the bookies at ``idxs`` from entry ``eid`` on: in place when the fragment
        starts at ``eid`` (nothing of it was written before), else as a new fragment."""
        md = self.md
        k = self._fragment_of(eid)
        first, ensemble = self.ensembles[k]
        new = list(ensemble)
        bookies = await self.client.bookie_infos(max_age=0)
        for i in idxs:
            self.failed.add(new[i])
        for i in idxs:
            # chosen one after another against the ensemble as it becomes: never the same twice
            new[i] = self.client.placement.replace_bookie(
                new, md.write_quorum, md.ack_quorum, i, bookies, exclude=frozenset(self.failed | self.exclude))
        log.info("recovery of ledger %d: from entry %d, %s replaced by %s", md.ledger_id, eid,
                 [ensemble[i] for i in idxs], [new[i] for i in idxs])
        if first == eid:
            self.ensembles[k] = (eid, new)
        else:
            self.ensembles.insert(k + 1, (eid, new))

    async def _prefix_length(self, start: int) -> int:
        """Payload bytes of entries ``0..start-1`` (acknowledged before recovery began): read
        them back, which also shows they are readable. On failure the recorded length stays."""
        if start <= 0:
            return 0
        self.handle._lac = start - 1
        total = 0
        try:
            async for entry in self.handle.iter_entries(0, start - 1, batch=_READ_MULTI_ENTRIES):
                total += len(entry.payload)
        except LedgerStoreError as exc:
            log.warning("recovery of ledger %d: cannot read entries 0..%d to learn its length (%s); "
                        "keeping the recorded length %d", self.md.ledger_id, start - 1, exc, self.md.length)
            return self.md.length
        return total

    async def _close(self, last: int, length: int) -> LedgerMetadata:
        """Close at ``last`` by CAS, with this recovery's fragments. A concurrent recoverer's close
        stands; any other change to the metadata means starting again."""
        mgr = self.client.ledgers
        md = self.md
        ensembles = self.ensembles
        while True:
            candidate = LedgerMetadata(**{**md.__dict__, "state": LedgerState.CLOSED, "last_entry_id": last,
                                          "length": length, "ensembles": ensembles})
            try:
                md = await mgr.write(candidate)
            except BadVersionError:
                fresh = await mgr.read(md.ledger_id)
                if fresh.is_closed:
                    return fresh
                if fresh.state is LedgerState.IN_RECOVERY and fresh.ensembles == self.md.ensembles:
                    md = fresh  # rewritten with the same fragments (another recoverer's state CAS): retry
                    continue
                raise _MetadataMoved() from None
            notify("ledgerstore_ledger_closed", ledger_id=md.ledger_id, last_entry_id=last, recovered=True)
            return md
